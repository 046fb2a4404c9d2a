"""Prewarming: warm what will be asked for before it is asked for."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.db import close_old_connections
from django.db.models import Count, Q, Sum

from apps.registry.contracts import ResolvedVersion
from apps.registry.models import AdapterVersion
from apps.registry.snapshots import load_alias_snapshot, load_version
from apps.serving import offload
from apps.serving.cache.manager import CacheManager
from apps.serving.node.config_in_force import ConfigInForce
from apps.serving.node.engine import Engine
from apps.serving.node.trust import Trust
from apps.telemetry.models import RequestLog, RequestMinute
from apps.tenants.models import Tenant
from lorahub.cacheconfig import CacheConfig

logger = logging.getLogger(__name__)


def prewarm_candidates(config: CacheConfig, node: str = "") -> list[ResolvedVersion]:
    """What a node warms at start: the configured aliases' stable versions, then the versions
    most requested in the last ``from_stats_hours``, most requested first, without repeats.
    In a fleet, "most requested" is what this ``node`` answered (its own request log: the
    router sends it the same adapters again after a restart); a node without history there
    falls back to the whole fleet's counts. Unknown tenants or aliases in the list are logged
    and skipped. The busiest versions' ids come from one query, not one per row."""
    prewarm = config.adapter_cache.prewarm
    chosen: dict[int, ResolvedVersion] = {}
    try:
        for entry in prewarm.aliases:
            slug, name = entry.split("/")
            tenant = Tenant.objects.filter(slug=slug).first()
            snapshot = load_alias_snapshot(tenant_id=tenant.id, name=name) if tenant else None
            if snapshot is None:
                logger.warning("prewarm: no alias %r; check the cache config's list", entry)
                continue
            chosen.setdefault(snapshot.stable.version_id, snapshot.stable)
        if prewarm.from_stats_hours > 0 and prewarm.top > 0:
            for version_id in _busiest(prewarm.from_stats_hours, prewarm.top, node):
                resolved = load_version(version_id)
                if resolved is not None:
                    chosen.setdefault(resolved.version_id, resolved)
    finally:
        close_old_connections()
    return list(chosen.values())


def _busiest(hours: float, top: int, node: str) -> list[int]:
    """The ids of the ``top`` versions most requested in the last ``hours``, busiest first."""
    since = datetime.now(UTC) - timedelta(hours=hours)
    fields = ("tenant_id", "adapter_id", "version")
    rows = []
    if node:  # what this node answered
        rows = list(
            RequestLog.objects.filter(at__gte=since, node=node, tenant__isnull=False)
            .exclude(adapter_id="")
            .values(*fields)
            .annotate(n=Count("id"))
            .order_by("-n")[:top]
        )
    if not rows:  # a node without history: the whole fleet's counts
        rows = list(
            RequestMinute.objects.filter(minute__gte=since, tenant__isnull=False)
            .exclude(adapter_id="")
            .values(*fields)
            .annotate(n=Sum("requests"))
            .order_by("-n")[:top]
        )
    if not rows:
        return []
    match = Q()
    for row in rows:
        match |= Q(
            adapter__tenant_id=row["tenant_id"],
            adapter__adapter_id=row["adapter_id"],
            version=row["version"],
        )
    ids = {
        (tenant, adapter, version): pk
        for pk, tenant, adapter, version in AdapterVersion.objects.filter(match).values_list(
            "pk", "adapter__tenant_id", "adapter__adapter_id", "version"
        )
    }
    found = (ids.get((r["tenant_id"], r["adapter_id"], r["version"])) for r in rows)
    return [pk for pk in found if pk is not None]


class Prewarm:
    def __init__(
        self,
        *,
        config: ConfigInForce,
        trust: Trust,
        cache: CacheManager,
        engine: Engine,
        node_name: str,
    ) -> None:
        self.config, self.trust, self.cache, self.engine = config, trust, cache, engine
        self.node_name = node_name

    async def run(self) -> list[str]:
        """The most-requested versions of the last hours and the configured aliases: each
        lands on disk (L3); while the engine's host cache has room they are loaded (L2) too.
        Nothing is evicted for a guess. Returns the labels warmed."""
        warmed: list[str] = []
        try:
            candidates = await offload.run(prewarm_candidates, self.config.config, self.node_name)
        except Exception:
            logger.warning("could not read what to prewarm", exc_info=True)
            return warmed
        for resolved in candidates:
            try:
                await self.trust.admit(resolved)
                room = self.cache.in_engine() < self.engine.settings.max_cpu_loras
                if room and self.engine.is_ready:
                    await self.cache.activate(resolved)
                else:
                    await offload.run(self.cache.land, resolved)
                warmed.append(resolved.label)
            except Exception as exc:  # one bad candidate must not stop the rest
                logger.info("did not prewarm %s: %s", resolved.label, exc)
        if warmed:
            logger.info("prewarmed %d versions: %s", len(warmed), ", ".join(warmed))
        return warmed
