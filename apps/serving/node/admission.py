"""Admission: who may start generating now. Generation slots, the queue of requests waiting
for a slot or for their adapter to load, and each tenant's request rate.

A request enters the queue at arrival (``queue``: 503 when every slot is busy and the queue
is full), may wait there for its adapter to load, then takes a generation slot
(``Ticket.slot``) and leaves the queue. Both are context managers, so a request that fails or
is cancelled anywhere gives back what it held; a streamed answer that outlives its handler
is handed what it holds with ``contextlib.AsyncExitStack.pop_all``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator

from apps.serving.node import openai_protocol as oai


class RateLimiter:
    """A token bucket per tenant: ``rpm`` requests per minute, bursts up to ``rpm``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._buckets: dict[int, tuple[float, float]] = {}
        self._clock = clock

    def allow(self, tenant_id: int, rpm: int) -> bool:
        if rpm <= 0:
            return False
        now = self._clock()
        tokens, last = self._buckets.get(tenant_id, (float(rpm), now))
        tokens = min(float(rpm), tokens + (now - last) * rpm / 60.0)
        if tokens < 1.0:
            self._buckets[tenant_id] = (tokens, now)
            return False
        self._buckets[tenant_id] = (tokens - 1.0, now)
        return True


class NoSpareSlot(Exception):
    """Every generation slot is taken or a caller is waiting for one."""


class Ticket:
    """One request's place in the queue, then its generation slot."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._queued = True
        self.waited_ms = 0.0  # time spent waiting for the slot (not for a load)

    def _leave_queue(self) -> None:
        if self._queued:
            self._queued = False
            self._admission.waiting -= 1

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Wait for a generation slot; the request then no longer counts as queued."""
        started = time.perf_counter()
        await self._admission._slots.acquire()
        self.waited_ms = (time.perf_counter() - started) * 1000
        self._leave_queue()
        self._admission.in_use += 1
        try:
            yield
        finally:
            self._admission.in_use -= 1
            self._admission._slots.release()


class Admission:
    def __init__(
        self,
        *,
        max_concurrent: int,
        max_queue: int,
        on_overloaded: Callable[[], None] = lambda: None,
    ) -> None:
        self.max_concurrent = max_concurrent
        self.in_use = 0  # generation slots taken
        self._slots = asyncio.Semaphore(max_concurrent)
        self.max_queue = max_queue
        self.waiting = 0  # requests admitted and waiting for a slot or a load
        self.rate = RateLimiter()
        self._on_overloaded = on_overloaded

    def check_rate(self, *, tenant_id: int, tenant_slug: str, rpm: int) -> None:
        """429 when the tenant is over its requests per minute."""
        if not self.rate.allow(tenant_id, rpm):
            raise oai.ApiError(
                429,
                f"tenant '{tenant_slug}' is over its rate of {rpm} requests per minute",
                type_="rate_limit_error",
                code="rate_limited",
                retry_after=2,
            )

    @contextlib.asynccontextmanager
    async def spare_slot(self, headroom: int) -> AsyncIterator[None]:
        """A generation slot for work that must never make a caller wait (shadow copies):
        taken only when nobody is queued and ``headroom`` more slots than this one stay free
        for callers arriving meanwhile, else ``NoSpareSlot`` at once. On a saturated CPU every
        sequence in the engine's batch slows the others, so spare means well under capacity."""
        if self.waiting > 0 or self.in_use + 1 + headroom > self.max_concurrent:
            raise NoSpareSlot
        await self._slots.acquire()  # free: returns without yielding to another request
        self.in_use += 1
        try:
            yield
        finally:
            self.in_use -= 1
            self._slots.release()

    @contextlib.contextmanager
    def queue(self) -> Iterator[Ticket]:
        """Enter the queue: 503 when every generation slot is busy and the queue is full.
        Requests waiting for their adapter to load count as queued: once admitted, a request
        is never refused for having waited on a load."""
        if self._slots.locked() and self.waiting >= self.max_queue:
            self._on_overloaded()
            raise oai.ApiError(
                503,
                "the node is at capacity; retry shortly",
                type_="overloaded_error",
                code="overloaded",
                retry_after=1,
            )
        self.waiting += 1
        ticket = Ticket(self)
        try:
            yield ticket
        finally:
            ticket._leave_queue()
