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
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class DeviceGate:
    def __init__(self, slots: Callable[[], int]) -> None:
        self._slots = slots  # max_loras - len(pinned) - pins being set up, read live
        self._active: dict[int, int] = {}  # unpinned LoRA id -> requests in the engine
        self._changed = asyncio.Condition()

    def active(self) -> set[int]:
        return set(self._active)

    def _fits(self, lora_id: int) -> bool:
        return lora_id in self._active or len(self._active) < self._slots()

    async def enter(self, lora_id: int | None, *, pinned: bool) -> None:
        """Wait until a request for ``lora_id`` (None: the base model) may run."""
        if lora_id is None or pinned:
            return
        async with self._changed:
            await self._changed.wait_for(lambda: self._fits(lora_id))
            self._active[lora_id] = self._active.get(lora_id, 0) + 1

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
