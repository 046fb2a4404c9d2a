"""Tenants' guaranteed shares of a tier, and the per-tenant count a cache keeps of it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from apps.serving.cache.policies.base import Resident


def guaranteed_shares(capacity: int, priorities: Mapping[int, int]) -> dict[int, int]:
    """Slots each tenant keeps however hard others burst: half the capacity is split in
    proportion to (priority + 1) among the tenants that have residents; the other half is
    free for whoever needs it. A tenant's share is at least 1 when capacity allows."""
    if not priorities or capacity <= 0:
        return {}
    total = sum(p + 1 for p in priorities.values())
    return {tenant: _share(capacity, len(priorities), p, total) for tenant, p in priorities.items()}


def _share(capacity: int, tenants: int, priority: int, total_weight: int) -> int:
    reserved = capacity // 2
    return max(
        1 if reserved >= tenants else 0, math.floor(reserved * (priority + 1) / total_weight)
    )


@dataclass
class Census:
    """Residents per tenant and each such tenant's priority, for a cache that keeps them up
    to date itself (the replay) instead of recounting on every eviction."""

    counts: dict[int, int] = field(default_factory=dict)
    priorities: dict[int, int] = field(default_factory=dict)
    weight: int = 0  # sum of (priority + 1) over the tenants with residents
    total: int = 0

    @classmethod
    def of(cls, residents: Iterable[Resident]) -> Census:
        census = cls()
        for r in residents:
            census.add(r)
        return census

    def add(self, r: Resident) -> None:
        count = self.counts.get(r.tenant_id, 0)
        if count == 0:
            self.priorities[r.tenant_id] = r.tenant_priority
            self.weight += r.tenant_priority + 1
        self.counts[r.tenant_id] = count + 1
        self.total += 1

    def remove(self, r: Resident) -> None:
        count = self.counts[r.tenant_id] - 1
        self.total -= 1
        if count:
            self.counts[r.tenant_id] = count
        else:
            del self.counts[r.tenant_id]
            self.weight -= self.priorities.pop(r.tenant_id) + 1

    def share(self, tenant: int, capacity: int) -> int:
        """The tenant's guaranteed share (``guaranteed_shares``) among the current residents."""
        if tenant not in self.priorities or capacity <= 0:
            return 0
        return _share(capacity, len(self.priorities), self.priorities[tenant], self.weight)
