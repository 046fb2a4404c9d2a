"""The offline optimum a policy is measured against: it knows every future request.

* ``belady_hits`` — Belady's MIN for one cache of ``slots`` equal-size versions: on a miss
  with the cache full, evict the version whose next request is furthest away (never again
  first). No online policy can have more hits on the same sequence; it is *the* bound for the
  equal-size runs (a hypothesis test checks every policy against it).
* ``Oracle`` — for mixed sizes and costs no polynomial optimum is known (the problem is
  NP-hard), so the mixed-size runs use a documented heuristic instead of a bound: the same
  tier model with a policy that knows the future and evicts the largest
  ``time to next request x size / reload cost`` (never-again first) — Belady's rule weighed
  by what a byte of the version costs to bring back. Its figures are a reference, not a
  ceiling: a policy may beat it.
* ``known_popularity_hits`` — not an offline figure but the *online* ceiling on a generated
  trace: the policy that knows each adapter's request probability at every moment (the
  trace's ``popularity``) and, on a miss with the cache full, evicts the resident least likely
  to be asked for next. On independent requests that is the optimal demand-paging policy
  (Aho, Denning & Ullman, "Principles of optimal page replacement", J. ACM 18(1), 1971: policy
  A0), so no policy that must learn the popularity from the requests can expect more hits. A
  gap between it and Belady is what foresight buys, which no online policy has.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from apps.serving.cache.policy import Resident
from apps.serving.replay.traces import Trace

NEVER = math.inf


def next_uses(trace: Trace) -> list[float]:
    """For each request, the arrival time of the next request for the same version."""
    after: dict[int, float] = {}
    out = [NEVER] * len(trace.keys)
    for i in range(len(trace.keys) - 1, -1, -1):
        key = trace.keys[i]
        out[i] = after.get(key, NEVER)
        after[key] = trace.at[i]
    return out


def belady_hits(trace: Trace, slots: int) -> int:
    """Hits of Belady's MIN with ``slots`` equal-size places (one level, no quotas)."""
    nxt = [0] * len(trace.keys)
    after: dict[int, int] = {}
    for i in range(len(trace.keys) - 1, -1, -1):
        nxt[i] = after.get(trace.keys[i], len(trace.keys) + i)  # never again: beyond the end
        after[trace.keys[i]] = i
    cache: dict[int, int] = {}  # key -> index of its next request
    heap: list[tuple[int, int]] = []  # (-next index, key), stale entries skipped
    hits = 0
    for i, key in enumerate(trace.keys):
        if key in cache:
            hits += 1
        elif len(cache) >= slots:
            while True:
                far, victim = heapq.heappop(heap)
                if cache.get(victim) == -far:
                    del cache[victim]
                    break
        cache[key] = nxt[i]
        heapq.heappush(heap, (-nxt[i], key))
    return hits


def known_popularity_hits(trace: Trace, slots: int) -> int | None:
    """Hits of A0 with ``slots`` equal-size places: evict the resident with the lowest request
    probability of the moment (ties: the lower key). ``None`` when the trace has no
    popularity (a node's log, a bursty trace)."""
    if trace.popularity is None:
        return None
    starts = [e.start for e in trace.popularity[1:]] + [len(trace.keys)]
    cache: set[int] = set()
    hits = 0
    for epoch, stop in zip(trace.popularity, starts, strict=True):
        # (probability, key), one entry per resident: the order changes only between epochs
        heap = [(epoch.of(key), key) for key in cache]
        heapq.heapify(heap)
        for i in range(epoch.start, stop):
            key = trace.keys[i]
            if key in cache:
                hits += 1
                continue
            if len(cache) >= slots:
                cache.remove(heapq.heappop(heap)[1])
            cache.add(key)
            heapq.heappush(heap, (epoch.of(key), key))
    return hits


@dataclass
class Oracle:
    """The mixed-size reference: evict the largest time-to-next-use x size / reload cost."""

    trace: Trace
    name: str = "offline"
    half_life_s: float = 600.0
    _next: dict[tuple[int, float], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for at, key, nxt in zip(self.trace.at, self.trace.keys, next_uses(self.trace), strict=True):
            self._next[(key, at)] = nxt

    def next_use(self, resident: Resident) -> float:
        return self._next.get((resident.version_id, resident.last_used), NEVER)

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float:
        wait = self.next_use(resident) - now
        if wait == NEVER:
            return NEVER
        cost = max(resident.reload_cost_ms, 1e-3)
        return max(wait, 1e-6) * resident.size_bytes / cost

    def on_evict(self, resident: Resident, now: float) -> None:
        return None
