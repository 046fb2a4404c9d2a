"""A tenant's share of the engine, as nodes weigh it (``apps/serving/fairness.py``) and
pages show it. No Django here: the node's scheduler and the replay import it.

A tenant's weight is its tier's (``Tenant.priority``: batch ¼, standard 1, premium 2) times
the operator's engine weight (``Quota.engine_weight``, in percent: 100 is the tier's share).
"""

from __future__ import annotations

TIER_WEIGHTS = {0: 0.25, 1: 1.0, 2: 2.0}  # batch, standard, premium
# Nodes divide by the weight, and a share 10,000 times another's is no share for the other.
ENGINE_WEIGHT_RANGE = (1, 10_000)


def weight_of(priority: int, engine_weight: int = 100) -> float:
    """The tenant's weight in the engine's fair share."""
    return TIER_WEIGHTS.get(priority, 1.0) * engine_weight / 100
