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

import itertools
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

HALF_LIFE_S = 600.0  # access frequency halves every 10 idle minutes


class Resident(NamedTuple):
    """What a policy knows about one cached adapter version (immutable; a NamedTuple, not a
    frozen dataclass: a replay creates one per access, and this is 3x cheaper to build)."""

    key: tuple
    tenant_id: int
    size_bytes: int
    last_used: float  # seconds, any monotonic clock
    hits: float = 0.0  # decayed access count, as of ``last_used``
    reload_cost_ms: float = 0.0  # measured time to bring it back from the tier below
    tenant_priority: int = 1
    deprecated: bool = False
    pinned: bool = False

    def decayed_hits(self, now: float, half_life_s: float = HALF_LIFE_S) -> float:
        return self.hits * math.pow(0.5, max(0.0, now - self.last_used) / half_life_s)

    def touched(self, now: float, half_life_s: float = HALF_LIFE_S) -> Resident:
        """The resident after one more access at ``now`` (its count decayed to ``now``)."""
        return Resident(
            self.key,
            self.tenant_id,
            self.size_bytes,
            now,
            self.decayed_hits(now, half_life_s) + 1.0,
            self.reload_cost_ms,
            self.tenant_priority,
            self.deprecated,
            self.pinned,
        )


class Policy(Protocol):
    name: str

    half_life_s: float  # how fast the access counts it reads decay

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float: ...

    def on_evict(self, resident: Resident, now: float) -> None: ...


class LRU:
    name = "lru"
    half_life_s = HALF_LIFE_S

    def retention(self, resident: Resident) -> float:
        return resident.last_used

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float:
        return now - resident.last_used

    def on_evict(self, resident: Resident, now: float) -> None:
        return None


@dataclass
class LFU:
    half_life_s: float = HALF_LIFE_S
    name: str = "lfu"

    def retention(self, resident: Resident) -> float:
        # log2 of the decayed count at time 0; the most recent wins a tie
        return (
            math.log2(max(resident.hits, 1e-9))
            + resident.last_used / self.half_life_s
            + resident.last_used * 1e-12
        )

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float:
        # fewest (decayed) hits first; among equals, the longest idle
        return now / self.half_life_s - self.retention(resident)

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
class Linear:
    """The seed's formula, literally: a weighted sum over *normalised* factors (the default
    until the replay of issue 10 showed it barely beats LRU: it adds idle minutes to hit
    counts, so an adapter used every minute for an hour loses to one used twice just now).

    Raw units make the weights meaningless (megabytes and milliseconds swamp minutes and
    hits: a replay of the Azure trace with raw units kept large, costly, idle adapters and
    lost a third of LRU's hit rate). So each factor is divided by its mean over the current
    candidates, set by ``prepare``; ``select_victims`` calls it. Without ``prepare`` the
    factors are in raw units, exactly the seed's formula.
    """

    weights: Weights = field(default_factory=Weights)
    name: str = "linear"
    scales: Scales = field(default_factory=Scales)
    half_life_s: float = HALF_LIFE_S

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
class Weighted:
    """The default: the seed's five factors as one retention value, in log space.

        value = hits x 0.5 ** (idle_s / recency_half_life_s)
                x reload_cost(size) / size ** size_exponent
                x (1 + priority_weight x tenant_priority)

    The lowest value goes first. ``hits`` is the access count as of the last access, each
    access decaying with a half-life of ``half_life_s`` (frequency, estimated over some
    hundreds of requests); the recency factor then ages the whole value while the adapter
    sits idle, faster than the count itself decays (recency weighed against frequency): an
    adapter used often long ago loses to one used as often lately, one used once just now
    loses to one used steadily, and a burst that has ended stops holding its place within a
    few minutes. The count carries down to L3 when a version leaves the engine and back up
    when it returns, so a version evicted once does not start from zero.

    ``reload_cost(size) = fixed_cost_mb + size_mb``: what bringing a version back costs, as
    the node measures it (``bench/load_tiers.py``: a fixed part worth about 12 MB of transfer,
    then linear in size). The model, not one measured load time: two loads of the same
    version differ by +-30 %, and that noise would decide between otherwise equal adapters.
    Divided by ``size ** size_exponent`` it is what keeping a version saves per megabyte
    (GreedyDual-Size's density) — small adapters are cheap to keep, large ones costly to
    reload. Priority keeps a premium tenant's adapters a little longer.

    Every resident ages at the same rate, so the order never changes between accesses:
    ``retention`` is a fixed key, and a cache can keep its residents in a heap instead of
    scoring all of them on every miss (the replay does). Why these numbers: docs/replay.md.
    """

    half_life_s: float = 240.0
    recency_half_life_s: float = 120.0
    size_exponent: float = 1.0
    fixed_cost_mb: float = 12.0
    priority_weight: float = 0.1
    name: str = "weighted"
    _terms: dict[tuple[int, int], float] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.recency_half_life_s <= self.half_life_s:
            raise ValueError(
                "recency_half_life_s must be positive and at most half_life_s (the value must "
                "not fall when an adapter is used)"
            )

    def retention(self, resident: Resident) -> float:
        """log2 of the value at time 0: higher stays longer; fixed between accesses."""
        hits = resident.hits
        terms = self._terms.get((resident.size_bytes, resident.tenant_priority))
        if terms is None:  # size and priority terms, once per (size, priority)
            size_mb = max(resident.size_bytes / 1048576, 1e-3)
            terms = (
                math.log2(self.fixed_cost_mb + size_mb)
                - self.size_exponent * math.log2(size_mb)
                + math.log2(1.0 + self.priority_weight * max(resident.tenant_priority, 0))
            )
            self._terms[(resident.size_bytes, resident.tenant_priority)] = terms
        return (
            (math.log2(hits) if hits > 1e-9 else -30.0)
            + resident.last_used / self.recency_half_life_s
            + terms
        )

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float:
        return now / self.recency_half_life_s - self.retention(resident)

    def on_evict(self, resident: Resident, now: float) -> None:
        return None


