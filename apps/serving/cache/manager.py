"""The four-tier adapter cache manager: where each immutable version lives on this node.

- L1, vLLM's device LoRA slots (``max_loras``): operator pins, at most ``max_loras - 1`` and
  within each tenant's hot quota; vLLM rotates the other slots batch by batch.
- L2, vLLM's host LoRA cache (``max_cpu_loras``): this manager decides, by slot count, memory
  cap, TTL, each tenant's warm quota and the eviction policy.
- L3, one verified folder per version on local disk (``cache/disk.py``): this manager decides,
  by size cap and the eviction policy.
- L4, the registry's object store: read-only for the node.

This module orchestrates; the bookkeeping lives in ``cache/``: one record per version with
its whole state (``versions.py``), the engine tiers L1/L2 and the device-slot gate
(``engine_tiers.py``, ``gate.py``), the disk index (``disk.DiskIndex``) and the load queue
(``loads.py``). Every decision about what leaves comes from a pure policy (``policies/``);
vLLM's own LRU never decides: before an add would overflow the host cache, the policy's
victim is removed first.

A request's placement is two verbs (the request path's step 4, ``boarding.py``): ``prepare``
at arrival (its version in the engine already, or its L3 copy landed and checked — nothing
held), then, once it has a seat and a device slot, ``board`` right before it is sent to vLLM:
from there its version is *protected* while the request is inside the engine; before, a
waiting request only counts toward keeping it. A cold load costs one step boundary.

The tier moves, one verb each: ``land`` (L4 to L3: fetch, verify, seal), ``activate`` (into
the engine now, from whatever tier holds it: pins, prewarm, prefetch), ``pin`` (into L1),
``evict`` (out of a tier and those above it), ``unload`` (out of the engine, for the callers
above that checked ``in_use``), ``drain`` (empty the engine and, optionally, the disk). The
engine is anything with the ``EngineSlots`` protocol (``engine_slots.py``).

Loading is single-flight per version (one fetch and one engine add however many requests
wait), bounded (a limit on concurrent fetches and on concurrent engine adds, and on how many
versions may be loading or queued), and deadline-aware: a request waits for its adapter only
as long as its tenant tier allows, and the load carries on after it gives up, so the next
request finds the adapter warm. Requests for adapters already in the engine never touch the
queue.

Integrity: a file that fails its seal at L3 is deleted and landed again from L4 (counted).
Bytes from L4 that fail the signed manifest quarantine the version on this node: it is
refused with a clear error, counted in ``adapter_integrity_failures_total{tier="L4"}`` and
written to the audit log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

from apps.registry.contracts import ResolvedVersion
from apps.registry.storage import ObjectStore
from apps.serving import offload
from apps.serving.cache.boarding import Boarding
from apps.serving.cache.book import TierBook
from apps.serving.cache.clock import Clock, monotonic
from apps.serving.cache.clock import timer as default_timer
from apps.serving.cache.disk import DiskTier
from apps.serving.cache.engine_slots import AdapterHandle, EngineSlots
from apps.serving.cache.engine_tiers import Owner
from apps.serving.cache.gate import DEFAULT_RULE, GateRule
from apps.serving.cache.landing import AdapterIntegrityError, Landing
from apps.serving.cache.limits import Limits
from apps.serving.cache.loads import LoadDeadline, LoadQueue, LoadQueueFull, Placed
from apps.serving.cache.policies import Policy, make_policy
from apps.serving.cache.versions import CachedVersion
from lorahub.cacheconfig import CacheConfig

__all__ = ["CacheManager", "Limits", "LoadDeadline", "LoadQueueFull", "Placed", "lora_id_for"]
logger = logging.getLogger(__name__)
GIB = 1024**3
MIB = 1024**2


def lora_id_for(resolved: ResolvedVersion) -> int:
    """The engine's LoRA id for a version: the registry's version id (positive, never reused,
    one per cache key)."""
    return resolved.version_id


class CacheManager:
    def __init__(
        self,
        *,
        engine: EngineSlots,
        store: ObjectStore,
        root: Path,
        public_keys: Callable[[], dict[str, str]],
        policy: Policy | None = None,
        limits: Limits | None = None,
        on_integrity_failure=None,
        on_evict: Callable[[str, int | None], None] | None = None,
        on_load: Callable[..., None] | None = None,
        clock: Clock = monotonic,
        timer: Clock = default_timer,
        gate_rule: GateRule = DEFAULT_RULE,
    ) -> None:
        self.engine = engine
        self.store = store
        self.disk = DiskTier(root)
        self.public_keys = public_keys
        self.on_integrity_failure = on_integrity_failure  # callable(resolved, tier, reason)
        self.on_evict = on_evict
        # callable(source tier, ms, bytes, boundaries=): once per load, however many wait
        self.on_load = on_load
        self.clock = clock  # for the tier rules (``book.py``)
        self.timer = timer  # for the durations a load reports
        self.book = TierBook(
            slots=lambda: (self.engine.settings.max_loras, self.engine.settings.max_cpu_loras),
            policy=policy or make_policy("weighted"),
            clock=clock,
            gate_rule=gate_rule,
        )
        self.landing = Landing(
            disk=self.disk,
            book=self.book,
            store=store,
            public_keys=public_keys,
            limits=lambda: self.limits,
            timer=timer,
            on_integrity_failure=on_integrity_failure,
            on_evict=on_evict,
        )
        # L3 (``landing.py``)
        self.adopt = self.landing.adopt
        self.land = self.landing.land
        self.trim_disk = self.landing.trim_disk
        self.evict_from_disk = self.landing.evict_from_disk
        self.disk_bytes = self.landing.disk_bytes
        self.versions = self.book.versions
        self.tiers = self.book.tiers
        self.on_disk = self.book.on_disk
        limits = limits or Limits()
        self.boarding = Boarding(self)  # a request's placement: prepare, then board
        self.prepare = self.boarding.prepare
        self.board = self.boarding.board
        self.stop_waiting = self.boarding.stop_waiting
        self.loads = LoadQueue(
            max_fetches=limits.max_fetches,
            max_loads=limits.max_loads,
            max_pending=limits.max_pending,
        )
        self._limits = limits
        self._owners: dict[int, tuple[str, Owner]] = {}  # tenant id -> (slug, latest quotas)
        self._adding: list[int] = []  # sizes of the versions on their way into the engine
        self._removing: set[asyncio.Future] = set()  # engine removals sent, not yet answered
        # engine loads by the step boundaries they cost before their request could run: 1
        # for a request's own load (``board``), 2 for an explicit add (``activate``)
        self.boundaries: dict[int, int] = {}
        self.waited_on_release = 0  # loads that found everything in the engine held

    # --- configuration ---------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        return self.book.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.book.policy = policy

    @property
    def limits(self) -> Limits:
        return self._limits

    @limits.setter
    def limits(self, limits: Limits) -> None:
        self._limits = limits
        self.loads.resize(
            max_fetches=limits.max_fetches,
            max_loads=limits.max_loads,
            max_pending=limits.max_pending,
        )

    def apply(self, config: CacheConfig) -> None:
        """Take a new configuration live: policy, caps, TTL and the load queue's limits.
        (The LoRA slot counts are the engine's and change only with a restart.)"""
        cache = config.adapter_cache
        wanted = make_policy(cache.gpu_hot.eviction_policy)
        if wanted.name != self.policy.name:  # the same policy keeps what it learned
            self.policy = wanted
        self.limits = Limits.from_config(config)

    @property
    def quarantined(self) -> set[int]:
        return self.versions.quarantined()

    @quarantined.setter
    def quarantined(self, version_ids: set[int]) -> None:
        self.versions.quarantine(set(version_ids))

    # --- L3 --------------------------------------------------------------------------------

    def _record(self, resolved: ResolvedVersion) -> CachedVersion:
        return self.versions.of(resolved.version_id, f"{resolved.tenant_slug}/{resolved.label}")

    # --- L2 / L1 ---------------------------------------------------------------------------

    def loading(self) -> int:
        return len(self.loads)

    def _use(
        self, resolved: ResolvedVersion, owner: Owner | None
    ) -> tuple[CachedVersion, Owner, AdapterHandle, float]:
        """The start of every placement: the version's record, its owner (remembered with
        its latest quotas), its engine handle, and the use counted (a learning policy counts
        every one), with when."""
        record = self._record(resolved)
        owner = owner or Owner(tenant_id=resolved.tenant_id)
        self._owners[resolved.tenant_id] = (resolved.tenant_slug, owner)
        return record, owner, self._handle(resolved), self.book.observe(record.version_id)

    async def activate(
        self,
        resolved: ResolvedVersion,
        *,
        owner: Owner | None = None,
        deadline_s: float | None = None,
        wait_for_room: bool = True,
        hold: bool = False,
    ) -> Placed:
        """Make the version usable by the engine; concurrent calls share one fetch and load.

        ``deadline_s``: how long to wait for a load (None: as long as it takes); on expiry
        ``LoadDeadline`` is raised and the load carries on. When ``max_pending`` versions are
        already loading, a new one waits for room (``wait_for_room``, within the deadline) or
        raises ``LoadQueueFull`` at once. With ``hold``, the version cannot leave the engine
        until ``release`` is called: a request generating with it holds it (vLLM's engine
        core dies when an adapter is removed under a running request).
        """
        record, owner, handle, started = self._use(resolved, owner)
        placed: Placed | None = None
        starter = False
        while True:
            if record.quarantined:
                raise AdapterIntegrityError(f"{resolved.label} is quarantined on this node")
            tier = self.book.use(record)  # the hot path: no queue, no lock, no I/O
            if tier is not None:
                if hold:
                    self.tiers.hold(record)
                if placed is not None:  # it was loaded for this request
                    return replace(placed, started=starter)
                return Placed(handle, tier, 0.0)
            joined = await self.loads.join(
                record,
                lambda: self._load(resolved, record, owner, handle),
                left=None if deadline_s is None else deadline_s - (self.clock() - started),
                wait_for_room=wait_for_room,
                what=f"{resolved.label} did not load within {(deadline_s or 0) * 1000:.0f} ms",
                waiting=(lambda on: self.tiers.await_load(record, on)) if hold else None,
            )
            if joined is not None:
                placed, started_it = joined
                starter = starter or started_it
            # back at the loop's top, with no await in between: the hold is taken while the
            # fresh version is still protected (an unheld load may have been evicted again)

    def release(self, version_id: int) -> None:
        """A request that held the version (``place(hold=True)``) is done with it."""
        record = self.versions.get(version_id)
        if record is not None:
            self.tiers.release(record)

    def in_use(self, version_id: int) -> int:
        record = self.versions.get(version_id)
        return record.held if record is not None else 0

    def _handle(self, resolved: ResolvedVersion) -> AdapterHandle:
        return AdapterHandle(
            lora_id=lora_id_for(resolved),
            name=f"{resolved.tenant_slug}/{resolved.label}",
            path=self.disk.folder(resolved),
        )

    async def _load(
        self, resolved: ResolvedVersion, record: CachedVersion, owner: Owner, handle: AdapterHandle
    ) -> Placed:
        started = self.timer()
        if self.disk.has(resolved):  # an L3 check is cheap: no fetch slot needed
            found = await offload.run(self.land, resolved)
        else:
            async with self.loads.fetch_slots.slot(resolved.size_bytes):  # in another process
                found = await offload.run(self.land, resolved)
        tier, timings = found.found_in, found.timings
        async with self.loads.load_slots.slot(resolved.size_bytes):
            # Room is made inside the slot: made before it, the loads waiting for a slot
            # would count as adding more versions than the engine holds, and the next one
            # would wait for a release that never comes. Its place is counted from here
            # until it is a resident (below), so that loads beside it make room for it too.
            removals = await self._make_room(owner, incoming=resolved.size_bytes)
            self._adding.append(resolved.size_bytes)
            add_started = self.timer()
            try:
                # The removals and the add go to the engine core together: it takes every
                # queued call between two steps, in the order sent, so the victims leave
                # before the newcomer arrives and the whole load waits for one boundary.
                await asyncio.gather(*removals, self.engine.add_adapter(handle))
            finally:
                self._adding.remove(resolved.size_bytes)
            timings["add_ms"] = (self.timer() - add_started) * 1000
        load_ms = (self.timer() - started) * 1000
        self.boundaries[2] = self.boundaries.get(2, 0) + 1
        self.book.admit(
            record,
            owner,
            size_bytes=resolved.size_bytes,
            reload_cost_ms=timings.get("check_ms", 0.0) + timings["add_ms"],
        )
        if self.on_load:
            self.on_load(tier, load_ms, resolved.size_bytes, boundaries=2)
        return Placed(handle, tier, load_ms, timings)

    async def _make_room(self, owner: Owner, incoming: int) -> list[Coroutine[Any, Any, bool]]:
        """Evict from the engine (L2, and so L1) until one more version fits its slot count,
        its memory cap and its tenant's warm quota, counting the versions other loads are
        adding. The policy picks; what is pinned, generating or awaited stays: with all of
        them so, wait until a request lets go. The victims are out of the books on return;
        the engine calls that take them out are returned, for the caller to send."""
        removals: list[Coroutine[Any, Any, bool]] = []
        waited = False
        while True:
            since = self.tiers.releases()
            victims = self.book.engine_victims(
                owner,
                incoming=incoming,
                warm_bytes=self.limits.warm_bytes,
                pressure=self.loads.pressure(),
                adding=self._adding,
            )
            if victims is None:
                # adding now would let vLLM evict one under a running request; what is out
                # of the books goes out of the engine before the wait, not after it
                await asyncio.gather(*removals)
                removals.clear()
                if not waited:
                    waited = True
                    self.waited_on_release += 1
                await self.tiers.wait_for_release(since)
                continue
            if not victims:
                return removals
            for victim in victims:
                removals.append(await self._take_out(victim.version_id))
                if self.on_evict:
                    self.on_evict("L2", victim.tenant_id)

    def expire(self) -> list[int]:
        """The unpinned versions idle in the engine longer than the TTL (to be removed)."""
        return self.book.expired(self.limits.ttl_s)

    async def pin(self, resolved: ResolvedVersion, *, owner: Owner | None = None) -> Placed:
        """Keep a version in the engine's device slots (L1).

        At most ``max_loras - 1`` versions are pinned, so one slot always rotates: with every
        slot pinned, vLLM kills its engine core on the next request for another adapter. A
        tenant pins at most its hot quota.
        """
        owner = owner or Owner(tenant_id=resolved.tenant_id)
        record = self._record(resolved)
        self.tiers.check_pin(record, owner, resolved)
        placed = await self.activate(resolved, owner=owner, hold=True)
        try:
            if record.pinned:
                return placed
            self.tiers.pending_pins += 1  # from now on the gate counts the slot as taken
            try:
                await self.tiers.gate.room_for_pin(record.version_id)
                await self.engine.pin_adapter(record.version_id)
                self.tiers.pin(record)
            finally:
                self.tiers.pending_pins -= 1
                await self.tiers.gate.changed()
            return Placed(placed.handle, "L1", placed.load_ms, placed.timings)
        finally:
            self.release(record.version_id)

    async def enter_engine(self, lora_id: int | None) -> None:
        """Wait until a request for ``lora_id`` may join the engine's batch (see gate.py)."""
        record = self.versions.get(lora_id) if lora_id is not None else None
        await self.tiers.gate.enter(lora_id, pinned=record is not None and record.pinned)

    def finishing_in_engine(self, lora_id: int | None) -> None:
        """A request for ``lora_id`` is on its last token (see ``DeviceGate.finishing``)."""
        self.tiers.gate.finishing(lora_id)

    def leave_engine(self, lora_id: int | None, *, finishing: bool = False) -> None:
        self.tiers.gate.leave(lora_id, finishing=finishing)

    def deprecate(self, version_id: int, deprecated: bool = True) -> None:
        """Mark a version an alias stopped using (or, with False, uses again): the policies
        evict deprecated versions first, from the engine and from disk."""
        record = self.versions.get(version_id)
        if record is None:
            return
        record.deprecated = deprecated  # its one copy: the tiers hand it to the policy

    def in_engine(self) -> int:
        return len(self.tiers.members)

    def holds(self, version_id: int) -> bool:
        """True if the version is in the engine (L1 or L2)."""
        return version_id in self.tiers.members

    def is_pinned(self, version_id: int) -> bool:
        record = self.versions.get(version_id)
        return record is not None and record.pinned

    async def unload(self, version_id: int) -> bool:
        """Take a version out of the engine (L1 and L2); its disk copy stays.

        Callers check ``in_use`` first: removing an adapter under a running request kills
        vLLM's engine core.
        """
        return await (await self._take_out(version_id))

    async def _take_out(self, version_id: int) -> Coroutine[Any, Any, bool]:
        """``unload``'s bookkeeping, done; its engine call, returned unsent."""
        if self.book.take_out(version_id):
            await self.tiers.gate.changed()  # its device slot rotates again
        return self.engine.remove_adapter(version_id)

    def busy(self, version_id: int) -> bool:
        """Loading into the engine, being landed on disk, or answering requests."""
        record = self.versions.get(version_id)
        return record is not None and record.busy

    # --- reporting -------------------------------------------------------------------------

    def forget_engine(self) -> None:
        """After an engine restart: nothing is in its slots any more (disk copies remain)."""
        self.tiers.forget()

    def hot_bytes(self) -> int:
        return self.tiers.hot_bytes()

    def residency_owner(self, version_id: int) -> int | None:
        """The tenant id of a version in the engine, or None."""
        record = self.tiers.members.get(version_id)
        return record.engine.tenant_id if record is not None and record.engine else None

    def residency(self) -> dict[int, tuple[int, int]]:
        """Per tenant id: versions in the device slots (L1) and in the engine (L1 + L2)."""
        return self.tiers.residency()
