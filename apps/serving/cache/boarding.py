"""A request's placement, in two verbs (the request path's step 4): ``prepare`` at arrival,
``board`` right before the request is sent to vLLM.

``prepare``: the version in the engine already, or its L3 copy landed (from L4 if need be) and
checked — nothing added to the engine, nothing held. The request then waits for a seat and a
device slot as one of the version's *waiting* requests: the version is the eviction policy's
last choice of victim and keeps its disk copy, but is not protected.

``board``: from here the version is *protected* (held) while the request is inside the engine.
A cold load costs one step boundary: the victims' removals are sent, the request follows with
no await between, and the step that first schedules it loads the adapter (vLLM's
``_apply_adapters``, as stock vLLM loads an adapter it has resolved); the node never awaits an
add and then sends. The victims are the node's (``engine_tiers.victims``), never a version a
request inside the engine holds, and the room is made before the request arrives, so vLLM's
LRU never chooses. A version evicted while its request waited is booked in again here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

from apps.registry.contracts import ResolvedVersion
from apps.serving import offload
from apps.serving.cache.engine_slots import AdapterHandle
from apps.serving.cache.engine_tiers import Owner
from apps.serving.cache.landing import AdapterIntegrityError
from apps.serving.cache.loads import Placed
from apps.serving.cache.versions import CachedVersion

logger = logging.getLogger(__name__)
MIB = 1024**2
# What vLLM's add of a version costs the engine per MB, for the eviction policy's reload cost
# of a version loaded by its request's step (whose add the node cannot time):
# ``bench/seed_floors.py --engine`` measured 1.1-1.5 ms per MB for seed adapters.
ADD_MS_PER_MB = 1.5


def _log_failures(sent: asyncio.Future) -> None:
    if sent.cancelled():
        return
    for answer in sent.result():
        if isinstance(answer, BaseException):
            logger.warning("an engine removal failed: %s", answer)


class Boarding:
    def __init__(self, cache: Any) -> None:
        # the ``CacheManager`` that owns it (not imported: it imports this module)
        self.cache = cache

    async def prepare(
        self,
        resolved: ResolvedVersion,
        *,
        owner: Owner | None = None,
        deadline_s: float | None = None,
        wait_for_room: bool = True,
    ) -> Placed:
        """A request's placement: its version made ready to enter the engine *with* the
        request, without a hold — in the engine already (L1/L2, the use recorded), or its L3
        copy landed from L4 if need be and checked (single-flight, in the load queue, within
        ``deadline_s`` as for ``activate``). The request then waits for a seat and a device
        slot as one of the version's waiting requests (``record.waiting``: the version is the
        last choice of victim and keeps its disk copy) and ends its wait with ``board``, or,
        if it gives up, ``stop_waiting``."""
        record, owner, handle, started = self.cache._use(resolved, owner)
        while True:
            if record.quarantined:
                raise AdapterIntegrityError(f"{resolved.label} is quarantined on this node")
            tier = self.cache.book.use(record)
            if tier is not None:
                record.waiting += 1
                return Placed(handle, tier, 0.0)
            if record.loading is None and not self.cache.limits.verify_checksum:
                found = self.cache.landing.checked_now(resolved)  # on disk: no queue, no deadline
                if found is not None:
                    record.waiting += 1
                    return Placed(handle, found.found_in, 0.0, found.timings)
            joined = await self.cache.loads.join(
                record,
                lambda: self._ready(resolved, record, handle),
                left=None if deadline_s is None else deadline_s - (self.cache.clock() - started),
                wait_for_room=wait_for_room,
                what=f"{resolved.label} did not load within {(deadline_s or 0) * 1000:.0f} ms",
            )
            if joined is None:
                continue
            placed, starter = joined
            if record.engine is None and record.folder is not None:
                record.waiting += 1  # no await since the copy was checked: it is still there
                return replace(placed, started=starter)
            # an explicit load put it in the engine meanwhile, or its copy went: look again

    async def _ready(
        self, resolved: ResolvedVersion, record: CachedVersion, handle: AdapterHandle
    ) -> Placed:
        """The version's L3 copy, landed (from L4, in a fetch slot) or checked."""
        started = self.cache.timer()
        if self.cache.disk.has(resolved):
            found = await offload.run(self.cache.land, resolved)
        else:
            async with self.cache.loads.fetch_slots.slot(resolved.size_bytes):
                found = await offload.run(self.cache.land, resolved)
        return Placed(handle, found.found_in, (self.cache.timer() - started) * 1000, found.timings)

    def stop_waiting(self, version_id: int) -> None:
        """A placed request gave up before it boarded (``prepare``)."""
        record = self.cache.versions.get(version_id)
        if record is not None and record.waiting > 0:
            record.waiting -= 1

    async def board(
        self, resolved: ResolvedVersion, *, owner: Owner | None = None, placed: Placed
    ) -> str | None:
        """A placed request enters the engine now: its version is held from here until
        ``release``. None if the version is in the engine; otherwise the tier its bytes come
        from (``L3``): the version was not in the engine, or left it while the request waited.

        A cold load costs one engine step boundary: the removals that make room are sent now,
        and the caller sends the request right after them, with no await in between; the
        engine core takes both between the same two steps (in the order sent), and the step
        that schedules the request loads the adapter from its L3 folder (vLLM's
        ``_apply_adapters``, as stock vLLM loads an adapter it has resolved). No ``add_lora``
        goes first, so no step boundary is spent on it and no device slot is taken before a
        request needs one. The victims are the node's (``engine_tiers.victims``): never a
        version a request inside the engine holds; vLLM's LRU never chooses, because the room
        is made before the request arrives. The folder was verified when it landed and its
        seal checked by ``prepare``; the engine reads it in the step."""
        record = self.cache._record(resolved)
        owner = owner or Owner(tenant_id=resolved.tenant_id)
        while record.engine is None:
            if record.quarantined:
                raise AdapterIntegrityError(f"{resolved.label} is quarantined on this node")
            if record.folder is None or record.loading is not None:
                # its copy left the disk, or an explicit load of it is under way: place again
                again = await self.prepare(resolved, owner=owner)
                self.stop_waiting(record.version_id)
                placed = replace(again, tier=again.tier if again.tier in ("L3", "L4") else "L3")
                continue
            removals = await self.cache._make_room(owner, incoming=resolved.size_bytes)
            if record.engine is not None or record.folder is None or record.loading is not None:
                await self._send(removals)  # the room stays made; look again
                continue
            self.cache.book.admit(
                record,
                owner,
                size_bytes=resolved.size_bytes,
                reload_cost_ms=placed.timings.get("check_ms", 0.0)
                + ADD_MS_PER_MB * resolved.size_bytes / MIB,
            )
            # From the hold to the return nothing awaits: a request cancelled in between would
            # keep its hold for ever (its trace is marked boarded only once this returns). The
            # removals' tasks are queued before the request's send task, so they send first.
            self._board(record)
            self._send_soon(removals)
            self.cache.boundaries[1] = self.cache.boundaries.get(1, 0) + 1
            if self.cache.on_load:
                self.cache.on_load(placed.tier, placed.load_ms, resolved.size_bytes, boundaries=1)
            return "L3"
        self._board(record)
        return None

    def _board(self, record: CachedVersion) -> None:
        """One of the version's waiting requests is inside the engine now."""
        if record.waiting > 0:
            record.waiting -= 1
        self.cache.tiers.hold(record)

    async def _send(self, removals: list[Coroutine[Any, Any, bool]]) -> None:
        """Send the engine calls now (each is on the engine core's queue on return, in
        order); their answers are awaited in the background."""
        if removals:
            self._send_soon(removals)
            await asyncio.sleep(0)  # each call runs up to its send, which does not suspend

    def _send_soon(self, removals: list[Coroutine[Any, Any, bool]]) -> None:
        pending = asyncio.gather(*removals, return_exceptions=True)
        pending.add_done_callback(_log_failures)
        self.cache._removing.add(pending)
        pending.add_done_callback(self.cache._removing.discard)