@dataclass
class GDSF:
    """GreedyDual-Size-Frequency: value = L + frequency x cost / size, where L is the clock
    *as of the resident's last access*. The clock rises to each victim's value, so a resident
    not touched since keeps an old, low L and ages out; a fresh access re-bases it."""

    clock: float = 0.0
    name: str = "gdsf"
    half_life_s: float = HALF_LIFE_S
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


POLICIES = ("weighted", "lru", "lfu", "gdsf", "linear")


def make_policy(name: str, weights: Weights | None = None) -> Policy:
    if name in ("weighted", "weighted_lru"):
        return Weighted()
    if name == "linear":
        return Linear(weights or Weights())
    if name == "lru":
        return LRU()
    if name == "lfu":
        return LFU()
    if name == "gdsf":
        return GDSF()
    raise ValueError(f"unknown eviction policy {name!r}; use {', '.join(POLICIES)}")


def guaranteed_shares(capacity: int, priorities: Mapping[int, int]) -> dict[int, int]:
    """Slots each tenant keeps however hard others burst: half the capacity is split in
    proportion to (priority + 1) among the tenants that have residents; the other half is
    free for whoever needs it. A tenant's share is at least 1 when capacity allows."""
    if not priorities or capacity <= 0:
        return {}
    total = sum(p + 1 for p in priorities.values())
    return {tenant: _share(capacity, len(priorities), p, total) for tenant, p in priorities.items()}


def _share(capacity: int, tenants: int, priority: int, total_weight: int) -> int:
    reserved = capacity // 2
    return max(
        1 if reserved >= tenants else 0, math.floor(reserved * (priority + 1) / total_weight)
    )


@dataclass
class Census:
    """Residents per tenant and each such tenant's priority, for a cache that keeps them up
    to date itself (the replay) instead of recounting on every eviction."""

    counts: dict[int, int] = field(default_factory=dict)
    priorities: dict[int, int] = field(default_factory=dict)
    weight: int = 0  # sum of (priority + 1) over the tenants with residents
    total: int = 0

    @classmethod
    def of(cls, residents: Iterable[Resident]) -> Census:
        census = cls()
        for r in residents:
            census.add(r)
        return census

    def add(self, r: Resident) -> None:
        count = self.counts.get(r.tenant_id, 0)
        if count == 0:
            self.priorities[r.tenant_id] = r.tenant_priority
            self.weight += r.tenant_priority + 1
        self.counts[r.tenant_id] = count + 1
        self.total += 1

    def remove(self, r: Resident) -> None:
        count = self.counts[r.tenant_id] - 1
        self.total -= 1
        if count:
            self.counts[r.tenant_id] = count
        else:
            del self.counts[r.tenant_id]
            self.weight -= self.priorities.pop(r.tenant_id) + 1

    def share(self, tenant: int, capacity: int) -> int:
        """The tenant's guaranteed share (``guaranteed_shares``) among the current residents."""
        if tenant not in self.priorities or capacity <= 0:
            return 0
        return _share(capacity, len(self.priorities), self.priorities[tenant], self.weight)


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
    residents: Collection[Resident],
    *,
    policy: Policy,
    now: float,
    slots_needed: int = 1,
    capacity: int,
    requester: int | None = None,
    quotas: Mapping[int, int] | None = None,
    pressure: float = 0.0,
    ordered: Iterable[Resident] | None = None,
    census: Census | None = None,
) -> list[Resident]:
    """The residents to evict so that ``slots_needed`` more fit, lowest value first.

    Rules, in order: pinned residents never go. If the requesting tenant is at its quota
    (``quotas[tenant]`` residents), it displaces its own lowest-value residents and nobody
    else's. Otherwise victims come from anyone, except that no other tenant is pushed below
    its guaranteed share (``guaranteed_shares``). Returns fewer than needed when the rules
    allow no more; the caller then waits, degrades or refuses.

    ``ordered``: the unpinned residents already in eviction order, for a cache that keeps
    them sorted by the policy's ``retention`` (the replay does); read only as far as needed.
    ``census``: the residents' per-tenant counts, kept by such a cache (else counted here).
    """
    census = census or Census.of(residents)
    free = capacity - census.total
    needed = max(0, slots_needed - max(free, 0))
    counts = census.counts  # read only; victims taken so far are counted in ``taken``
    taken: dict[int, int] = {}
    quota = (quotas or {}).get(requester) if requester is not None else None
    # A tenant at its quota makes room from its own residents, even when the cache has room.
    over_quota = (
        requester is not None
        and quota is not None
        and counts.get(requester, 0) + slots_needed > quota
    )
    if needed == 0 and not over_quota:
        return []
    if ordered is None:
        ordered = rank(
            [r for r in residents if not r.pinned], policy=policy, now=now, pressure=pressure
        )
    if over_quota:
        assert requester is not None and quota is not None
        over = counts.get(requester, 0) - quota + slots_needed
        own = (r for r in ordered if r.tenant_id == requester)
        return list(itertools.islice(own, max(needed, over)))
    victims: list[Resident] = []
    for r in ordered:
        if len(victims) == needed:
            break
        tenant = r.tenant_id
        left = counts[tenant] - taken.get(tenant, 0)
        if tenant != requester and left <= census.share(tenant, capacity):
            continue
        victims.append(r)
        taken[tenant] = taken.get(tenant, 0) + 1
    return victims
