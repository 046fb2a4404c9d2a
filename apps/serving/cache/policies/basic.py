"""The fixed policies: LRU, LFU, the seed's linear formula, one ``Weighted`` setting (the
default's building block) and GreedyDual-Size-Frequency."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from apps.serving.cache.policies.base import HALF_LIFE_S, Policy, Resident


class LRU(Policy):
    name = "lru"
    half_life_s = HALF_LIFE_S

    def retention_key(self):
        return self.retention

    def retention(self, resident: Resident) -> float:
        return resident.last_used

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float:
        return now - resident.last_used

    def on_evict(self, resident: Resident, now: float) -> None:
        return None


@dataclass
class LFU(Policy):
    half_life_s: float = HALF_LIFE_S
    name: str = "lfu"

    def retention_key(self):
        return self.retention

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
class Linear(Policy):
    """The seed's formula, literally: a weighted sum over *normalised* factors. Selectable, not
    the default: the replay shows it barely beats LRU (it adds idle minutes to hit counts, so
    an adapter used every minute for an hour loses to one used twice just now).

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
class Weighted(Policy):
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
    name: str = "weighted-setting"  # one setting of the default (``Adaptive``, "weighted")
    _terms: dict[tuple[int, int], float] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.recency_half_life_s <= self.half_life_s:
            raise ValueError(
                "recency_half_life_s must be positive and at most half_life_s (the value must "
                "not fall when an adapter is used)"
            )

    def terms(self, resident: Resident) -> float:
        """log2 of the size, reload-cost and priority factors (once per size and priority)."""
        terms = self._terms.get((resident.size_bytes, resident.tenant_priority))
        if terms is None:
            size_mb = max(resident.size_bytes / 1048576, 1e-3)
            terms = (
                math.log2(self.fixed_cost_mb + size_mb)
                - self.size_exponent * math.log2(size_mb)
                + math.log2(1.0 + self.priority_weight * max(resident.tenant_priority, 0))
            )
            self._terms[(resident.size_bytes, resident.tenant_priority)] = terms
        return terms

    def retention_key(self):
        return self.retention

    def retention(self, resident: Resident) -> float:
        """log2 of the value at time 0: higher stays longer; fixed between accesses."""
        hits = resident.hits
        return (
            (math.log2(hits) if hits > 1e-9 else -30.0)
            + resident.last_used / self.recency_half_life_s
            + self.terms(resident)
        )

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float:
        return now / self.recency_half_life_s - self.retention(resident)

    def on_evict(self, resident: Resident, now: float) -> None:
        return None


@dataclass
class GDSF(Policy):
    """GreedyDual-Size-Frequency: value = L + frequency x cost / size, where L is the clock
    *as of the resident's last access*. The clock rises to each victim's value, so a resident
    not touched since keeps an old, low L and ages out; a fresh access re-bases it."""

    clock: float = 0.0
    name: str = "gdsf"
    half_life_s: float = HALF_LIFE_S
    _base: dict[int, tuple[float, float]] = field(default_factory=dict)  # key -> (used, L)

    def value(self, resident: Resident, now: float) -> float:
        seen = self._base.get(resident.version_id)
        if seen is None or seen[0] != resident.last_used:  # new, or accessed since
            seen = (resident.last_used, self.clock)
            self._base[resident.version_id] = seen
        size_mb = max(resident.size_bytes / 1048576, 1e-6)
        cost = max(resident.reload_cost_ms, 1e-3)
        return seen[1] + (resident.decayed_hits(now) + 1.0) * cost / size_mb

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float:
        return -self.value(resident, now) + (1e6 if resident.deprecated else 0.0)

    def on_evict(self, resident: Resident, now: float) -> None:
        self.clock = max(self.clock, self.value(resident, now))
        self._base.pop(resident.version_id, None)
