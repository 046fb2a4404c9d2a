"""The tier rules, once: what a use changes, where a version is, and what must go.

``TierBook`` is synchronous and does no I/O: it holds one record per version (``versions.py``)
indexed by the engine tiers (L1/L2, ``engine_tiers.py``) and the disk index (L3,
``disk.DiskIndex``), the eviction policy, and a clock (``clock.py``). Every decision about
placement is one of its methods, and each returns what to do rather than doing it:

- ``use``: a request for a version; the tier it was found in, if in the engine.
- ``engine_victims``: what must leave the engine for one more version (``[]``: it fits;
  ``None``: everything there is pinned or generating, so the load waits for a release).
- ``take_out``: a version leaves the engine (its use carries down to L3).
- ``admit``: a loaded version enters the engine.
- ``landed``: one more use of a version's L3 copy (just landed, or checked for a load).
- ``disk_victims``: the L3 folders that go to free some bytes.
- ``expired``: the versions idle in the engine past the TTL.

Two callers carry the decisions out: the node's cache manager (``manager.py``) against vLLM,
the local disk and the registry, on the monotonic clock; and the replay
(``replay/simulate.py``) against load costs, on the virtual clock of its event loop. So a
replay decides as the node does (``tests/serving/replay/test_replay_equivalence.py`` compares
them request by request, under every policy).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

from apps.serving.cache.clock import Clock, monotonic
from apps.serving.cache.disk import DiskIndex
from apps.serving.cache.engine_tiers import EngineTiers, Owner
from apps.serving.cache.gate import DEFAULT_RULE, GateRule
from apps.serving.cache.policies import Policy, Resident
from apps.serving.cache.versions import CachedVersion, Versions


class TierBook:
    def __init__(
        self,
        *,
        slots: Callable[[], tuple[int, int]],
        policy: Policy,
        clock: Clock = monotonic,
        gate_rule: GateRule = DEFAULT_RULE,
    ) -> None:
        self.clock = clock
        self.policy = policy
        self.versions = Versions()
        self.tiers = EngineTiers(slots, clock=clock, gate_rule=gate_rule)  # L1, L2
        self.on_disk = DiskIndex()  # L3

    # --- a request ---------------------------------------------------------------------------

    def observe(self, version_id: int) -> float:
        """Every request, before anything else: a learning policy counts each use."""
        now = self.clock()
        self.policy.observe(version_id, now)
        return now

    def use(self, record: CachedVersion) -> str | None:
        """A request for ``record``: if it is in the engine, the tier it was found in (L1 or
        L2, before this use) and the use recorded; None if it must be loaded first."""
        if record.engine is None:
            return None
        tier = self.tiers.tier_of(record)
        self.tiers.touch(record, self.clock(), self.policy.half_life_s)
        return tier

    # --- L1 / L2 -----------------------------------------------------------------------------

    def engine_victims(
        self,
        owner: Owner,
        *,
        incoming: int,
        warm_bytes: int | None,
        pressure: float,
        adding: Collection[int] = (),
    ) -> list[Resident] | None:
        """What must leave the engine for one more version of ``owner`` (``incoming`` bytes),
        beside the versions of sizes ``adding`` other loads are adding. Each victim is told to
        the policy (``on_evict``); the caller takes each out (``take_out``)."""
        victims = self.tiers.victims(
            owner,
            incoming=incoming,
            policy=self.policy,
            warm_bytes=warm_bytes,
            pressure=pressure,
            adding=adding,
        )
        for victim in victims or ():
            self.policy.on_evict(victim, self.clock())
        return victims

    def take_out(self, version_id: int) -> bool:
        """The version leaves the engine (L1 and L2); its use carries down to its L3 copy.
        True if it was pinned (its device slot rotates again)."""
        record = self.versions.of(version_id)
        was_pinned = self.tiers.unpin(record)
        self.tiers.drop(record)
        return was_pinned

    def admit(
        self, record: CachedVersion, owner: Owner, *, size_bytes: int, reload_cost_ms: float
    ) -> None:
        """A loaded version enters the engine, with the use its L3 copy has seen."""
        on_disk = record.disk  # its use so far, this load's included
        self.tiers.add(
            record,
            Resident(
                version_id=record.version_id,
                tenant_id=owner.tenant_id,
                size_bytes=size_bytes,
                last_used=self.clock(),
                hits=on_disk.hits if on_disk is not None else 1.0,
                reload_cost_ms=reload_cost_ms,
                tenant_priority=owner.priority,
            ),
        )

    def expired(self, ttl_s: float) -> list[int]:
        """The versions idle in the engine longer than ``ttl_s`` that may leave now."""
        cutoff = self.clock() - ttl_s
        return [record.version_id for record in self.tiers.idle_since(cutoff)]

    # --- L3 ----------------------------------------------------------------------------------

    def landed(
        self,
        record: CachedVersion,
        *,
        tenant_id: int,
        size_bytes: int,
        folder: Path | None,
        reload_ms: float | None = None,
        priority: int = 1,
    ) -> None:
        """One more use of the version's L3 copy (just landed: ``reload_ms``, what landing
        it cost; or checked for a load)."""
        now = self.clock()
        known = record.disk or Resident(
            version_id=record.version_id,
            tenant_id=tenant_id,
            size_bytes=size_bytes,
            last_used=now,
            tenant_priority=priority,
        )
        known = known.touched(now, self.policy.half_life_s)
        if reload_ms is not None:
            known = known._replace(reload_cost_ms=reload_ms)
        self.on_disk.add(record, known, folder)

    def disk_victims(self, need_bytes: int, *, keep: Collection[int]) -> list[Resident]:
        """The L3 copies that go, lowest value first, to free ``need_bytes`` (or as many as
        may: not what is in the engine, busy, or in ``keep``). Each is told to the policy and
        dropped from the index; the caller removes the folders (``record.folder`` before)."""
        victims = self.on_disk.victims(need_bytes, keep=keep, policy=self.policy, now=self.clock())
        for victim in victims:
            self.policy.on_evict(victim, self.clock())
        return victims

    def drop_from_disk(self, version_id: int) -> Path | None:
        """Out of the L3 index; returns the folder it had (for the caller to remove)."""
        return self.on_disk.drop(self.versions.of(version_id))
