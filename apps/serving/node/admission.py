"""Admission: who may start generating now. The engine's seats, the queue of requests waiting
for a seat or for their adapter to load, in each tenant's fair order (``serving/fairness.py``), and
each tenant's request rate.

A request enters the queue at arrival (``queue``: 503 when every seat is busy and the queue
is full), may wait there for its adapter to load, then takes a seat (``Ticket.slot``: the
waiting tenant least served so far goes first) and leaves the queue. Both are context
managers, so a request that fails or is cancelled anywhere gives back what it held; a streamed
answer that outlives its handler is handed what it holds with ``contextlib.AsyncExitStack.pop_all``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator

from apps.serving.fairness import FairQueue
from apps.serving.node import openai_protocol as oai
from apps.serving.node.lookups import Caller
from apps.tenants.shares import weight_of


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
    """One request's place in the queue, then its generation seat."""

    def __init__(self, admission: Admission, tenant: int | None, weight: float, label: str) -> None:
        self._admission = admission
        self.tenant, self.weight, self.label = tenant, weight, label
        self._queued = True
        self.waited_ms = 0.0  # time spent waiting for the seat (not for a load)
        self._reserved = 0  # output tokens charged at the seat and not generated yet
        self.priority = 0  # inside the engine, lower first (FairQueue.standing at the seat)

    def _leave_queue(self) -> None:
        if self._queued:
            self._queued = False
            self._admission.waiting -= 1

    def charge(self, *, prompt: int = 0, completion: int = 0) -> None:
        """Tokens the engine served this request since the last call (its tenant's counter;
        output tokens already reserved at the seat are not charged twice)."""
        reserved = min(completion, self._reserved)
        self._reserved -= reserved
        self._admission.fair.charge(self.tenant, prompt=prompt, completion=completion - reserved)
        self._admission.on_tokens(self.label, prompt, completion)

    @contextlib.asynccontextmanager
    async def slot(self, reserve: int = 0) -> AsyncIterator[None]:
        """Wait for a seat in the engine's batch, in the fair order (``serving/fairness.py``); the
        request then no longer counts as queued.

        ``reserve``: the output tokens the request may generate (its ``max_tokens``), charged
        to its tenant as it takes the seat and given back for those it did not generate when
        it leaves. A generation holds its seat for seconds; charged only as it streams, a
        tenant's counter would lag what it holds, and a tenant arriving beside a flood would
        take every seat that frees until its first answers caught up."""
        admission = self._admission
        started = time.perf_counter()
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        admission.fair.arrive(self.tenant, granted, weight=self.weight)
        admission._dispatch()
        try:
            await granted
        except BaseException:
            left = admission.fair.leave(self.tenant, granted)
            if not left and not granted.cancelled():  # seated as it was cancelled
                admission._free(self.tenant)
            raise
        self.waited_ms = (time.perf_counter() - started) * 1000
        admission.on_waited(self.label, self.waited_ms / 1000)
        self._leave_queue()
        self.priority = admission.fair.standing(self.tenant)
        self._reserved = max(reserve, 0)
        admission.fair.charge(self.tenant, completion=self._reserved)
        try:
            yield
        finally:
            admission.fair.charge(self.tenant, completion=-self._reserved)  # not generated
            self._reserved = 0
            admission._free(self.tenant)


class Admission:
    """The queue in front of the engine and its seats: ``max_concurrent`` seats any tenant may
    take, and ``headroom`` more that only a tenant below its fair share may take, so that a
    flood from one tenant does not make another's request wait for a long generation to end.
    The engine's batch holds ``max_concurrent + headroom`` sequences."""

    def __init__(
        self,
        *,
        max_concurrent: int,
        max_queue: int,
        headroom: int = 0,
        on_overloaded: Callable[[], None] = lambda: None,
        on_waited: Callable[[str, float], None] = lambda tenant, seconds: None,
        on_tokens: Callable[[str, int, int], None] = lambda tenant, prompt, completion: None,
    ) -> None:
        self.max_concurrent = max_concurrent
        self.fair = FairQueue(max_concurrent, headroom=headroom)
        self.max_queue = max_queue
        self.waiting = 0  # requests admitted and waiting for a seat or a load
        self.rate = RateLimiter()
        self._on_overloaded = on_overloaded
        self.on_waited, self.on_tokens = on_waited, on_tokens

    @property
    def in_use(self) -> int:
        """Seats taken (headroom seats included)."""
        return self.fair.running

    def _dispatch(self) -> None:
        while (chosen := self.fair.next()) is not None:
            tenant, granted = chosen
            assert isinstance(granted, asyncio.Future)
            if granted.cancelled():  # its waiter was cancelled and has not run since
                self.fair.done(tenant)
            else:
                granted.set_result(None)

    def _free(self, tenant: int | None) -> None:
        self.fair.done(tenant)
        self._dispatch()

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
        """A seat for work that must never make a caller wait (shadow copies): taken only when
        nobody is queued and ``headroom`` more seats than this one stay free for callers
        arriving meanwhile, else ``NoSpareSlot`` at once. On a saturated CPU every sequence in
        the engine's batch slows the others, so spare means well under capacity."""
        if self.waiting > 0 or self.in_use + 1 + headroom > self.max_concurrent:
            raise NoSpareSlot
        self.fair.occupy()
        try:
            yield
        finally:
            self.fair.vacate()
            self._dispatch()

    def queue_for(self, caller: Caller | None) -> contextlib.AbstractContextManager[Ticket]:
        """``queue`` for a caller: its tenant, with its tier's and its operator's weight."""
        assert caller is not None
        weight = weight_of(caller.priority, caller.engine_weight)
        return self.queue(caller.tenant_id, weight=weight, label=caller.tenant_slug)

    @contextlib.contextmanager
    def queue(
        self, tenant: int | None = None, *, weight: float = 1.0, label: str = ""
    ) -> Iterator[Ticket]:
        """Enter the queue: 503 when every seat is busy and the queue is full. Requests
        waiting for their adapter to load count as queued: once admitted, a request is never
        refused for having waited on a load."""
        if self.in_use >= self.max_concurrent and self.waiting >= self.max_queue:
            self._on_overloaded()
            raise oai.ApiError(
                503,
                "the node is at capacity; retry shortly",
                type_="overloaded_error",
                code="overloaded",
                retry_after=1,
            )
        self.waiting += 1
        ticket = Ticket(self, tenant, weight, label)
        try:
            yield ticket
        finally:
            ticket._leave_queue()
