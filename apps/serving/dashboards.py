"""What the dashboards plot, read from the per-minute rollups (``RequestMinute``).

Every series is one grouped SQL query: sums of counters and of histogram buckets per time
step, so a page costs the same whether a tenant made ten requests or ten million. Ranges
are downsampled to at most ~2,000 points (a week of minutes becomes 5-minute steps).
Percentiles come from the summed buckets (``histograms.quantile``), never from averages.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import F, Max, Q, Sum
from django.db.models.functions import TruncHour

from apps.registry.choices import AliasAction
from apps.registry.models import Alias, AliasEvent
from apps.serving.histograms import HISTOGRAMS, bucket_fields, quantile
from apps.serving.models import RequestMinute
from apps.tenants.models import Tenant


@dataclass(frozen=True)
class Range:
    key: str
    label: str
    span: timedelta
    step: timedelta


RANGES = {
    r.key: r
    for r in (
        Range("hour", "Last hour", timedelta(hours=1), timedelta(minutes=1)),
        Range("day", "Last day", timedelta(days=1), timedelta(minutes=1)),
        Range("week", "Last week", timedelta(days=7), timedelta(minutes=5)),
        Range("90d", "Last 90 days", timedelta(days=90), timedelta(hours=1)),
    )
}
DEFAULT_RANGE = "day"
TIERS = ("l1", "l2", "l3", "l4")
COUNTERS = ("requests", "errors", "degraded", *(f"hits_{t}" for t in TIERS))
BUCKETS = {name: bucket_fields(name) for name in HISTOGRAMS}


def _sums() -> dict:
    fields = [*COUNTERS, *(f for names in BUCKETS.values() for f in names)]
    return {**{f: Sum(f) for f in fields}, "ttft_max": Max("ttft_ms_max")}


def _buckets(row: dict, name: str) -> list[int]:
    return [row.get(f) or 0 for f in BUCKETS[name]]


def _floor(moment: datetime, step: timedelta) -> datetime:
    seconds = int(moment.timestamp())
    return datetime.fromtimestamp(seconds - seconds % int(step.total_seconds()), UTC)


def scope(*, tenant: Tenant | None = None, adapter_id: str = "") -> Q:
    q = Q()
    if tenant is not None:
        q &= Q(tenant=tenant)
    if adapter_id:
        q &= Q(adapter_id=adapter_id)
    return q


def series(where: Q, rng: Range, *, now: datetime | None = None) -> dict:
    """Per time step over ``rng``: requests, errors, hit rate per tier, TTFT p50/p95/p99,
    load latency p50/p95 from L3 and L4. Steps without requests are absent, not zero."""
    end = now or datetime.now(UTC)
    start = _floor(end - rng.span, rng.step)
    trunc = TruncHour("minute") if rng.step >= timedelta(hours=1) else F("minute")
    rows = (
        RequestMinute.objects.filter(where, minute__gte=start)
        .annotate(t=trunc)
        .values("t")
        .annotate(**_sums())
        .order_by("t")
    )
    steps: dict[datetime, dict] = {}
    for row in rows:
        t = _floor(row["t"], rng.step)
        merged = steps.get(t)
        if merged is None:
            steps[t] = {k: (v or 0) for k, v in row.items() if k != "t"}
        else:
            for k, v in row.items():
                if k == "ttft_max":
                    merged[k] = max(merged[k], v or 0)
                elif k != "t":
                    merged[k] += v or 0
    out: dict[str, list] = defaultdict(list)
    for t, row in steps.items():
        n = row["requests"]
        ttft = _buckets(row, "ttft")
        out["t"].append(t.isoformat())
        out["requests"].append(n)
        out["errors"].append(row["errors"])
        out["degraded"].append(row["degraded"])
        for tier in TIERS:
            out[f"hit_{tier}"].append(round(row[f"hits_{tier}"] / n, 4) if n else None)
        for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            value = quantile(ttft, q, max_ms=row["ttft_max"])
            out[f"ttft_{name}"].append(round(value, 2) if value is not None else None)
        for tier in ("l3", "l4"):
            loads = _buckets(row, f"load_{tier}")
            for name, q in (("p50", 0.5), ("p95", 0.95)):
                value = quantile(loads, q)
                out[f"load_{tier}_{name}"].append(round(value, 2) if value is not None else None)
            out[f"loads_{tier}"].append(sum(loads))
    return {
        "range": rng.key,
        "step_s": int(rng.step.total_seconds()),
        "start": start.isoformat(),
        "end": end.isoformat(),
        **out,
    }


def totals(where: Q, since: datetime) -> dict:
    """Sums over a whole period: counts, error rate, hit rates, TTFT percentiles."""
    row = RequestMinute.objects.filter(where, minute__gte=since).aggregate(**_sums())
    return summarize(row)


def summarize(row: dict) -> dict:
    n = row.get("requests") or 0
    ttft = _buckets(row, "ttft")
    return {
        "requests": n,
        "errors": row.get("errors") or 0,
        "error_rate": (row.get("errors") or 0) / n if n else None,
        "hit_rate": ((row.get("hits_l1") or 0) + (row.get("hits_l2") or 0)) / n if n else None,
        "ttft_p50": quantile(ttft, 0.5, max_ms=row.get("ttft_max")),
        "ttft_p95": quantile(ttft, 0.95, max_ms=row.get("ttft_max")),
        "ttft_p99": quantile(ttft, 0.99, max_ms=row.get("ttft_max")),
    }


def fairness(rng: Range, *, now: datetime | None = None) -> list[dict]:
    """Per tenant over ``rng``: requests, engine hit rate (L1+L2) and p95 TTFT, side by side."""
    since = (now or datetime.now(UTC)) - rng.span
    rows = (
        RequestMinute.objects.filter(minute__gte=since, tenant__isnull=False)
        .values("tenant__slug")
        .annotate(**_sums())
        .order_by("tenant__slug")
    )
    return [{"tenant": row["tenant__slug"], **summarize(row)} for row in rows]


def canary_evidence(alias: Alias) -> dict | None:
    """Stable against canary since the canary started: requests, error rate, TTFT p50/p95.

    The canary's lifetime starts at the latest alias event that set this canary version."""
    if alias.canary_version_id is None:
        return None
    started = (
        AliasEvent.objects.filter(
            alias=alias, action=AliasAction.CANARY, canary_version_id=alias.canary_version_id
        )
        .order_by("-at")
        .values_list("at", flat=True)
        .first()
    )
    since = (started or alias.updated_at).replace(second=0, microsecond=0)
    rows = (
        RequestMinute.objects.filter(
            tenant_id=alias.tenant_id, alias=alias.name, minute__gte=since
        )
        .values("version")
        .annotate(**_sums())
    )
    by_version = {row["version"]: summarize(row) for row in rows}
    empty = summarize({})
    return {
        "since": since,
        "stable": by_version.get(alias.version.version, empty),
        "canary": by_version.get(alias.canary_version.version, empty),
    }
