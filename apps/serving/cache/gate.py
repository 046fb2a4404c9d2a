"""Which adapters may have requests in the engine at once: the device-slot gate (L1).

vLLM's scheduler puts up to ``max_loras`` distinct adapters in one batch, but does not count
pinned adapters, which hold a device slot whether or not they are in the batch. With one
version pinned and ``max_loras`` other adapters in a batch, the worker evicts an adapter the
batch is using and the engine core dies (``KeyError`` in ``convert_mapping``; found by
``test_a_request_storm_over_more_adapters_than_slots_with_a_pin_leaves_the_engine_alive``).

So the node admits a request into the engine only while the distinct unpinned adapters with
requests there number at most ``max_loras - pinned``; others wait here, as they would have
waited in vLLM's queue. Base-model requests and pinned adapters always pass. Pinning waits
until the slot it takes is free. Pure asyncio: no engine calls.

Adapter-aware admission, when more distinct adapters wait than there are free slots:

- a request for an adapter already in the batch joins it at once (it needs no slot);
- a freed slot goes to the waiting adapter with the most requests waiting (ties: the one
  waiting longest), so one slot change serves as many requests as it can, instead of in
  arrival order, where every few requests would swap an adapter into the slot;
- no adapter waits for ever: once one has waited ``STARVATION_S``, it is next, and requests
  for adapters already in the batch stop joining until a slot frees for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

STARVATION_S = 0.5  # the longest an adapter waits while others keep the slots busy


class DeviceGate:
    def __init__(self, slots: Callable[[], int]) -> None:
        self._slots = slots  # max_loras - len(pinned) - pins being set up, read live
        self._active: dict[int, int] = {}  # unpinned LoRA id -> requests in the engine
        self._waiting: dict[int, list[float]] = {}  # LoRA id -> arrival times of its waiters
        self._changed = asyncio.Condition()

    def active(self) -> set[int]:
        return set(self._active)

    def waiting(self) -> dict[int, int]:
        """Requests waiting here, per LoRA id."""
        return {lora_id: len(times) for lora_id, times in self._waiting.items()}

    def _next(self, now: float) -> int | None:
        """The waiting adapter a free slot goes to: a starving one (longest first), else the
        one with the most waiters (then the longest waiting)."""
        outside = [(lid, times) for lid, times in self._waiting.items() if lid not in self._active]
        if not outside:
            return None
        starving = [(times[0], lid) for lid, times in outside if now - times[0] >= STARVATION_S]
        if starving:
            return min(starving)[1]
        return max(outside, key=lambda item: (len(item[1]), -item[1][0]))[0]

    def _may_enter(self, lora_id: int, now: float) -> bool:
        choice = self._next(now)
        if lora_id in self._active:
            starved = choice is not None and now - self._waiting[choice][0] >= STARVATION_S
            return not starved or len(self._active) < self._slots()
        return len(self._active) < self._slots() and choice == lora_id

    async def enter(self, lora_id: int | None, *, pinned: bool) -> None:
        """Wait until a request for ``lora_id`` (None: the base model) may run."""
        if lora_id is None or pinned:
            return
        async with self._changed:
            arrived = time.monotonic()
            times = self._waiting.setdefault(lora_id, [])
            times.append(arrived)
            try:
                while not self._may_enter(lora_id, time.monotonic()):
                    # a change wakes it; so does time passing (an adapter starts starving)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), STARVATION_S / 2)
            finally:
                times.remove(arrived)
                if not times and self._waiting.get(lora_id) is times:
                    del self._waiting[lora_id]
            joined = lora_id not in self._active
            self._active[lora_id] = self._active.get(lora_id, 0) + 1
            if joined and lora_id in self._waiting:
                self._changed.notify_all()  # its other waiters may follow it in

    def leave(self, lora_id: int | None) -> None:
        """The request is out of the engine (synchronous: safe in any ``finally``)."""
        if lora_id is None or lora_id not in self._active:
            return
        count = self._active[lora_id] - 1
        if count:
            self._active[lora_id] = count
        else:
            del self._active[lora_id]
            asyncio.get_running_loop().create_task(self.changed())

    async def room_for_pin(self, lora_id: int) -> None:
        """Wait until pinning ``lora_id`` leaves a device slot for each active adapter.
        The caller has already counted the pin in ``slots`` (as being set up)."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: len(self._active.keys() - {lora_id}) <= self._slots()
            )

    async def changed(self) -> None:
        """Wake waiters after the slot count changed (a pin set up or removed)."""
        async with self._changed:
            self._changed.notify_all()
