"""The node's own request log as a trace (the seed's log replay), its export, and the load
costs the node measured."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import numpy as np
from django.db.models import Max, Sum

from apps.registry.models import AdapterVersion
from apps.serving.replay.simulate import Costs
from apps.serving.replay.traces import Trace, from_rows
from apps.telemetry.histograms import bucket_fields, quantile
from apps.telemetry.models import PlatformRollup, RequestLog
from apps.tenants.errors import Invalid
from apps.tenants.models import Tenant


def _window(since_hours: float, tenant: str | None):
    if since_hours <= 0:
        raise Invalid("--since must be more than 0 hours")
    rows = RequestLog.objects.filter(
        at__gte=datetime.now(UTC) - timedelta(hours=since_hours),
        tenant__isnull=False,
        tier__in=("L1", "L2", "L3", "L4"),  # requests that used an adapter
    )
    if tenant:
        found = Tenant.objects.filter(slug=tenant).first()
        if found is None:
            raise Invalid(f"there is no tenant '{tenant}'")
        rows = rows.filter(tenant=found)
    return rows.order_by("at", "id")


def log_rows(*, since_hours: float = 24.0, tenant: str | None = None) -> Iterator[dict]:
    """The logged requests that used an adapter, in ``traces.EXPORT_FIELDS``, in the order
    they arrived (``at``: the arrival; ``duration_ms``: until the last byte).

    The log stamps a request when it ends, so it is read in that order and put back in
    arrival order through a buffer of the requests that may still be overtaken: a request
    that ends at ``t`` arrived after ``t`` minus the longest logged duration."""
    versions: dict[tuple[int, str, str], tuple[int, int]] = {}
    priorities = dict(Tenant.objects.values_list("id", "priority"))
    slugs = dict(Tenant.objects.values_list("id", "slug"))
    window = _window(since_hours, tenant)
    longest = timedelta(milliseconds=window.aggregate(m=Max("total_ms"))["m"] or 0.0)
    waiting: list[tuple[datetime, int, dict]] = []  # by arrival, then log order
    rows = window.values_list(
        "at", "tenant_id", "alias", "adapter_id", "version", "tier", "total_ms"
    ).iterator(chunk_size=5000)
    for number, (ended, tenant_id, alias, adapter_id, version, tier, total_ms) in enumerate(rows):
        while waiting and waiting[0][0] < ended - longest:  # nothing later arrives before it
            yield heapq.heappop(waiting)[2]
        key = (tenant_id, adapter_id, version)
        if key not in versions:
            found = (
                AdapterVersion.objects.filter(
                    adapter__tenant_id=tenant_id, adapter__adapter_id=adapter_id, version=version
                )
                .values_list("id", "size_bytes")
                .first()
            )
            versions[key] = (found[0], found[1] or 0) if found else (0, 0)
        version_id, size = versions[key]
        if not version_id:
            continue  # a version since deleted from the registry (never happens; be safe)
        arrived = ended - timedelta(milliseconds=total_ms)
        row = {
            "at": arrived.isoformat(),
            "tenant": slugs.get(tenant_id, str(tenant_id)),
            "alias": alias,
            "version_id": version_id,
            "version": f"{adapter_id}@{version}",
            "size_bytes": size,
            "priority": priorities.get(tenant_id, 1),
            "tier": tier,
            "duration_ms": round(total_ms, 3),
        }
        heapq.heappush(waiting, (arrived, number, row))
    while waiting:
        yield heapq.heappop(waiting)[2]


def trace_from_log(*, since_hours: float = 24.0, tenant: str | None = None) -> Trace:
    scope = f"tenant {tenant}" if tenant else "all tenants"
    return from_rows(
        log_rows(since_hours=since_hours, tenant=tenant),
        name="request-log",
        description=f"this platform's request log, last {since_hours:g} h, {scope}",
    )


def costs_from_log(*, since_hours: float = 24.0, base: Costs | None = None) -> Costs:
    """Per-tier load costs as the nodes measured them: the median load time of L3 and of L4
    loads from the platform-wide load histograms over the window (a fixed cost per tier;
    per-MB terms set to 0), and the median TTFT of L1 hits in the request log as the base
    TTFT. Tiers the nodes have not measured keep ``base``'s (default: ``Costs()``, the
    medians of bench/load_tiers.py)."""
    base = base or Costs()
    since = datetime.now(UTC) - timedelta(hours=since_hours)
    # hourly rows: the whole window at most a few hours coarse at its start, 2,160 rows for
    # 90 days; the request log is kept for days, the rollups for months
    hours = PlatformRollup.objects.filter(step_s=3600, start__gte=since)
    names = {tier: bucket_fields(f"load_{tier}") for tier in ("l3", "l4")}
    sums = hours.aggregate(**{f: Sum(f) for fields in names.values() for f in fields})

    def median_load(tier: str) -> float | None:
        counts = [sums[f] or 0 for f in names[tier]]
        return quantile(counts, 0.5) if sum(counts) else None

    hits = RequestLog.objects.filter(at__gte=since, tier="L1", status=200, ttft_ms__isnull=False)
    ttfts = [float(v) for v in hits.values_list("ttft_ms", flat=True)[:100_000] if v is not None]
    ttft = float(np.median(ttfts)) if ttfts else None
    l3, l4 = median_load("l3"), median_load("l4")
    l3_fixed = l3 if l3 is not None else base.l3_ms
    measured = [what for what, v in (("L1 TTFT", ttft), ("L3", l3), ("L4", l4)) if v is not None]
    return Costs(
        base_ttft_ms=ttft if ttft is not None else base.base_ttft_ms,
        l2_ms=base.l2_ms,
        l3_ms=l3 if l3 is not None else base.l3_ms,
        l3_ms_per_mb=0.0 if l3 is not None else base.l3_ms_per_mb,
        l4_ms=max(l4 - l3_fixed, 0.0) if l4 is not None else base.l4_ms,
        l4_ms_per_mb=0.0 if l4 is not None else base.l4_ms_per_mb,
        source=(
            f"measured by the nodes over the last {since_hours:g} h ({', '.join(measured)})"
            + ("" if len(measured) == 3 else "; the rest bench/load_tiers.py's")
            if measured
            else base.source
        ),
    )
