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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

HALF_LIFE_S = 600.0  # access frequency halves every 10 idle minutes


@dataclass(frozen=True)
class Resident:
    """What a policy knows about one cached adapter version."""

    key: tuple
    tenant_id: int
    size_bytes: int
    last_used: float  # seconds, any monotonic clock
    hits: float = 0.0  # decayed access count, as of ``last_used``
    reload_cost_ms: float = 0.0  # measured time to bring it back from the tier below
    tenant_priority: int = 1
    deprecated: bool = False
    pinned: bool = False

    def decayed_hits(self, now: float) -> float:
        return self.hits * math.pow(0.5, max(0.0, now - self.last_used) / HALF_LIFE_S)

    def touched(self, now: float) -> Resident:
        """The resident after one more access at ``now``."""
        return replace(self, hits=self.decayed_hits(now) + 1.0, last_used=now)


class Policy(Protocol):
    name: str

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float: ...

    def on_evict(self, resident: Resident, now: float) -> None: ...


class LRU:
    name = "lru"

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float:
        return now - resident.last_used

    def on_evict(self, resident: Resident, now: float) -> None:
        return None


class LFU:
    name = "lfu"

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float:
        # fewest (decayed) hits first; among equals, the longest idle
        return -resident.decayed_hits(now) + (now - resident.last_used) * 1e-9

    def on_evict(self, resident: Resident, now: float) -> None:
        return None


@dataclass(frozen=True)
class Weights:
    idle: float = 0.35
    memory: float = 0.25
    hits: float = 0.20
    priority: float = 0.15
    reload: float = 0.05
    deprecated_bonus: float = 1000.0
    pressure_idle_boost: float = 1.0  # idle weight x (1 + boost * pressure), pressure in [0, 1]


@dataclass(frozen=True)
class Scales:
    """Typical magnitudes of each factor among the candidates (1.0 = raw units)."""

    idle_minutes: float = 1.0
    memory_mb: float = 1.0
    hits: float = 1.0
    reload_ms: float = 1.0


@dataclass
class Weighted:
    """The seed's formula over *normalised* factors.

    Raw units make the weights meaningless (megabytes and milliseconds swamp minutes and
    hits: a replay of the Azure trace with raw units kept large, costly, idle adapters and
    lost a third of LRU's hit rate). So each factor is divided by its mean over the current
    candidates, set by ``prepare``; ``select_victims`` calls it. Without ``prepare`` the
    factors are in raw units, exactly the seed's formula.
    """

    weights: Weights = field(default_factory=Weights)
    name: str = "weighted"
    scales: Scales = field(default_factory=Scales)

    def prepare(self, residents: list[Resident], now: float) -> None:
        if not residents:
            return
        n = len(residents)

        def mean(values) -> float:
            return max(sum(values) / n, 1e-9)

        self.scales = Scales(
            idle_minutes=mean((now - r.last_used) / 60.0 for r in residents),
            memory_mb=mean(r.size_bytes / 1048576 for r in residents),
            hits=mean(r.decayed_hits(now) for r in residents),
            reload_ms=mean(r.reload_cost_ms for r in residents),
        )

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float:
        w, s = self.weights, self.scales
        idle_minutes = (now - resident.last_used) / 60.0
        boost = 1.0 + w.pressure_idle_boost * min(max(pressure, 0.0), 1.0)
        score = (
            idle_minutes / s.idle_minutes * w.idle * boost
            + resident.size_bytes / 1048576 / s.memory_mb * w.memory
            - resident.decayed_hits(now) / s.hits * w.hits
            - resident.tenant_priority * w.priority
            - resident.reload_cost_ms / s.reload_ms * w.reload
        )
        return score + (w.deprecated_bonus if resident.deprecated else 0.0)

    def on_evict(self, resident: Resident, now: float) -> None:
        return None


