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


MB = 1048576
MIN_LOADS = 5  # loads of a tier before its measured cost replaces the default


def fit_cost(loads: list[tuple[int, float]]) -> tuple[float, float] | None:
    """``(fixed ms, ms per MB)`` of a tier from its loads' ``(bytes, ms)``: a line through
    each version's median (weighted by its loads), so one slow load does not tilt it. With
    sizes too alike to tell a slope (spread under 10 %) or a slope below 0, the median alone
    (per MB 0). None with fewer than ``MIN_LOADS`` loads."""
    if len(loads) < MIN_LOADS:
        return None
    by_size: dict[int, list[float]] = {}
    for size, took in loads:
        by_size.setdefault(size, []).append(took)
    mb = np.array([size / MB for size in by_size])
    ms = np.array([float(np.median(v)) for v in by_size.values()])
    weight = np.array([len(v) for v in by_size.values()], dtype=float)
    median = float(np.median([m for _, m in loads]))
    if len(mb) < 2 or np.ptp(mb) < 0.1 * max(float(mb.mean()), 1e-9):
        return median, 0.0
    per_mb, fixed = (float(x) for x in np.polyfit(mb, ms, 1, w=np.sqrt(weight)))
    if per_mb < 0:
        return median, 0.0
    return max(float(fixed), 0.0), float(per_mb)


def _measured_loads(since) -> dict[str, list[tuple[int, float]]]:
    """Each logged load's version size and own work (``load_work_ms``), by tier."""
    rows = RequestLog.objects.filter(
        at__gte=since, tier__in=("L3", "L4"), load_work_ms__gt=0
    ).values_list("tier", "tenant_id", "adapter_id", "version", "load_work_ms")
    sizes: dict[tuple, int] = {}
    loads: dict[str, list[tuple[int, float]]] = {"L3": [], "L4": []}
    for tier, tenant_id, adapter_id, version, ms in rows[:100_000]:
        key = (tenant_id, adapter_id, version)
        if key not in sizes:
            sizes[key] = (
                AdapterVersion.objects.filter(
                    adapter__tenant_id=tenant_id, adapter__adapter_id=adapter_id, version=version
                )
                .values_list("size_bytes", flat=True)
                .first()
                or 0
            )
        if sizes[key] and ms is not None:
            loads[tier].append((sizes[key], float(ms)))
    return loads


def costs_from_log(*, since_hours: float = 24.0, base: Costs | None = None) -> Costs:
    """Per-tier load costs as the nodes measured them.

    Where the request log has the loads' own work (``load_work_ms``: fetch, verify or check,
    engine add, without waits for a slot, which the replay models itself) for at least
    ``MIN_LOADS`` loads of a tier, its cost is fixed + per MB fitted to them (``fit_cost``):
    L3 = check + add; L4 = the landing (its fixed part is the first byte and the request's
    overhead) on top of L3's. Else the median of the platform-wide load histograms (fixed
    only). The base TTFT is the median TTFT of L1 hits. Tiers the nodes have not measured keep
    ``base``'s (default: ``Costs()``, the medians of bench/load_tiers.py)."""
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
    loads = _measured_loads(since)
    fitted = {tier: fit_cost(loads[tier]) for tier in ("L3", "L4")}
    l3_hist, l4_hist = median_load("l3"), median_load("l4")
    if fitted["L3"] is not None:
        l3 = fitted["L3"]
    elif l3_hist is not None:
        l3 = (l3_hist, 0.0)
    else:
        l3 = (base.l3_ms, base.l3_ms_per_mb)
    if fitted["L4"] is not None:  # the landing, on top of L3's check and add
        fixed, per_mb = fitted["L4"]
        l4 = (max(fixed - l3[0], 0.0), max(per_mb - l3[1], 0.0))
    elif l4_hist is not None:
        l4 = (max(l4_hist - l3[0], 0.0), 0.0)
    else:
        l4 = (base.l4_ms, base.l4_ms_per_mb)
    measured = ["L1 TTFT"] if ttft is not None else []
    for tier, histogram in (("L3", l3_hist), ("L4", l4_hist)):
        if fitted[tier] is not None:
            measured.append(f"{tier} fitted to {len(loads[tier])} loads' bytes and times")
        elif histogram is not None:
            measured.append(f"{tier} from the load histograms")
    return Costs(
        base_ttft_ms=ttft if ttft is not None else base.base_ttft_ms,
        l2_ms=base.l2_ms,
        l3_ms=l3[0],
        l3_ms_per_mb=l3[1],
        l4_ms=l4[0],
        l4_ms_per_mb=l4[1],
        source=(
            f"measured by the nodes over the last {since_hours:g} h ({', '.join(measured)})"
            + ("" if len(measured) == 3 else "; the rest bench/load_tiers.py's")
            if measured
            else base.source
        ),
    )
