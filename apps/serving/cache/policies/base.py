"""What every eviction policy is: a pure object that scores cache residents (``Resident``)
and never touches the engine. ``Policy`` says everything a caller may ask of one, so no
caller needs to know which policy it holds."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable
from typing import NamedTuple, Protocol

HALF_LIFE_S = 600.0  # access frequency halves every 10 idle minutes


class Resident(NamedTuple):
    """What a policy knows about one cached adapter version (immutable; a NamedTuple, not a
    frozen dataclass: a replay creates one per access, and this is 3x cheaper to build)."""

    # the cache key: on a node, the version id, which stands for the whole key (tenant,
    # adapter, version, base-model revision), since the registry gives each one id; in a
    # replay, the adapter's index
    version_id: int
    tenant_id: int
    size_bytes: int
    last_used: float  # seconds, any monotonic clock
    hits: float = 0.0  # decayed access count, as of ``last_used``
    reload_cost_ms: float = 0.0  # measured time to bring it back from the tier below
    tenant_priority: int = 1
    deprecated: bool = False  # set from the version's record when it is handed to a policy
    pinned: bool = False

    def decayed_hits(self, now: float, half_life_s: float = HALF_LIFE_S) -> float:
        return self.hits * math.pow(0.5, max(0.0, now - self.last_used) / half_life_s)

    def touched(self, now: float, half_life_s: float = HALF_LIFE_S) -> Resident:
        """The resident after one more access at ``now`` (its count decayed to ``now``)."""
        idle = now - self.last_used  # (decayed_hits, inlined: a replay calls this per request)
        hits = self.hits * 2.0 ** (-idle / half_life_s) if idle > 0 else self.hits
        return Resident(
            self.version_id,
            self.tenant_id,
            self.size_bytes,
            now,
            hits + 1.0,
            self.reload_cost_ms,
            self.tenant_priority,
            self.deprecated,
            self.pinned,
        )


class TenantCounts(Protocol):
    """How many residents each tenant has, and the share a tenant keeps (``shares.Census``)."""

    counts: dict[int, int]

    def share(self, tenant: int, capacity: int) -> int: ...


class Policy:
    """What every policy is and what a caller may ask of one, so that no caller needs to know
    which policy it holds. A policy scores (``score``) and hears of evictions (``on_evict``);
    the other steps default to nothing, for the policies that need no more."""

    name: str  # unique among the shipped policies; the cache configuration's name for it
    half_life_s: float  # how fast the access counts it reads decay
    active = 0  # which of ``settings()`` decides now (0 for a policy of one setting)

    def score(self, resident: Resident, now: float, pressure: float = 0.0) -> float:
        """Higher: evict sooner."""
        raise NotImplementedError

    def on_evict(self, resident: Resident, now: float) -> None:
        """``resident`` was evicted (GDSF's clock rises)."""
        return None

    def settings(self) -> tuple[Policy, ...]:
        """The settings the policy chooses between, each a policy of its own (itself, for a
        policy of one setting): a cache may keep each one's order at hand (the replay does)."""
        return (self,)

    def retention_key(self) -> Callable[[Resident], float] | None:
        """A time-invariant key whose order is the eviction order (lowest first), for a cache
        that keeps residents in a heap instead of scoring them on every miss; None when the
        order changes with time."""
        return None

    def prepare(self, residents: list[Resident], now: float) -> None:
        """Before ranking ``residents`` (a policy that normalizes over them does it here)."""
        return None

    def observe(self, key: int, now: float) -> None:
        """One request for version ``key``, served from any tier (a learning policy counts
        it)."""
        return None

    def describe(self) -> dict | None:
        """What the policy has learned, for ``/internal/cache``; None when it learns nothing."""
        return None

    def learn_from_eviction(
        self,
        chosen: Resident,
        residents: Collection[Resident],
        *,
        now: float,
        capacity: int,
        requester: int | None,
        census: TenantCounts,
        orders: Callable[[int], Iterable[Resident]] | None,
    ) -> None:
        """The explicit learning step, after ``select_victims`` chose ``chosen`` first among
        ``residents``: the only place a policy changes because of a decision."""
        return None