@dataclass
class GDSF:
    """GreedyDual-Size-Frequency: value = L + frequency x cost / size, where L is the clock
    *as of the resident's last access*. The clock rises to each victim's value, so a resident
    not touched since keeps an old, low L and ages out; a fresh access re-bases it."""

    clock: float = 0.0
    name: str = "gdsf"
    _base: dict[tuple, tuple[float, float]] = field(default_factory=dict)  # key -> (used, L)

    def value(self, resident: Resident, now: float) -> float:
        seen = self._base.get(resident.key)
        if seen is None or seen[0] != resident.last_used:  # new, or accessed since
            seen = (resident.last_used, self.clock)
            self._base[resident.key] = seen
        size_mb = max(resident.size_bytes / 1048576, 1e-6)
        cost = max(resident.reload_cost_ms, 1e-3)
        return seen[1] + (resident.decayed_hits(now) + 1.0) * cost / size_mb

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float:
        return -self.value(resident, now) + (1e6 if resident.deprecated else 0.0)

    def on_evict(self, resident: Resident, now: float) -> None:
        self.clock = max(self.clock, self.value(resident, now))
        self._base.pop(resident.key, None)


def make_policy(name: str, weights: Weights | None = None) -> Policy:
    if name in ("weighted", "weighted_lru"):
        return Weighted(weights or Weights())
    if name == "lru":
        return LRU()
    if name == "lfu":
        return LFU()
    if name == "gdsf":
        return GDSF()
    raise ValueError(f"unknown eviction policy {name!r}; use lru, lfu, weighted or gdsf")


def guaranteed_shares(capacity: int, priorities: Mapping[int, int]) -> dict[int, int]:
    """Slots each tenant keeps however hard others burst: half the capacity is split in
    proportion to (priority + 1) among the tenants that have residents; the other half is
    free for whoever needs it. A tenant's share is at least 1 when capacity allows."""
    if not priorities or capacity <= 0:
        return {}
    reserved = capacity // 2
    total = sum(p + 1 for p in priorities.values())
    return {
        tenant: max(1 if reserved >= len(priorities) else 0, math.floor(reserved * (p + 1) / total))
        for tenant, p in priorities.items()
    }


def rank(
    residents: Iterable[Resident], *, policy: Policy, now: float, pressure: float = 0.0
) -> list[Resident]:
    """Residents in eviction order under ``policy``: the first should go first.

    Deprecated versions (replaced or rolled back by their alias) go before any other, under
    every policy; the policy orders each group."""
    pool = list(residents)
    prepare = getattr(policy, "prepare", None)
    if prepare is not None:
        prepare(pool, now)
    return sorted(pool, key=lambda r: (r.deprecated, policy.score(r, now, pressure)), reverse=True)


def select_victims(
    residents: Iterable[Resident],
    *,
    policy: Policy,
    now: float,
    slots_needed: int = 1,
    capacity: int,
    requester: int | None = None,
    quotas: Mapping[int, int] | None = None,
    pressure: float = 0.0,
) -> list[Resident]:
    """The residents to evict so that ``slots_needed`` more fit, lowest value first.

    Rules, in order: pinned residents never go. If the requesting tenant is at its quota
    (``quotas[tenant]`` residents), it displaces its own lowest-value residents and nobody
    else's. Otherwise victims come from anyone, except that no other tenant is pushed below
    its guaranteed share (``guaranteed_shares``). Returns fewer than needed when the rules
    allow no more; the caller then waits, degrades or refuses.
    """
    everyone = list(residents)
    pool = [r for r in everyone if not r.pinned]
    free = capacity - len(everyone)
    needed = max(0, slots_needed - max(free, 0))
    counts: dict[int, int] = {}
    for r in everyone:
        counts[r.tenant_id] = counts.get(r.tenant_id, 0) + 1
    quota = (quotas or {}).get(requester) if requester is not None else None
    # A tenant at its quota makes room from its own residents, even when the cache has room.
    over_quota = (
        requester is not None
        and quota is not None
        and counts.get(requester, 0) + slots_needed > quota
    )
    if needed == 0 and not over_quota:
        return []
    ranked = rank(pool, policy=policy, now=now, pressure=pressure)
    if over_quota:
        assert requester is not None and quota is not None
        own = [r for r in ranked if r.tenant_id == requester]
        over = counts.get(requester, 0) - quota + slots_needed
        return own[: max(needed, over)]
    priorities = {r.tenant_id: r.tenant_priority for r in everyone}
    shares = guaranteed_shares(capacity, priorities)
    victims: list[Resident] = []
    for r in ranked:
        if len(victims) == needed:
            break
        if r.tenant_id != requester and counts[r.tenant_id] <= shares.get(r.tenant_id, 0):
            continue
        victims.append(r)
        counts[r.tenant_id] -= 1
    return victims
