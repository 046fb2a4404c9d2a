"""The test suite's process harness: starting and stopping the real parts (a Celery worker,
a serving node, an engine), waiting for them, and free ports. Fixtures live in the
``conftest.py`` files; what they start lives here."""
