"""Placing an adapter version where the engine can use it (the request path's step 4).

This is the simple path: land the version from the registry (L4) in the node's disk tier (L3,
``cache/disk.py``: verified once against the signed manifest, sealed, and checked against its
seal on every load), then hand the engine an ``AdapterHandle``; the engine's slots are tracked
to tell L1 from L2. The four-tier cache manager replaces this behind ``Placement.place``.

A file that fails its seal at L3 is deleted and landed again from L4 (counted). Bytes from
L4 that fail the signed manifest quarantine the version on this node: it is refused with a
clear error, counted in ``adapter_integrity_failures_total{tier="L4"}`` and written to the
audit log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from apps.registry.aliases import ResolvedVersion
from apps.registry.storage import ObjectStore
from apps.serving.cache.disk import DiskTier, IntegrityFailure
from apps.serving.cache.policy import Policy, Resident, make_policy, select_victims
from apps.serving.engine import AdapterHandle, Engine

logger = logging.getLogger(__name__)


class AdapterIntegrityError(Exception):
    """A version failed its integrity check and is quarantined on this node."""


class PinLimit(Exception):
    """Pinning one more version would leave no device slot to rotate."""


@dataclass(frozen=True)
class Placed:
    handle: AdapterHandle
    tier: str  # where it was found: L1, L2, L3 or L4
    load_ms: float


def lora_id_for(resolved: ResolvedVersion) -> int:
    """Stable per immutable version: the registry's version id (positive, never reused)."""
    return resolved.version_id


