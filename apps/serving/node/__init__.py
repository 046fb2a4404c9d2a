"""The serving node's runtime: one process that answers the OpenAI-compatible API with a real
vLLM engine behind the four-tier adapter cache (``apps/serving/cache/``).

The parts, each given only what it needs by ``assembly.py`` (which builds them and nothing
else imports):

- ``requests.py``: the request path, the seed's five steps for each request;
- ``admission.py``: generation slots, the waiting queue and each tenant's request rate;
- ``trust.py``: signature checks of versions, and quarantine records with their audit events;
- ``internal_api.py``: warm, evict, inspect (``/internal/*``, not for tenants);
- ``changes.py``: following the registry's changes (alias moves, keys, settings, quarantines);
- ``lookups.py``: the node's cached lookups of API keys and aliases (the database is the truth);
- ``engine.py`` and ``vllm_front.py``: vLLM, the only modules that import it (with
  ``lora_fix.py``, the vLLM plugin loaded in vLLM's own processes);
- ``generation.py``, ``openai_protocol.py``: what crosses from the engine to the request path,
  and what the node accepts of OpenAI's request bodies;
- ``offload.py``: blocking calls (database, disk) run off the event loop;
- ``metrics.py``: the node's Prometheus metrics.
"""
