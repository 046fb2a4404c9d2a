"""What the cache holds, for ``/internal/cache``, the console and the node's metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from apps.serving.cache.policies import Resident, rank
from apps.serving.cache.versions import CachedVersion, State

if TYPE_CHECKING:
    from apps.serving.cache.manager import CacheManager


def _row(cache: CacheManager, record: CachedVersion, r: Resident, now: float) -> dict:
    return {
        "version_id": record.version_id,
        "key": record.name or str(record.version_id),
        "tenant_id": r.tenant_id,
        "size_bytes": r.size_bytes,
        "hits": round(r.decayed_hits(now), 2),
        "idle_s": round(now - r.last_used, 1),
        "reload_cost_ms": round(r.reload_cost_ms, 2),
        "pinned": record.pinned,
        "deprecated": record.deprecated,
        "score": round(cache.policy.score(r, now), 3),
        "state": str(record.state),
    }


def residents(cache: CacheManager) -> dict[str, list[dict]]:
    now = cache.clock()
    device = cache.tiers.device_set()
    engine = [
        (rec, rec.engine._replace(deprecated=rec.deprecated))
        for rec in cache.tiers.members.values()
        if rec.engine
    ]
    rank([r for _, r in engine], policy=cache.policy, now=now)  # scales for scores
    engine_rows = [_row(cache, record, r, now) for record, r in engine]
    disk = [
        (rec, rec.disk._replace(deprecated=rec.deprecated))
        for rec in list(cache.on_disk.members.values())
        if rec.disk
    ]
    rank([r for _, r in disk], policy=cache.policy, now=now)
    disk_rows = []
    for record, r in disk:
        row = _row(cache, record, r, now)
        folder = record.folder
        row["folder"] = folder.relative_to(cache.disk.root).as_posix() if folder else ""
        disk_rows.append(row)
    loading = [
        {"version_id": record.version_id, "key": record.name, "state": str(State.LOADING)}
        for record in list(cache.loads.members.values())
    ]
    return {
        "L1": [row for row in engine_rows if row["version_id"] in device],
        "L2": [row for row in engine_rows if row["version_id"] not in device],
        "L3": disk_rows,
        "loading": loading,
    }


def quota_usage(cache: CacheManager) -> dict[str, float]:
    """Per tenant slug: versions in the engine (L1 + L2) as a share of its warm quota."""
    counts = cache.tiers.per_tenant()
    usage = {}
    for tenant_id, (slug, owner) in cache._owners.items():
        if owner.warm_quota:
            usage[slug] = counts.get(tenant_id, 0) / owner.warm_quota
    return usage
