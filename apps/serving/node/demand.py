"""Prefetch from rising demand: a version whose request rate is climbing is brought back into
the engine before its next request needs it.

A load at a request's arrival (``requests.place``) already starts a cold version's climb as
early as that request can; what it cannot do is start before the request. Under churn (many
adapters, a few engine slots) a version whose demand is growing is often evicted between its
requests, and each return costs its next caller a load. So the node watches each version's
arrivals: when the last ``SHORT_S`` seconds hold at least ``MIN_REQUESTS`` of them at a rate
``RISING`` times the last ``LONG_S`` seconds' (a new alias, a canary ramping up, a tenant's
morning), and the version is not in the engine, it is loaded in the background while the load
queue has room, as a request would load it. Off unless ``LORAHUB_NODE_PREFETCH_RISING=1``:
the replay does not model it yet, and with it on the replay's tiers stop matching the node's
(``test_replaying_the_node_s_own_request_log_reproduces_the_tiers_it_reported``). A version
no alias serves any more (rolled back, replaced: ``deprecated``) is never prefetched, and
shadow copies are not demand. Nothing here reads a caller's input: the rule sees only the
versions the node has resolved.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from apps.registry.contracts import ResolvedVersion
from apps.serving.cache.engine_tiers import Owner
from apps.serving.cache.manager import CacheManager

logger = logging.getLogger(__name__)

SHORT_S = 10.0  # the recent window
LONG_S = 120.0  # the window it is compared with
RISING = 2.0  # recent rate / the long window's rate, at least
MIN_REQUESTS = 3  # in the recent window, at least (one or two requests are not a trend)
BUSY = 0.5  # the load queue's fill above which prefetches wait (requests come first)
EVERY_S = 1.0
# Memory is bounded whether or not prefetch runs: each version keeps at most this many arrival
# times (a rate above MAX_ARRIVALS / LONG_S reads as that rate), arrivals older than LONG_S
# are dropped as new ones come, and versions with none left are forgotten at least every
# SHORT_S: the table holds only versions asked for in the last LONG_S.
MAX_ARRIVALS = 4096


@dataclass
class _Seen:
    resolved: ResolvedVersion
    owner: Owner
    arrivals: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_ARRIVALS))


class Demand:
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        on_prefetch: Callable[[], object] = lambda: None,
    ) -> None:
        self.clock, self.on_prefetch = clock, on_prefetch
        self._seen: dict[int, _Seen] = {}
        self._loads: set[asyncio.Task] = set()  # prefetches under way (kept from the GC)
        self._swept = clock()

    def arrived(self, resolved: ResolvedVersion, owner: Owner) -> None:
        now = self.clock()
        seen = self._seen.get(resolved.version_id)
        if seen is None:
            seen = self._seen[resolved.version_id] = _Seen(resolved, owner)
        seen.resolved, seen.owner = resolved, owner
        seen.arrivals.append(now)
        self._trim(seen, now)
        if now - self._swept >= SHORT_S:
            self._sweep(now)

    def __len__(self) -> int:
        """Versions tracked now."""
        return len(self._seen)

    def arrivals(self) -> int:
        """Arrival times held now, over every version."""
        return sum(len(seen.arrivals) for seen in self._seen.values())

    @staticmethod
    def _trim(seen: _Seen, now: float) -> None:
        while seen.arrivals and seen.arrivals[0] < now - LONG_S:
            seen.arrivals.popleft()

    def _sweep(self, now: float) -> None:
        self._swept = now
        for version_id, seen in list(self._seen.items()):
            self._trim(seen, now)
            if not seen.arrivals:
                del self._seen[version_id]

    def rising(self) -> list[tuple[ResolvedVersion, Owner]]:
        """The versions whose demand is rising now, the steepest first."""
        now = self.clock()
        found: list[tuple[float, ResolvedVersion, Owner]] = []
        self._sweep(now)
        for seen in self._seen.values():
            recent = sum(1 for t in seen.arrivals if t >= now - SHORT_S)
            if recent < MIN_REQUESTS:
                continue
            ratio = (recent / SHORT_S) / (len(seen.arrivals) / LONG_S)
            if ratio >= RISING:
                found.append((ratio, seen.resolved, seen.owner))
        found.sort(key=lambda row: -row[0])
        return [(resolved, owner) for _, resolved, owner in found]

    async def prefetch(self, cache: CacheManager) -> int:
        """Start a background load for each rising version not in the engine, while the load
        queue is under ``BUSY`` and the engine has room nobody uses (``spare_room``); returns
        how many were started. A version a placed request waits for is left to that request,
        whose own step loads it (a prefetch would cost it a step boundary more)."""
        started = 0
        for resolved, owner in self.rising():
            if cache.loads.pressure() >= BUSY or not cache.tiers.spare_room():
                break
            record = cache.versions.get(resolved.version_id)
            if record is not None and (
                record.engine is not None
                or record.loading is not None
                or record.waiting > 0
                or record.quarantined
                or record.deprecated  # no alias serves it now (rolled back, replaced)
            ):
                continue
            task = asyncio.ensure_future(self._load(cache, resolved, owner))
            self._loads.add(task)
            task.add_done_callback(self._loads.discard)
            await asyncio.sleep(0)  # the load is queued (``record.loading``) before the next
            self.on_prefetch()
            started += 1
        return started

    @staticmethod
    async def _load(cache: CacheManager, resolved: ResolvedVersion, owner: Owner) -> None:
        try:
            await cache.activate(resolved, owner=owner, wait_for_room=False)
        except Exception as exc:  # a prefetch is best effort: the request will load it
            logger.info("prefetch of %s did not load: %s", resolved.label, exc)

    async def run(self, cache: CacheManager, ready: Callable[[], bool]) -> None:
        while True:
            await asyncio.sleep(EVERY_S)
            if ready():
                try:
                    await self.prefetch(cache)
                except Exception:
                    logger.warning("prefetch from demand failed", exc_info=True)
