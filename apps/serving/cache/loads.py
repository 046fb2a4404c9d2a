"""The load queue: versions being brought into the engine, and how many may be at once.

Loading is single-flight per version (one fetch and one engine add however many requests
wait: the task is the record's ``loading``), and bounded: at most ``max_concurrent_fetches``
downloads from the registry and ``max_concurrent_loads`` engine adds run at once, and at most
``max_pending`` versions may be loading or queued. A request that finds the queue full waits
for room (within its deadline) or is refused, as its tenant tier decides (``manager.py``).

Adapters differ in size fourfold and more (rank 8 to 128; 20 to 80 MB at the seeds' scale),
and a fetch or an engine add costs in proportion. In arrival order, a small adapter queued
behind a few large ones waits for all their bytes. So a freed slot goes to the smallest
waiting version (shortest job first, which minimises the mean wait), and a version passed
over ``MAX_PASSED`` times goes next whatever its size: a large adapter waits for at most that
many smaller loads, so neither starves the other.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from apps.serving.cache.engine_slots import AdapterHandle
from apps.serving.cache.versions import CachedVersion

logger = logging.getLogger(__name__)


MAX_PASSED = 4  # a waiting load is passed over by at most this many smaller ones


@dataclass(frozen=True)
class Placed:
    """Where a placement found a version, and what its load cost."""

    handle: AdapterHandle
    tier: str  # where it was found: L1, L2, L3 or L4
    load_ms: float
    timings: dict[str, float] = field(default_factory=dict)  # fetch, verify, check, add (ms)
    # this call started the load (of concurrent callers sharing one load, exactly one did)
    started: bool = False


class LoadQueueFull(Exception):
    """Too many versions are loading or queued; the request's tier decides what happens."""


class LoadDeadline(Exception):
    """The adapter did not load within the request's deadline (the load goes on)."""


@dataclass(order=True)
class _Waiter:
    size_bytes: int
    arrival: int  # ties: the first to arrive
    passed: int = field(default=0, compare=False)
    woken: asyncio.Future[None] = field(default_factory=asyncio.Future, compare=False)


class SizedSlots:
    """``slots`` loads at once; a freed slot goes to the smallest waiting load, or to one
    passed over ``MAX_PASSED`` times (the oldest of those). Pure asyncio."""

    def __init__(self, slots: int) -> None:
        self.free = slots
        self.waiting: list[_Waiter] = []
        self._arrivals = itertools.count()

    @asynccontextmanager
    async def slot(self, size_bytes: int) -> AsyncIterator[None]:
        if self.free > 0 and not self.waiting:
            self.free -= 1
        else:
            waiter = _Waiter(size_bytes, next(self._arrivals))
            self.waiting.append(waiter)
            try:
                await waiter.woken  # woken with its slot already counted
            except asyncio.CancelledError:
                if waiter in self.waiting:
                    self.waiting.remove(waiter)
                elif not waiter.woken.cancelled():
                    self._release()  # the slot it was handed goes on
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        live = [w for w in self.waiting if not w.woken.done()]
        if not live:
            self.waiting = []
            self.free += 1
            return
        overdue = [w for w in live if w.passed >= MAX_PASSED]
        chosen = min(overdue, key=lambda w: w.arrival) if overdue else min(live)
        live.remove(chosen)
        for waiter in live:
            if waiter.arrival < chosen.arrival:
                waiter.passed += 1
        self.waiting = live
        chosen.woken.set_result(None)


class LoadQueue:
    def __init__(self, *, max_fetches: int, max_loads: int, max_pending: int) -> None:
        self.fetch_slots = SizedSlots(max_fetches)
        self.load_slots = SizedSlots(max_loads)
        self.max_pending = max_pending
        self._limits = (max_fetches, max_loads)
        self.members: dict[int, CachedVersion] = {}  # loading (``record.loading`` is set)
        self._room = asyncio.Condition()  # signalled when a load finishes

    def resize(self, *, max_fetches: int, max_loads: int, max_pending: int) -> None:
        """New limits; loads under way finish on the old semaphores."""
        if (max_fetches, max_loads) != self._limits:
            self.fetch_slots = SizedSlots(max_fetches)
            self.load_slots = SizedSlots(max_loads)
            self._limits = (max_fetches, max_loads)
        self.max_pending = max_pending

    def __len__(self) -> int:
        return len(self.members)

    def full(self) -> bool:
        return len(self.members) >= self.max_pending

    def pressure(self) -> float:
        """How full the queue is, 0 to 1 (the policy keeps costly reloads harder when full)."""
        return min(1.0, len(self.members) / max(1, self.max_pending))

    def start(self, record: CachedVersion, load: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run ``load`` as the version's one load (the only writer of ``record.loading``)."""
        task = asyncio.create_task(load)
        record.loading = task
        self.members[record.version_id] = record
        task.add_done_callback(lambda done: self._done(record, done))
        return task

    def _done(self, record: CachedVersion, task: asyncio.Task) -> None:
        if record.loading is task:
            record.loading = None
            self.members.pop(record.version_id, None)
        if not task.cancelled() and task.exception() is not None:
            logger.info("loading version %s failed: %s", record.version_id, task.exception())
        room = self._room

        async def notify() -> None:
            async with room:
                room.notify_all()

        asyncio.get_running_loop().create_task(notify())

    async def wait_for_room(self, deadline_s: float | None) -> None:
        """Until fewer than ``max_pending`` versions are loading; ``TimeoutError`` past the
        deadline."""
        room = self._room

        async def wait() -> None:
            async with room:
                await room.wait_for(lambda: not self.full())

        await asyncio.wait_for(wait(), timeout=deadline_s)

    async def join(
        self,
        record: CachedVersion,
        start: Callable[[], Coroutine[Any, Any, Any]],
        *,
        left: float | None,
        wait_for_room: bool,
        what: str,
        waiting: Callable[[bool], None] | None = None,
    ) -> tuple[Any, bool] | None:
        """Wait for the version's load under way, or start one (``start()``) if the queue has
        room, for at most ``left`` seconds: (its result, whether this call started it). None
        after waiting for room in a full queue (the caller looks again); ``LoadQueueFull`` if
        it may not wait, ``LoadDeadline`` (``what``) past ``left`` — the load carries on.
        ``waiting(True)`` / ``waiting(False)`` frame the wait for the load."""
        task, starter = record.loading, False
        if task is None:
            if self.full():
                if not wait_for_room:
                    raise LoadQueueFull(f"{len(self)} versions are loading")
                try:
                    await self.wait_for_room(left)
                except TimeoutError:
                    raise LoadDeadline("the load queue stayed full past the deadline") from None
                return None
            task, starter = self.start(record, start()), True
        if waiting:
            waiting(True)
        try:
            return await asyncio.wait_for(asyncio.shield(task), timeout=left), starter
        except TimeoutError:
            raise LoadDeadline(what) from None
        finally:
            if waiting:
                waiting(False)
