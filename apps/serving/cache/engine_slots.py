"""What the cache manager needs of an engine, and the only thing it hands one.

The manager decides which adapters the engine holds; the engine (``node/engine.py``, vLLM)
only carries out adds, removes and pins. Written as a protocol so that the cache depends on
no engine: the node passes its vLLM engine, the tests a stand-in, the replay none at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class AdapterHandle:
    """An adapter the engine may apply: a stable integer id, a display name, a verified dir.
    Built only by the cache manager, from a folder it verified: never from a caller's string."""

    lora_id: int
    name: str
    path: Path

    def __post_init__(self) -> None:
        if self.lora_id < 1:
            raise ValueError("lora_id must be a positive integer")


class SlotCounts(Protocol):
    @property
    def max_loras(self) -> int: ...  # device slots (L1)

    @property
    def max_cpu_loras(self) -> int: ...  # host slots (L1 + L2)


class EngineSlots(Protocol):
    @property
    def settings(self) -> SlotCounts: ...

    async def add_adapter(self, adapter: AdapterHandle) -> bool: ...

    async def remove_adapter(self, lora_id: int) -> bool: ...

    async def pin_adapter(self, lora_id: int) -> bool: ...