class Placement:
    def __init__(
        self,
        *,
        engine: Engine,
        store: ObjectStore,
        root: Path,
        public_keys,
        policy: Policy | None = None,
        on_integrity_failure=None,
        on_evict=None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.disk = DiskTier(root)
        self.public_keys = public_keys  # callable -> {key_id: public_key}
        self.on_integrity_failure = on_integrity_failure  # callable(resolved, tier, reason)
        self.quarantined: set[int] = set()
        self.pinned: set[int] = set()
        self.policy: Policy = policy or make_policy("weighted")
        self.on_evict = on_evict  # callable(tier)
        self._residents: dict[int, Resident] = {}  # in the engine (L1 + L2), by LoRA id
        self._inflight: dict[int, asyncio.Future] = {}

    def to_disk(self, resolved: ResolvedVersion) -> str:
        """L3 if the sealed copy checks out, else land it from L4 (blocking). Returns the tier."""
        if self.disk.has(resolved):
            try:
                self.disk.check(resolved)
                return "L3"
            except IntegrityFailure as exc:
                logger.warning("replacing a corrupt disk copy: %s", exc)
                self.disk.evict(resolved)
                if self.on_integrity_failure:
                    self.on_integrity_failure(resolved, "L3", str(exc))
        try:
            self.disk.land(resolved, self.store, self.public_keys())
        except IntegrityFailure as exc:
            self.quarantined.add(resolved.version_id)
            if self.on_integrity_failure:
                self.on_integrity_failure(resolved, "L4", str(exc))
            raise AdapterIntegrityError(str(exc)) from None
        return "L4"

    async def place(self, resolved: ResolvedVersion, *, priority: int = 1) -> Placed:
        """Make the version usable by the engine; concurrent calls share one fetch and load.

        When the engine's host cache (L2, ``max_cpu_loras``) is full, the eviction policy
        picks what leaves, and it is removed before the new adapter is added: vLLM's own LRU
        never decides.
        """
        lora_id = lora_id_for(resolved)
        if resolved.version_id in self.quarantined:
            raise AdapterIntegrityError(f"{resolved.label} is quarantined on this node")
        handle = AdapterHandle(
            lora_id=lora_id,
            name=f"{resolved.tenant_slug}/{resolved.label}",
            path=self.disk.folder(resolved),
        )
        resident = self._residents.get(lora_id)
        if resident is not None:
            tier = "L1" if lora_id in self._device_set() else "L2"
            self._residents[lora_id] = resident.touched(time.monotonic())
            return Placed(handle, tier, 0.0)
        pending = self._inflight.get(lora_id)
        if pending is not None:
            placed = await asyncio.shield(pending)
            return Placed(handle, placed.tier, placed.load_ms)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._inflight[lora_id] = future
        try:
            started = time.perf_counter()
            tier = await asyncio.to_thread(self.to_disk, resolved)
            await self._make_room()
            await self.engine.add_adapter(handle)
            load_ms = (time.perf_counter() - started) * 1000
            self._residents[lora_id] = Resident(
                key=(lora_id,),
                tenant_id=resolved.tenant_id,
                size_bytes=sum(size for _, _, size in resolved.files),
                last_used=time.monotonic(),
                hits=1.0,
                reload_cost_ms=load_ms,
                tenant_priority=priority,
            )
            placed = Placed(handle, tier, load_ms)
            future.set_result(placed)
            return placed
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: waiters get it, nobody logs it twice
            raise
        finally:
            self._inflight.pop(lora_id, None)

    async def _make_room(self) -> None:
        capacity = self.engine.settings.max_cpu_loras
        while len(self._residents) >= capacity:
            residents = [
                replace(r, pinned=r.key[0] in self.pinned) for r in self._residents.values()
            ]
            victims = select_victims(
                residents, policy=self.policy, now=time.monotonic(), capacity=capacity
            )
            if not victims:  # everything pinned: cannot happen with pins < max_loras
                return
            for victim in victims:
                self.policy.on_evict(victim, time.monotonic())
                await self.remove(victim.key[0])
                if self.on_evict:
                    self.on_evict("L2")

    def _device_set(self) -> set[int]:
        """What is in the device slots (L1): the pinned versions, then the most recently used."""
        free = max(self.engine.settings.max_loras - len(self.pinned), 0)
        unpinned = sorted(
            (r for r in self._residents.values() if r.key[0] not in self.pinned),
            key=lambda r: r.last_used,
            reverse=True,
        )
        return set(self.pinned) | {r.key[0] for r in unpinned[:free]}

    async def pin(self, resolved: ResolvedVersion) -> Placed:
        """Keep a version in the engine's device slots (L1).

        At most ``max_loras - 1`` versions are pinned, so one slot always rotates: with every
        slot pinned, vLLM kills its engine core on the next request for another adapter.
        """
        placed = await self.place(resolved)
        lora_id = placed.handle.lora_id
        if lora_id in self.pinned:
            return placed
        limit = self.engine.settings.max_loras - 1
        if len(self.pinned) >= limit:
            raise PinLimit(
                f"{len(self.pinned)} versions are pinned, the most this node allows "
                f"(max_loras - 1 = {limit}); evict one from L1 first"
            )
        await self.engine.pin_adapter(lora_id)
        self.pinned.add(lora_id)
        return Placed(placed.handle, "L1", placed.load_ms)

    def holds(self, lora_id: int) -> bool:
        """True if the version is in the engine (L1 or L2)."""
        return lora_id in self._residents

    async def remove(self, lora_id: int) -> bool:
        """Take a version out of the engine (L1 and L2); its disk copy stays."""
        self.pinned.discard(lora_id)
        self._residents.pop(lora_id, None)
        return await self.engine.remove_adapter(lora_id)

    def residents(self) -> dict[str, list[dict]]:
        now = time.monotonic()
        device = self._device_set()
        rows = [
            {
                "version_id": r.key[0],
                "tenant_id": r.tenant_id,
                "size_bytes": r.size_bytes,
                "hits": round(r.decayed_hits(now), 2),
                "idle_s": round(now - r.last_used, 1),
                "reload_cost_ms": round(r.reload_cost_ms, 2),
                "pinned": r.key[0] in self.pinned,
                "score": round(self.policy.score(r, now), 3),
            }
            for r in self._residents.values()
        ]
        return {
            "L1": [row for row in rows if row["version_id"] in device],
            "L2": [row for row in rows if row["version_id"] not in device],
            "L3": self.disk.listing(),
        }

    def forget_engine(self) -> None:
        """After an engine restart: nothing is in its slots any more (disk copies remain)."""
        self._residents.clear()
        self.pinned.clear()

    def hot_bytes(self) -> int:
        device = self._device_set()
        return sum(r.size_bytes for r in self._residents.values() if r.key[0] in device)
