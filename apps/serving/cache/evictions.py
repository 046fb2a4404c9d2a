"""Taking versions out on purpose: the TTL sweep, an operator's eviction from one tier, a
version no alias uses any more, and draining a node. Each is counted as an eviction from the
tier it left (``on_evict``); callers check ``busy`` first where the docstring says so."""

from __future__ import annotations

from typing import TYPE_CHECKING

from apps.registry.contracts import ResolvedVersion
from apps.serving import offload

if TYPE_CHECKING:
    from apps.serving.cache.manager import CacheManager


async def expire_idle(cache: CacheManager) -> int:
    expired = cache.expire()
    for version_id in expired:
        tenant_id = cache.residency_owner(version_id)
        await cache.unload(version_id)
        if cache.on_evict:
            cache.on_evict("L2", tenant_id)
    return len(expired)


async def evict(cache: CacheManager, resolved: ResolvedVersion, tier: str) -> None:
    """Take ``resolved`` out of ``tier``, counted as an eviction from it. Callers check
    ``busy`` first (see ``unload``).

    L1 unpins it (vLLM cannot unpin: it leaves the engine and comes back unpinned, in
    L2); L2 takes it out of the engine (L1 too); L3 takes it off this node's disk as well.
    """
    if tier == "L1":
        if cache.is_pinned(resolved.version_id):
            await cache.unload(resolved.version_id)
            await cache.activate(resolved)
    else:
        await cache.unload(resolved.version_id)
        if tier == "L3":
            await offload.run(cache.evict_from_disk, resolved)
    if cache.on_evict:
        cache.on_evict(tier, resolved.tenant_id)


async def evict_unused(cache: CacheManager, version_id: int) -> bool:
    """Take a version out of the engine if it is there and no request is using it,
    counted as an eviction from L2; its disk copy stays. True if it left."""
    if not cache.holds(version_id) or cache.in_use(version_id):
        return False
    tenant_id = cache.residency_owner(version_id)
    await cache.unload(version_id)
    if cache.on_evict:
        cache.on_evict("L2", tenant_id)
    return True


async def drain(cache: CacheManager, *, disk: bool) -> int:
    """Empty the engine's adapter slots (L1, L2) and, with ``disk``, L3 too: an operator
    draining a node. Loads under way finish. Returns the number of versions removed."""
    removed = 0
    for record in list(cache.tiers.members.values()):
        if record.held:  # generating: it stays (TTL and policy take it later)
            continue
        await cache.unload(record.version_id)
        removed += 1
    if disk:  # what is still in the engine, loading or landing keeps its folder
        for record in list(cache.on_disk.members.values()):
            if record.engine is not None or record.busy:
                continue
            folder = cache.on_disk.drop(record)
            if folder is not None:
                await offload.run(cache.disk.remove, folder)
            removed += 1
    return removed
