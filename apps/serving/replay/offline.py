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
* ``model_learner_hits`` — what *learning* the popularity costs, at best: an online policy
  told everything about how a generated trace was made except which adapter holds which
  probability (the set of probability values, the instants the ranking reshuffles and the
  share it reshuffles). It keeps each adapter's posterior over those values, filtered exactly
  from the requests it has seen (Bayes' rule; each request independent, as drawn), and evicts
  the resident with the lowest posterior mean. No shipped policy knows as much, so where it
  stays under a target, learning from the traffic cannot meet that target; a reference, not a
  theorem (it decides one eviction at a time, as A0 does).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from apps.serving.cache.policies import Policy, Resident
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


MAX_LEARNER_ADAPTERS = 4000  # its posteriors are adapters x values float32s (64 MB here)


class _Posteriors:
    """Each adapter's log posterior over the probability values (up to a constant), brought
    up to date lazily: a row catches up on the requests it has not seen only when read."""

    def __init__(self, values: np.ndarray) -> None:
        # float32: 4x faster than float64 here; the suite's hit rates agree to the third decimal
        self.values = values.astype(np.float32)
        self.log_asked = np.log(np.maximum(self.values, 1e-30))
        self.log_not_asked = np.log1p(-np.minimum(self.values, 1 - 1e-6))
        self.log_post = np.zeros((len(values), len(values)), np.float32)
        self.seen_to = np.zeros(len(values), dtype=np.int64)  # requests before this are in

    def catch_up(self, rows: np.ndarray, i: int) -> None:
        """Apply "not asked for" for every request before ``i`` each row has not seen."""
        self.log_post[rows] += (i - self.seen_to[rows])[:, None] * self.log_not_asked
        self.seen_to[rows] = i

    def asked(self, key: int, i: int) -> None:
        """Request ``i`` names ``key``."""
        row = self.log_post[key]
        row += (i - self.seen_to[key]) * self.log_not_asked + self.log_asked
        self.seen_to[key] = i + 1

    def reshuffle(self, i: int, moved: float) -> None:
        """Before request ``i``, each adapter's value moved with probability ``moved``."""
        everyone = np.arange(len(self.values))
        self.catch_up(everyone, i)
        post = self._normalised(self.log_post)
        self.log_post[:] = np.log(np.maximum((1 - moved) * post + moved / len(everyone), 1e-30))

    def means(self, keys: list[int], i: int) -> np.ndarray:
        """The posterior mean probability of each of ``keys`` before request ``i``."""
        rows = np.array(keys)
        self.catch_up(rows, i)
        post = self._unnormalised(self.log_post[rows])
        return post @ self.values / post.sum(axis=1)

    def _normalised(self, log_post: np.ndarray) -> np.ndarray:
        post = self._unnormalised(log_post)
        return post / post.sum(axis=1, keepdims=True)

    @staticmethod
    def _unnormalised(log_post: np.ndarray) -> np.ndarray:
        return np.exp(log_post - log_post.max(axis=1, keepdims=True))


def model_learner_hits(trace: Trace, slots: int) -> int | None:
    """Hits of the model-aware learner with ``slots`` equal-size places (see the module's
    docstring). ``None`` when the trace has no popularity or too many adapters.

    What it is told, from ``trace.popularity``: the probability values (the first epoch's,
    which every later epoch permutes), the request at which each epoch starts, and the share
    of adapters whose probability changed at each start (its prior that any one adapter's
    did). Never which adapter has which value. Adapters outside the popularity (a scan's
    one-off adapters) are known to be asked for once: probability 0, the first to go."""
    if trace.popularity is None or len(trace.popularity[0].p) > MAX_LEARNER_ADAPTERS:
        return None
    epochs = trace.popularity
    n = len(epochs[0].p)
    posteriors = _Posteriors(np.sort(epochs[0].p)[::-1])
    moved = {
        later.start: float(np.mean(later.p != before.p))
        for before, later in itertools.pairwise(epochs)
    }
    cache: list[int] = []
    hits = 0
    for i, key in enumerate(trace.keys):
        if i in moved:
            posteriors.reshuffle(i, moved[i])
        if key in cache:
            hits += 1
        else:
            if len(cache) >= slots:
                outside = [place for place, k in enumerate(cache) if not 0 <= k < n]
                # first on ties; a one-off adapter (probability 0) before any other
                cache.pop(outside[0] if outside else int(np.argmin(posteriors.means(cache, i))))
            cache.append(key)
        if 0 <= key < n:
            posteriors.asked(key, i)
    return hits


@dataclass
class Oracle(Policy):
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
