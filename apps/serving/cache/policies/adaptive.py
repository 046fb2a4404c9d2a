"""The default policy (``weighted``): three ``Weighted`` settings, the active one chosen by
which would have cost the fewest misses on this node's own traffic."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from apps.serving.cache.policies.base import Policy, Resident, TenantCounts
from apps.serving.cache.policies.basic import Weighted
from apps.serving.cache.policies.victims import rank


class _Expert(Policy):
    """One of ``Adaptive``'s settings, as a policy of its own (scores from the shared counts)."""

    def __init__(self, owner: Adaptive, index: int) -> None:
        self.owner, self.index = owner, index
        self.setting = owner.experts[index]
        self.name = f"{owner.name}[{index}]"
        self.half_life_s = self.setting.half_life_s
        self._per_s = 1.0 / self.setting.recency_half_life_s

    def retention_key(self):
        return self.retention

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
class Adaptive(Policy):
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

    def retention_key(self):
        return self.retention

    def settings(self) -> tuple[_Expert, ...]:
        return self._views

    def retention(self, resident: Resident) -> float:
        return self._views[self.active].retention(resident)

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float:
        return now / self.experts[self.active].recency_half_life_s - self.retention(resident)

    def on_evict(self, resident: Resident, now: float) -> None:
        return None

    def learn_from_eviction(
        self,
        chosen: Resident,
        residents: Collection[Resident],
        *,
        now: float,
        capacity: int,
        requester: int | None,
        census: TenantCounts,
        orders: Callable[[int], Iterable[Resident]] | None,
    ) -> None:
        """On one engine eviction in ``judge_every``: the first victim each setting would
        have chosen, under the same rules (pins, guaranteed shares) as the one it did."""
        if not self.judging():
            return
        counts, share = census.counts, census.share
        firsts: list[int | None] = []
        for e in range(len(self.experts)):
            if e == self.active:
                firsts.append(chosen.version_id)
                continue
            if orders is not None:
                order = orders(e)
            else:
                order = rank([r for r in residents if not r.pinned], policy=self.expert(e), now=now)
            first = None
            for r in order:
                tenant = r.tenant_id
                if tenant == requester or counts[tenant] > share(tenant, capacity):
                    first = r.version_id
                    break
            firsts.append(first)
        self.decided(firsts)
