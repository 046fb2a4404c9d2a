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
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

HALF_LIFE_S = 600.0  # access frequency halves every 10 idle minutes


class Resident(NamedTuple):
    """What a policy knows about one cached adapter version (immutable; a NamedTuple, not a
    frozen dataclass: a replay creates one per access, and this is 3x cheaper to build)."""

    # the cache key: on a node, the version id, which stands for the whole key (tenant,
    # adapter, version, base-model revision), since the registry gives each one id; in a
    # replay, the adapter's index
    version_id: int
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
        idle = now - self.last_used  # (decayed_hits, inlined: a replay calls this per request)
        hits = self.hits * 2.0 ** (-idle / half_life_s) if idle > 0 else self.hits
        return Resident(
            self.version_id,
            self.tenant_id,
            self.size_bytes,
            now,
            hits + 1.0,
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


class _Expert:
    """One of ``Adaptive``'s settings, as a policy of its own (scores from the shared counts)."""

    def __init__(self, owner: Adaptive, index: int) -> None:
        self.owner, self.index = owner, index
        self.setting = owner.experts[index]
        self.name = f"{owner.name}[{index}]"
        self.half_life_s = self.setting.half_life_s
        self._per_s = 1.0 / self.setting.recency_half_life_s

    def retention(self, resident: Resident) -> float:
        seen = self.owner._uses.get(resident.version_id)
        if seen is None:  # never observed (a cache filled before this policy took over)
            hits, last = max(resident.hits, 1e-9), resident.last_used
        else:
            last, hits = seen[0], seen[1][self.index]
        return math.log2(hits) + last * self._per_s + self.setting.terms(resident)

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float:
        return now * self._per_s - self.retention(resident)

    def on_evict(self, resident: Resident, now: float) -> None:
        return None


# The default's three settings (count half-life, recency half-life, seconds): drifting traffic
# (a hot set that moves within minutes), stationary traffic (long memory estimates a steady
# rate best), bursts (an adapter busy for a minute gives its place back within a minute).
# Why these: docs/replay.md.
SETTINGS = {"drift": (240.0, 120.0), "steady": (7200.0, 3600.0), "bursts": (1200.0, 30.0)}


@dataclass
class Adaptive:
    """The default (``weighted``): the seed's factors as ``Weighted`` values, with the balance
    of frequency against recency learned from the node's own traffic instead of fixed.

    It keeps three ``Weighted`` settings (``SETTINGS``: drifting, steady and bursty traffic)
    and evicts by one of them, the *active* one. On one engine eviction in ``judge_every``
    it asks which victim each setting would have chosen; where they disagree the decision
    stays open, and the first of those victims to be requested again settles it: the
    settings that chose it would have cost a miss, and each gets a penalty. Penalties fade
    by ``memory`` per disagreement (0.996: about the last 250 count), and the setting with
    the fewest is active; a tie keeps the current one. So on steady traffic the long-memory
    setting leads, when the hot set moves the fast-counting one takes over, and when bursts
    end the fast-forgetting one does: on every trace of ``bench/replay_suite.py`` it is
    within noise of its best setting alone, where each fixed setting loses 1-10 points of
    hit rate somewhere (docs/replay.md).

    Every setting decays its own count of each version's uses, so the policy keeps one small
    record per version it has seen (``observe``, called on every request, engine hit or
    not); the counts are the policy's, not ``Resident.hits``, and follow a version through
    every tier. Only engine (L2) evictions are judged; the disk tier uses the active setting.
    Deterministic: the same requests give the same decisions on a node and in a replay.
    """

    experts: tuple[Weighted, ...] = field(
        default_factory=lambda: tuple(
            Weighted(half_life_s=c, recency_half_life_s=r) for c, r in SETTINGS.values()
        )
    )
    labels: tuple[str, ...] = tuple(SETTINGS)
    memory: float = 0.996
    judge_every: int = 4  # engine evictions per judged one (asking every setting costs)
    name: str = "weighted"
    max_open: int = 4096  # undecided disagreements kept (the oldest is dropped past this)
    active: int = 0
    switches: int = 0
    penalties: list[float] = field(default_factory=list)
    _uses: dict[int, tuple[float, list[float]]] = field(default_factory=dict, repr=False)
    _open: dict[int, dict[int, list[int]]] = field(default_factory=dict, repr=False)
    _waiting: dict[int, set[int]] = field(default_factory=dict, repr=False)
    _decisions: int = 0
    _evictions: int = 0
    half_life_s: float = field(init=False, default=0.0)  # of ``Resident.hits`` (shown only)

    def __post_init__(self) -> None:
        if not self.experts:
            raise ValueError("Adaptive needs at least one setting")
        if not 0 < self.memory <= 1:
            raise ValueError("memory must be in (0, 1]")
        if self.judge_every < 1:
            raise ValueError("judge_every must be at least 1")
        self.penalties = [0.0] * len(self.experts)
        self._views = tuple(_Expert(self, e) for e in range(len(self.experts)))
        self.half_life_s = self.experts[0].half_life_s
        self._decay_per_s = [-1.0 / x.half_life_s for x in self.experts]
        self._weight = 1.0  # what a penalty adds now: 1 / memory ** decisions (rescaled)

    def expert(self, index: int) -> _Expert:
        return self._views[index]

    def describe(self) -> dict:
        """What the node reports: the active setting, and each one's recent misjudgements
        (penalties faded to now: roughly how many of the last disagreements it lost)."""
        return {
            "active": self.label(self.active),
            "switches": self.switches,
            "judged": self._decisions,
            "settings": [
                {
                    "label": self.label(e),
                    "half_life_s": x.half_life_s,
                    "recency_half_life_s": x.recency_half_life_s,
                    "penalty": round(self.penalties[e] / self._weight, 2),
                }
                for e, x in enumerate(self.experts)
            ],
        }

    def label(self, index: int) -> str:
        return self.labels[index] if index < len(self.labels) else f"setting {index}"

    def observe(self, key: int, now: float) -> None:
        """One request for version ``key`` at ``now``: count it, settle open decisions."""
        seen = self._uses.get(key)
        if seen is None:
            counts = [1.0] * len(self._decay_per_s)
        elif len(seen[1]) == 3:  # the shipped three settings, unrolled (3x faster; per request)
            idle = now - seen[0] if now > seen[0] else 0.0
            (a, b, c), (ka, kb, kc) = seen[1], self._decay_per_s
            counts = [
                a * 2.0 ** (idle * ka) + 1.0,
                b * 2.0 ** (idle * kb) + 1.0,
                c * 2.0 ** (idle * kc) + 1.0,
            ]
        else:
            idle = now - seen[0] if now > seen[0] else 0.0
            counts = [
                h * 2.0 ** (idle * k) + 1.0 for h, k in zip(seen[1], self._decay_per_s, strict=True)
            ]
        self._uses[key] = (now, counts)
        decisions = self._waiting.pop(key, None)
        if decisions:
            self._settle(key, decisions)

    def _settle(self, key: int, decisions: set[int]) -> None:
        for d in decisions:
            groups = self._open.pop(d)
            for e in groups[key]:  # they evicted what came back first
                self.penalties[e] += self._weight
            for other in groups:
                if other != key:
                    self._forget(other, d)
        best = min(range(len(self.experts)), key=lambda e: (self.penalties[e], e != self.active))
        if best != self.active:
            self.active = best
            self.switches += 1

    def _forget(self, key: int, decision: int) -> None:
        waiting = self._waiting.get(key)
        if waiting is not None:
            waiting.discard(decision)
            if not waiting:
                del self._waiting[key]

    def judging(self) -> bool:
        """Whether to judge this engine eviction (one in ``judge_every``, counted)."""
        self._evictions += 1
        return len(self.experts) > 1 and self._evictions % self.judge_every == 0

    def decided(self, firsts: list[int | None]) -> None:
        """The first victim each setting would have chosen for one engine eviction."""
        groups: dict[int, list[int]] = {}
        for e, key in enumerate(firsts):
            if key is not None:
                groups.setdefault(key, []).append(e)
        if len(groups) < 2:
            return  # they agree: nothing to learn
        # Penalties fade by ``memory`` per disagreement: instead of scaling them all down,
        # later ones weigh more (the order, all that counts, is the same).
        self._weight /= self.memory
        if self._weight > 1e100:
            self.penalties = [p / self._weight for p in self.penalties]
            self._weight = 1.0
        self._decisions += 1
        self._open[self._decisions] = groups
        for key in groups:
            self._waiting.setdefault(key, set()).add(self._decisions)
        if len(self._open) > self.max_open:
            oldest = next(iter(self._open))
            for key in self._open.pop(oldest):
                self._forget(key, oldest)

    def retention(self, resident: Resident) -> float:
        return self._views[self.active].retention(resident)

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float:
        return now / self.experts[self.active].recency_half_life_s - self.retention(resident)

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
    orders: Callable[[int], Iterable[Resident]] | None = None,
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
    ``orders``: for an ``Adaptive`` policy, setting ``e``'s order of the same residents (the
    replay's heaps); without it each setting ranks them. The policy learns from the first
    victim each setting would have chosen.
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
    if victims and isinstance(policy, Adaptive) and policy.judging():
        _ask_every_setting(policy, victims[0], residents, now, capacity, requester, census, orders)
    return victims


def _ask_every_setting(
    policy: Adaptive,
    chosen: Resident,
    residents: Collection[Resident],
    now: float,
    capacity: int,
    requester: int | None,
    census: Census,
    orders: Callable[[int], Iterable[Resident]] | None,
) -> None:
    """Tell ``policy`` the first victim each of its settings would have chosen, under the
    same rules (pins, guaranteed shares) as the one it did choose."""

    counts, share = census.counts, census.share
    firsts: list[int | None] = []
    for e in range(len(policy.experts)):
        if e == policy.active:
            firsts.append(chosen.version_id)
            continue
        if orders is not None:
            order = orders(e)
        else:
            order = rank([r for r in residents if not r.pinned], policy=policy.expert(e), now=now)
        first = None
        for r in order:
            tenant = r.tenant_id
            if tenant == requester or counts[tenant] > share(tenant, capacity):
                first = r.version_id
                break
        firsts.append(first)
    policy.decided(firsts)
