"""Trace replay: what hit rates, reload time, TTFT and fairness a cache configuration would
give on recorded or synthetic traffic, before it goes live (``manage.py replay``).

``traces`` builds request sequences (the node's own log, a CSV trace with a seeded mapping,
synthetic generators), ``simulate`` replays one through the node's tier model and the node's
own policy objects, ``offline`` gives the offline optimum to compare with, ``report`` turns
runs into tables and JSON. Nothing here imports Django except the log reader.
"""
