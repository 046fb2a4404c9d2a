"""Eviction policies: pure objects that score cache residents. They never touch the engine.

A higher score means "evict sooner". The cache manager asks a policy for victims and applies
the decision itself, so the same policy runs on a live node, in unit tests and in the trace
replayer. Shipped, selectable by name:

* ``lru``      — idle time only.
* ``lfu``      — decayed access frequency only (idle time breaks ties).
* ``weighted`` — the seed's formula (default; ``weighted_lru`` is an alias)::

      score = idle_minutes * 0.35 + memory_mb * 0.25 - recent_hits * 0.20
              - tenant_priority * 0.15 - reload_cost_ms * 0.05

  plus a bonus for deprecated or rolled-back versions, and idle time weighed up under queue
  pressure (a full load queue makes holding idle adapters costlier). Weights are configurable.
* ``gdsf``     — GreedyDual-Size-Frequency: keep the largest ``clock + hits * cost / size``;
  the clock rises to each victim's value, so long-idle residents age out.

``select_victims`` adds tenant quotas and guaranteed shares on top of any policy.

The package: ``base`` (``Resident``, the ``Policy`` protocol), ``basic`` (the fixed
policies), ``adaptive`` (the default), ``shares`` (guaranteed shares), ``victims``
(``rank``, ``select_victims``).
"""

from __future__ import annotations

from apps.serving.cache.policies.adaptive import SETTINGS, Adaptive
from apps.serving.cache.policies.base import HALF_LIFE_S, Policy, Resident
from apps.serving.cache.policies.basic import GDSF, LFU, LRU, Linear, Scales, Weighted, Weights
from apps.serving.cache.policies.shares import Census, guaranteed_shares
from apps.serving.cache.policies.victims import rank, select_victims

__all__ = [
    "GDSF",
    "HALF_LIFE_S",
    "LFU",
    "LRU",
    "POLICIES",
    "SETTINGS",
    "Adaptive",
    "Census",
    "Linear",
    "Policy",
    "Resident",
    "Scales",
    "Weighted",
    "Weights",
    "guaranteed_shares",
    "make_policy",
    "rank",
    "select_victims",
]

POLICIES = ("weighted", "lru", "lfu", "gdsf", "linear")  # "weighted" is ``Adaptive``


def make_policy(name: str, weights: Weights | None = None) -> Policy:
    if name in ("weighted", "weighted_lru"):
        return Adaptive()
    if name == "linear":
        return Linear(weights or Weights())
    if name == "lru":
        return LRU()
    if name == "lfu":
        return LFU()
    if name == "gdsf":
        return GDSF()
    raise ValueError(f"unknown eviction policy {name!r}; use {', '.join(POLICIES)}")
