"""Which adapters may have requests in the engine at once: the device-slot gate (L1).

vLLM's scheduler puts up to ``max_loras`` distinct adapters in one batch, but does not count
pinned adapters, which hold a device slot whether or not they are in the batch. With one
version pinned and ``max_loras`` other adapters in a batch, the worker evicts an adapter the
batch is using and the engine core dies (``KeyError`` in ``convert_mapping``; found by
``test_a_request_storm_over_more_adapters_than_slots_with_a_pin_leaves_the_engine_alive``).

So the node admits a request into the engine only while the distinct unpinned adapters with
requests there number at most ``max_loras - pinned``; others wait here, as they would have
waited in vLLM's queue. Opened wide (``GateRule.wide``, off by default), with nothing pinned
it lets in as many adapters as there are host slots (``max_cpu_loras``) and vLLM's scheduler,
which counts every adapter it runs then, picks ``max_loras`` of them each step. Base-model
requests and pinned adapters always pass. Pinning waits until the slot it takes is free.
Pure asyncio: no engine calls.

Adapter-aware admission, when more distinct adapters wait than there are free slots:

- a request for an adapter already in the batch joins it at once (it needs no slot);
- a freed slot goes to the waiting adapter with the most requests waiting (ties: the one
  waiting longest), so one slot change serves as many requests as it can, instead of in
  arrival order, where every few requests would swap an adapter into the slot;
- no adapter waits for ever: once one has waited ``starvation_s()`` (0.5 s, or four times
  a request's mean time in the engine where that is longer), or has seen ``MAX_PASSED`` free
  slots go to adapters that came after it (a bound in slot changes, whatever a request's
  time in the engine: at the seeds' scale a request holds its slot for seconds, and four
  holds were tens of steps), it is next, and the adapter in
  the batch that will free its slot first (its newest request is the oldest) takes no
  newcomers until it has; the others keep taking theirs, so a cold adapter costs the hot
  ones one slot for one request's time, not every newcomer's wait;
- narrow with nothing pinned (the default), a slot about to free is handed on a step early
  (``finishing``): the next adapter's request then waits inside vLLM for the step the slot
  frees, instead of reaching vLLM a step after it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from apps.serving.cache.clock import Clock, monotonic

STARVATION_S = 0.5  # the least an adapter may be kept waiting while others keep the slots busy
# ... or this many times a request's mean time in the engine, where that is longer
STARVATION_HOLDS = 4.0
HOLD_EWMA = 0.05  # the weight of each finished request in that mean
# ... or once this many free slots went to adapters that began waiting after it (as the load
# queue's ``loads.MAX_PASSED``; LORAHUB_NODE_GATE_MAX_PASSED, 0: the bound in seconds only)
MAX_PASSED = 4


@dataclass(frozen=True)
class GateRule:
    """The node's choices for its gate (``LORAHUB_NODE_GATE_*``).

    ``wide`` (off by default): with nothing pinned, as many adapters may have requests in
    vLLM as it has host slots (``max_cpu_loras``), and vLLM's scheduler picks ``max_loras``
    of them each step, as stock vLLM does: a hot adapter never stops taking newcomers. Never
    wider than the host slots: every request in vLLM holds its version there, so a load
    never waits for a request to end. Measured at the seeds' scale (``docs/performance.md``,
    a317d0f): it halves the hot requests' TTFT p95 at C=32, but a cold adapter then waits
    here for one of 16 slots to empty, and hot adapters seldom empty theirs: the p95 of all
    requests was 2.3x stock's, against 1.1-1.2x narrow, which stays the default until the
    admission order of issue 64 lets a waiting adapter in without draining the batch. With
    a pin the gate is narrow whatever this says: vLLM does not count pinned slots."""

    max_passed: int = MAX_PASSED  # 0: the bound in seconds only
    wide: bool = False


DEFAULT_RULE = GateRule()


class DeviceGate:
    """Admission is decided synchronously, the moment something changes (a request leaves,
    a pin is set up): the requests let in are woken with their slot already counted, so a
    freed slot is never idle while a task switch decides who gets it."""

    def __init__(
        self,
        slots: Callable[[], int],
        early: Callable[[], bool] = lambda: False,
        *,
        clock: Clock = monotonic,
        max_passed: int = MAX_PASSED,
    ) -> None:
        self._clock = clock
        self._max_passed = max_passed  # 0: the bound in seconds only
        self._slots = slots  # max_loras - len(pinned) - pins being set up, read live
        # whether a slot about to free may be handed on a step early (nothing pinned: then
        # vLLM's own scheduler counts every adapter it runs, see ``finishing``)
        self._early = early
        # unpinned LoRA id -> when each of its requests in the engine was let in, oldest first
        self._active: dict[int, deque[float]] = {}
        self._finishing: dict[int, int] = {}  # of those, requests on their last token
        # LoRA id -> its waiting requests, oldest first: (arrival time, woken with True)
        self._waiting: dict[int, list[tuple[float, asyncio.Future[bool]]]] = {}
        self._pin_waiters: list[tuple[int, asyncio.Future[bool]]] = []
        # waiting LoRA id -> free slots that went to adapters which began waiting after it
        self._passed: dict[int, int] = {}
        self._timer: asyncio.TimerHandle | None = None
        # a request's mean time in the engine, from admission to leaving (None: none left yet)
        self._hold_s: float | None = None

    def starvation_s(self) -> float:
        """How long an adapter may wait while the adapters in the batch take newcomers:
        ``STARVATION_S``, or ``STARVATION_HOLDS`` requests' time in the engine where that is
        longer. A bound in seconds alone starves the batch on a slow engine: when a request
        takes about as long as the bound, some adapter is nearly always over it, the batch
        stops taking newcomers and shrinks (``bench/load_mix.py`` load (b), C=32, on 2
        cores: 27 req/s and TTFT p50 648 ms with 0.5 s, against 35 req/s and 278 ms with
        2 s). Counted in requests' time, the bound means the same on any machine; four
        times the mean (about 1-1.3 s there) beat twice the mean in an A/B."""
        return max(STARVATION_S, STARVATION_HOLDS * (self._hold_s or 0.0))

    def active(self) -> set[int]:
        return set(self._active)

    def waiting(self) -> dict[int, int]:
        """Requests waiting here, per LoRA id."""
        return {lora_id: len(queue) for lora_id, queue in self._waiting.items()}

    # --- the decision ------------------------------------------------------------------------

    def _next(self, now: float) -> int | None:
        """The waiting adapter a free slot goes to: a starving one (longest first), else the
        one with the most waiters (then the longest waiting)."""
        outside = [(lid, q) for lid, q in self._waiting.items() if lid not in self._active]
        if not outside:
            return None
        starving = [(q[0][0], lid) for lid, q in outside if self._overdue(lid, now)]
        if starving:
            return min(starving)[1]
        return max(outside, key=lambda item: (len(item[1]), -item[1][0][0]))[0]

    def _overdue(self, lora_id: int, now: float) -> bool:
        """Waited ``starvation_s()``, or passed over ``MAX_PASSED`` times."""
        queue = self._waiting[lora_id]
        passed = self._passed.get(lora_id, 0)
        return now - queue[0][0] >= self.starvation_s() or 0 < self._max_passed <= passed

    def _leaving(self) -> set[int]:
        """Adapters whose every request in the engine is on its last token, when their slots
        may be handed on early (see ``finishing``)."""
        if not self._finishing or not self._early():
            return set()
        return {lid for lid, n in self._finishing.items() if n >= len(self._active.get(lid, ()))}

    def _taken(self) -> int:
        """Slots taken: adapters with requests in the engine, less those leaving."""
        return len(self._active) - len(self._leaving())

    def _starving(self, now: float) -> bool:
        """An adapter outside the batch has waited too long while every slot is taken: the
        adapters in the batch take no newcomers until one of them leaves."""
        choice = self._next(now)
        return choice is not None and self._overdue(choice, now) and self._taken() >= self._slots()

    def _draining(self, now: float) -> int | None:
        """While an adapter starves: the adapter in the batch that frees its slot first (its
        newest request was let in the longest ago), which takes no newcomers until it has.
        Stopping every adapter's newcomers instead made each cold request cost the hot ones
        a request's time (``bench/many_adapters.py``, cold under hot: hot p95 x1.37)."""
        if not self._starving(now):
            return None
        return min(self._active, key=lambda lora_id: self._active[lora_id][-1])

    def _admit(self, lora_id: int, now: float) -> None:
        self._passed.pop(lora_id, None)
        for _, woken in self._waiting.pop(lora_id, []):
            if not woken.done():
                woken.set_result(True)
                self._active.setdefault(lora_id, deque()).append(now)

    def _dispatch(self) -> None:
        """Let in whoever may enter now; arm a timer for the moment someone starts starving."""
        now = self._clock()
        # waiters of adapters in the batch join it: not one whose slot is being handed on,
        # nor the one draining for a starving adapter
        closed = self._leaving()
        draining = self._draining(now)
        if draining is not None:
            closed.add(draining)
        for lora_id in [lid for lid in self._waiting if lid in self._active]:
            if lora_id not in closed:
                self._admit(lora_id, now)
        while self._taken() < self._slots():
            choice = self._next(now)
            if choice is None:
                break
            for lid in self._waiting:  # in the order they began waiting
                if lid == choice:
                    break
                if lid not in self._active:
                    self._passed[lid] = self._passed.get(lid, 0) + 1
            self._admit(choice, now)
        for entry in list(self._pin_waiters):
            lora_id, woken = entry
            if len(self._active.keys() - {lora_id}) <= self._slots():
                self._pin_waiters.remove(entry)
                if not woken.done():
                    woken.set_result(True)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._waiting:
            oldest = min(queue[0][0] for queue in self._waiting.values())
            delay = max(0.0, oldest + self.starvation_s() - now) + 0.001
            self._timer = asyncio.get_running_loop().call_later(delay, self._dispatch)

    # --- requests ----------------------------------------------------------------------------

    async def enter(self, lora_id: int | None, *, pinned: bool) -> None:
        """Wait until a request for ``lora_id`` (None: the base model) may run."""
        if lora_id is None or pinned:
            return
        woken: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(lora_id, []).append((self._clock(), woken))
        self._dispatch()
        try:
            await woken
        except asyncio.CancelledError:
            queue = self._waiting.get(lora_id, [])
            queue[:] = [entry for entry in queue if entry[1] is not woken]
            if not queue:
                self._waiting.pop(lora_id, None)
                self._passed.pop(lora_id, None)
            if woken.done() and not woken.cancelled():  # let in as it was cancelled
                self.leave(lora_id)
            raise

    def finishing(self, lora_id: int | None) -> None:
        """A request of ``lora_id`` has one token left (it reached ``max_tokens - 1``): it
        leaves the batch after vLLM's next step. If that frees the adapter's slot, the next
        adapter is let in now, so that its request is already queued inside vLLM when the
        slot frees, instead of reaching vLLM a step later. Only with nothing pinned: vLLM's
        scheduler then counts every adapter it runs and starts the newcomer only once the
        slot is free (pinned adapters it does not count, which is why this gate exists).
        The caller says so once per request, and passes ``finishing=True`` to ``leave``."""
        if lora_id is None or lora_id not in self._active:
            return
        self._finishing[lora_id] = self._finishing.get(lora_id, 0) + 1
        if self._finishing[lora_id] >= len(self._active[lora_id]) and self._early():
            self._dispatch()

    def leave(self, lora_id: int | None, *, finishing: bool = False) -> None:
        """The request is out of the engine (synchronous: safe in any ``finally``)."""
        if lora_id is None or lora_id not in self._active:
            return
        if finishing and lora_id in self._finishing:
            left = self._finishing[lora_id] - 1
            if left:
                self._finishing[lora_id] = left
            else:
                del self._finishing[lora_id]
        admitted = self._active[lora_id]
        # Its time in the engine, for the mean behind ``starvation_s``. Requests are paired
        # with admissions oldest first: whichever request this was, the times of a set of
        # requests add up the same, so the mean is right.
        held = self._clock() - admitted.popleft()
        if self._hold_s is None:
            self._hold_s = held
        else:
            self._hold_s += HOLD_EWMA * (held - self._hold_s)
        if not admitted:
            del self._active[lora_id]
            self._dispatch()

    async def room_for_pin(self, lora_id: int) -> None:
        """Wait until pinning ``lora_id`` leaves a device slot for each active adapter.
        The caller has already counted the pin in ``slots`` (as being set up)."""
        if len(self._active.keys() - {lora_id}) <= self._slots():
            return
        woken: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        entry = (lora_id, woken)
        self._pin_waiters.append(entry)
        try:
            await woken
        finally:
            if entry in self._pin_waiters:
                self._pin_waiters.remove(entry)

    async def changed(self) -> None:
        """Re-decide after the slot count changed (a pin set up or removed)."""
        self._dispatch()
