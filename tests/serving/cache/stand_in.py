"""An engine stand-in with the ``EngineSlots`` protocol: what the cache manager asks of vLLM,
recorded."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass


@dataclass
class Settings:
    max_loras: int = 2
    max_cpu_loras: int = 3


class StandInEngine:
    def __init__(self) -> None:
        self.settings = Settings()
        self.adds: list[int] = []
        self.removed: list[int] = []
        self.pinned: list[int] = []
        self.add_delay = 0.0
        self.entered: list[int] = []  # adds begun (an add waits while the gate is closed)
        self.gate = asyncio.Event()
        self.gate.set()
        # what the engine would hold, counting an add from when it is sent (vLLM takes the
        # calls in the order sent), the most it ever held and the most adds under way at once
        self.resident: set[int] = set()
        self.peak = 0
        self.adding = self.most_adding = 0
        # with a time here, an add waits that long at most for a second add to be under way
        # (whether loads overlap must not hang on how fast a loaded machine lands them)
        self.wait_for_company: float | None = None
        self.company = asyncio.Event()

    async def add_adapter(self, handle) -> bool:
        self.entered.append(handle.lora_id)
        self.resident.add(handle.lora_id)
        self.peak = max(self.peak, len(self.resident))
        self.adding += 1
        self.most_adding = max(self.most_adding, self.adding)
        if self.adding >= 2:
            self.company.set()
        try:
            await self.gate.wait()
            if self.wait_for_company:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.company.wait(), self.wait_for_company)
            await asyncio.sleep(self.add_delay)
        finally:
            self.adding -= 1
        self.adds.append(handle.lora_id)
        return True

    async def remove_adapter(self, lora_id: int) -> bool:
        self.removed.append(lora_id)
        self.resident.discard(lora_id)
        return True

    async def pin_adapter(self, lora_id: int) -> bool:
        self.pinned.append(lora_id)
        return True
