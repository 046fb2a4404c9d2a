"""What the dashboards plot, read from the per-minute rollups (``RequestMinute``).

Every series is one grouped SQL query: sums of counters and of histogram buckets per time
step, so a page costs the same whether a tenant made ten requests or ten million. Ranges
are downsampled to at most ~2,000 points (a week of minutes becomes 5-minute steps).
Percentiles come from the summed buckets (``histograms.quantile``), never from averages.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
from django.db import connection
from django.db.models import Max, Q, Sum

from apps.registry.choices import AliasAction
from apps.registry.models import AdapterVersion, Alias, AliasEvent
from apps.telemetry.histograms import HISTOGRAMS, bucket_fields, quantile, quantiles
from apps.telemetry.models import (
    CacheMinute,
    PlatformRollup,
    RequestMinute,
    RequestRollup,
    ShadowExample,
    ShadowMinute,
)
from apps.telemetry.quality import side_by_side
from apps.telemetry.writers import SHADOW_EXAMPLES
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
TIERS = ("l1", "l2", "l3", "l4")
# the output-quality markers' counters (``apps/telemetry/quality.py``)
MARKERS = (
    "finish_stop",
    "finish_length",
    "finish_error",
    "empty_outputs",
    "refused",
    "json_requests",
    "json_invalid",
    "json_mismatched",
)
# what became of requests (apps/telemetry/outcomes.py): server failures are the error rate
OUTCOMES = ("server_failures", "caller_errors", "throttled", "cancelled", "legacy_minutes")
COUNTERS = ("requests", *OUTCOMES, "degraded", *(f"hits_{t}" for t in TIERS), *MARKERS)
BUCKETS = {name: bucket_fields(name) for name in HISTOGRAMS}


def _sums() -> dict:
    fields = [*COUNTERS, *(f for names in BUCKETS.values() for f in names)]
    return {**{f: Sum(f) for f in fields}, "ttft_max": Max("ttft_ms_max")}


def _buckets(row: dict, name: str) -> list[int]:
    """A histogram's counts from a row of ``_sums()``."""
    return [row.get(f) or 0 for f in BUCKETS[name]]


def _floor(moment: datetime, step: timedelta) -> datetime:
    seconds = int(moment.timestamp())
    return datetime.fromtimestamp(seconds - seconds % int(step.total_seconds()), UTC)


def _aware(moment: datetime | str) -> datetime:
    if isinstance(moment, str):  # SQLite hands computed timestamps back as text
        moment = datetime.fromisoformat(moment)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


PLATFORM = None  # the scope of every tenant together: the platform-wide rows
ALL_ROWS = Q()  # every per-tenant row (a caller filters them further)


def scope(*, tenant: Tenant | None = None, adapter_id: str = "") -> Q | None:
    """The rows of one tenant (and adapter); with neither, ``PLATFORM``."""
    if tenant is None and not adapter_id:
        return PLATFORM
    q = Q()
    if tenant is not None:
        q &= Q(tenant=tenant)
    if adapter_id:
        q &= Q(adapter_id=adapter_id)
    return q


def _source(rng: Range, start: datetime, where: Q | None = ALL_ROWS):
    """The rows a range reads: minutes up to a day, else the 5-minute or hourly rollups;
    for ``PLATFORM``, the platform-wide row of each step."""
    step = int(rng.step.total_seconds())
    if where is PLATFORM:
        return PlatformRollup.objects.filter(step_s=step, start__gte=start), "start"
    if step == 60:
        return RequestMinute.objects.filter(minute__gte=start).filter(where), "minute"
    return RequestRollup.objects.filter(step_s=step, start__gte=start).filter(where), "start"


def default_range(where: Q | None, *, now: datetime | None = None) -> Range:
    """The range a dashboard opens on: the last hour when all of the last day's data is
    from the last hour (a fresh install's first minutes fill the chart instead of its right
    edge), the last day when the day has older data; with nothing in the last day, the
    shortest longer range that has some; the last day when there is none at all."""
    end = now or datetime.now(UTC)
    day = RANGES["day"]
    rows, field = _source(day, _floor(end - day.span, day.step), where)
    oldest = rows.filter(requests__gt=0).order_by(field).values_list(field, flat=True).first()
    if oldest is not None:
        hour = RANGES["hour"]
        return hour if _aware(oldest) >= _floor(end - hour.span, hour.step) else day
    for key in ("week", "90d"):
        rng = RANGES[key]
        rows, _ = _source(rng, _floor(end - rng.span, rng.step), where)
        if rows.filter(requests__gt=0).exists():
            return rng
    return day


def _grouped(qs, field: str) -> tuple[list[str], list[tuple]]:
    """``qs`` summed per ``field``: the column names and the rows, fetched without the ORM's
    per-value converters (they cost more than the query for a few thousand rows of ~50 sums)."""
    query = qs.values(field).annotate(**_sums()).order_by(field)
    sql, params = query.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        names = [field, *(d[0] for d in cursor.description[1:])]  # "slug" for tenant__slug
        return names, cursor.fetchall()


def _percentile(counts: list[int], q: float, max_ms: float | None = None) -> float | None:
    value = quantile(counts, q, max_ms=max_ms)
    return round(value, 2) if value is not None else None


def _listed(values) -> list[float | None]:
    """Rounded floats for JSON, None for NaN (a step without that kind of request)."""
    return [None if v != v else round(float(v), 2) for v in values]


def series(where: Q | None, rng: Range, *, now: datetime | None = None) -> dict:
    """Per time step over ``rng`` of the rows ``where`` selects (``PLATFORM``: every
    tenant's): requests, errors, hit rate per tier, TTFT p50/p95/p99, load latency p50/p95
    from L3 and L4, and the totals of the whole range. Steps without requests are absent,
    not zero."""
    end = now or datetime.now(UTC)
    start = _floor(end - rng.span, rng.step)
    qs, field = _source(rng, start, where)
    names, rows = _grouped(qs, field)
    out: dict[str, list] = {"t": [_aware(row[0]).isoformat() for row in rows]}
    if rows:
        # one float matrix of the sums, so that percentiles are computed for all steps at once
        m = np.array([[v or 0 for v in row[1:]] for row in rows], dtype=float)
        col = {name: i - 1 for i, name in enumerate(names) if i}
        n = m[:, col["requests"]]
        out["requests"] = n.astype(int).tolist()
        per_step = np.where(n > 0, n, np.nan)
        known = m[:, col["legacy_minutes"]] == 0  # a step counted the old way has no outcomes
        for name in ("server_failures", "caller_errors", "throttled", "cancelled"):
            counts = np.where(known, m[:, col[name]], np.nan)
            out[name] = [None if v != v else int(v) for v in counts]
            out[f"{name.removesuffix('s')}_rate"] = _listed(np.round(counts / per_step, 4))
        out["errors"] = out["server_failures"]  # the error count is the server failures
        out["degraded"] = m[:, col["degraded"]].astype(int).tolist()
        for tier in TIERS:
            share = np.round(m[:, col[f"hits_{tier}"]] / np.where(n > 0, n, np.nan), 4)
            out[f"hit_{tier}"] = _listed(share)
        ttft = m[:, [col[f] for f in BUCKETS["ttft"]]]
        for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            out[f"ttft_{name}"] = _listed(quantiles(ttft, q, max_ms=m[:, col["ttft_max"]]))
        out["queue_p95"] = _listed(quantiles(m[:, [col[f] for f in BUCKETS["queue"]]], 0.95))
        per_request = np.where(n > 0, n, np.nan)
        json_n = m[:, col["json_requests"]]
        per_json = np.where(json_n > 0, json_n, np.nan)
        for name, counter, of in (
            ("cut", "finish_length", per_request),
            ("empty", "empty_outputs", per_request),
            ("failed", "finish_error", per_request),
            ("json_invalid", "json_invalid", per_json),
        ):
            out[f"{name}_share"] = _listed(np.round(m[:, col[counter]] / of, 4))
        for tier in ("l3", "l4"):
            loads = m[:, [col[f] for f in BUCKETS[f"load_{tier}"]]]
            out[f"loads_{tier}"] = loads.sum(axis=1).astype(int).tolist()
            for name, q in (("p50", 0.5), ("p95", 0.95)):
                out[f"load_{tier}_{name}"] = _listed(quantiles(loads, q))
    return {
        "range": rng.key,
        "step_s": int(rng.step.total_seconds()),
        "start": start.isoformat(),
        "end": end.isoformat(),
        "totals": summarize(qs.aggregate(**_sums())),
        **out,
    }


def cache_series(rng: Range, *, tenant: Tenant | None = None, now: datetime | None = None) -> dict:
    """Per step: evictions from the engine (L2) and disk (L3), summed over nodes; for one
    tenant also its peak hot and warm residency (carried forward: a row is written only when
    residency changes). Few rows: minutes without evictions or changes have none."""
    end = now or datetime.now(UTC)
    start = _floor(end - rng.span, rng.step)
    rows = CacheMinute.objects.filter(minute__gte=start)
    if tenant is not None:
        rows = rows.filter(tenant=tenant)
    step = int(rng.step.total_seconds())
    steps: dict[datetime, list[int]] = {}
    latest: dict[str, tuple[int, int]] = {}  # node -> (hot, warm) so far
    if tenant is not None:
        before = CacheMinute.objects.filter(tenant=tenant, minute__lt=start)
        for node in before.values_list("node", flat=True).distinct():
            last = before.filter(node=node).order_by("-minute").values_list("hot", "warm").first()
            latest[node] = last or (0, 0)
    fields = ("minute", "node", "evictions_l2", "evictions_l3", "hot", "warm")
    for minute, node, e2, e3, hot, warm in rows.order_by("minute").values_list(*fields):
        t = _floor(_aware(minute), rng.step)
        totals = steps.setdefault(t, [0, 0, 0, 0])
        totals[0] += e2
        totals[1] += e3
        latest[node] = (hot, warm)
        totals[2] = max(totals[2], sum(h for h, _ in latest.values()))
        totals[3] = max(totals[3], sum(w for _, w in latest.values()))
    ordered = sorted(steps.items())
    return {
        "t": [t.isoformat() for t, _ in ordered],
        "evictions_l2": [v[0] for _, v in ordered],
        "evictions_l3": [v[1] for _, v in ordered],
        "hot": [v[2] for _, v in ordered] if tenant is not None else [],
        "warm": [v[3] for _, v in ordered] if tenant is not None else [],
        "step_s": step,
        "start": start.isoformat(),
        "end": end.isoformat(),
    }


def summarize(row: dict) -> dict:
    n = int(row.get("requests") or 0)
    ttft = _buckets(row, "ttft")

    def share(counter: str, of: str = "requests") -> float | None:
        total = row.get(of) or 0
        return (row.get(counter) or 0) / total if total else None

    legacy = bool(row.get("legacy_minutes"))  # outcomes unknown for part of these requests

    def outcome(counter: str) -> float | None:
        return None if legacy else share(counter)

    return {
        "requests": n,
        # the error rate is the server failures' (apps/telemetry/outcomes.py); callers' own
        # mistakes and their rate limits are apart, and never count against a version
        "errors": None if legacy else int(row.get("server_failures") or 0),
        "error_rate": outcome("server_failures"),
        "caller_error_rate": outcome("caller_errors"),
        "throttled_rate": outcome("throttled"),
        "cancelled_rate": outcome("cancelled"),
        "caller_errors": None if legacy else int(row.get("caller_errors") or 0),
        "throttled": None if legacy else int(row.get("throttled") or 0),
        "hit_rate": ((row.get("hits_l1") or 0) + (row.get("hits_l2") or 0)) / n if n else None,
        "ttft_p50": quantile(ttft, 0.5, max_ms=row.get("ttft_max")),
        "ttft_p95": quantile(ttft, 0.95, max_ms=row.get("ttft_max")),
        "ttft_p99": quantile(ttft, 0.99, max_ms=row.get("ttft_max")),
        # the output-quality markers: shares of requests (JSON ones: of those that asked)
        "cut_rate": share("finish_length"),
        "empty_rate": share("empty_outputs"),
        "refused": int(row.get("refused") or 0),
        "failed_rate": share("finish_error"),
        "json_requests": int(row.get("json_requests") or 0),
        "json_invalid_rate": share("json_invalid", "json_requests"),
        "json_mismatched_rate": share("json_mismatched", "json_requests"),
    }


def by_version(
    rng: Range, *, tenant: Tenant, adapter_id: str, now: datetime | None = None
) -> list[dict]:
    """One adapter's versions side by side over ``rng``: requests, errors, TTFT and the
    output-quality markers of each, newest version first."""
    end = now or datetime.now(UTC)
    qs, _ = _source(rng, _floor(end - rng.span, rng.step))
    names, rows = _grouped(qs.filter(scope(tenant=tenant, adapter_id=adapter_id)), "version")
    found = [{"version": row[0], **summarize(dict(zip(names, row, strict=True)))} for row in rows]
    uploaded = dict(
        AdapterVersion.objects.filter(
            adapter__tenant=tenant, adapter__adapter_id=adapter_id
        ).values_list("version", "created_at")
    )
    oldest = datetime.min.replace(tzinfo=UTC)
    return sorted(found, key=lambda r: uploaded.get(r["version"], oldest), reverse=True)


def fairness(rng: Range, *, now: datetime | None = None) -> list[dict]:
    """Per tenant over ``rng``: requests, engine hit rate (L1+L2) and p95 TTFT, side by side."""
    end = now or datetime.now(UTC)
    # Per tenant the range's resolution does not matter: a day or more reads hourly rows.
    coarse = Range(rng.key, rng.label, rng.span, max(rng.step, timedelta(hours=1)))
    qs, _ = _source(
        rng if rng.span < timedelta(days=1) else coarse, _floor(end - rng.span, rng.step)
    )
    names, rows = _grouped(qs.filter(tenant__isnull=False), "tenant__slug")
    return [{"tenant": row[0], **summarize(dict(zip(names, row, strict=True)))} for row in rows]


SHADOW_COUNTS = (
    "mirrored",
    "compared",
    "errors",
    "dropped_busy",
    "dropped_budget",
    "exact",
    "similarity_sum",
    "length_ratio_sum",
    "finish_agree",
    "json_compared",
    "json_agree",
    "ttft_ms_sum",
    "ttft_count",
    "live_ttft_ms_sum",
    "live_ttft_count",
)


def _shadow_summary(row: dict) -> dict:
    def ratio(a: str, b: str) -> float | None:
        return (row.get(a) or 0) / row[b] if row.get(b) else None

    return {
        "mirrored": int(row.get("mirrored") or 0),
        "compared": int(row.get("compared") or 0),
        "errors": int(row.get("errors") or 0),
        "dropped_busy": int(row.get("dropped_busy") or 0),
        "dropped_budget": int(row.get("dropped_budget") or 0),
        "agreement": ratio("exact", "compared"),
        "similarity": ratio("similarity_sum", "compared"),
        "length_ratio": ratio("length_ratio_sum", "compared"),
        "finish_agreement": ratio("finish_agree", "compared"),
        "json_agreement": ratio("json_agree", "json_compared"),
        "error_rate": ratio("errors", "mirrored"),
        "ttft_ms": ratio("ttft_ms_sum", "ttft_count"),
        "live_ttft_ms": ratio("live_ttft_ms_sum", "live_ttft_count"),
    }


def shadow_evidence(alias: Alias) -> dict | None:
    """The alias's shadow since it was set: copies mirrored and dropped (by reason), how the
    shadow's answers agreed with the live ones, its errors and TTFT against the live TTFT,
    in total and per minute (agreement and similarity over time)."""
    shadow = alias.shadow_version
    if shadow is None:
        return None
    started = (
        AliasEvent.objects.filter(alias=alias, action=AliasAction.SHADOW)
        .order_by("-at")
        .values_list("at", flat=True)
        .first()
    )
    since = (started or alias.updated_at).replace(second=0, microsecond=0)
    rows = ShadowMinute.objects.filter(
        tenant_id=alias.tenant_id,
        alias=alias.name,
        shadow_version=shadow.version,
        minute__gte=since,
    )
    sums = {name: Sum(name) for name in SHADOW_COUNTS}
    per_minute = [
        {"t": _aware(row["minute"]).isoformat(), **_shadow_summary(dict(row))}
        for row in rows.values("minute").annotate(**sums).order_by("minute")
    ]
    examples = []
    for example in ShadowExample.objects.filter(
        tenant_id=alias.tenant_id, alias=alias.name, shadow_version=shadow.version
    ).order_by("-at", "-id")[:SHADOW_EXAMPLES]:
        live, shadowed = side_by_side(example.live_output, example.shadow_output)
        examples.append({"example": example, "live": live, "shadow": shadowed})
    return {
        "examples": examples,
        "since": since,
        "totals": _shadow_summary(rows.aggregate(**sums)),
        "minutes": per_minute,
    }


def version_minutes(
    *,
    tenant_id: int,
    alias: str,
    versions: list[str],
    since: datetime,
    until: datetime | None = None,
) -> dict[str, list[dict]]:
    """Per version (by version string), its requests through ``alias`` per minute from
    ``since`` to ``until`` (the minutes that began by then): each minute's ``summarize`` with
    ``t``, for charts of versions side by side."""
    rows = RequestMinute.objects.filter(
        tenant_id=tenant_id,
        alias=alias,
        version__in=versions,
        minute__gte=since.replace(second=0, microsecond=0),
    )
    if until is not None:
        rows = rows.filter(minute__lte=until)
    grouped = rows.values("minute", "version").annotate(**_sums()).order_by("minute")
    found: dict[str, list[dict]] = {version: [] for version in versions}
    for row in grouped:
        found[row["version"]].append(
            {"t": _aware(row["minute"]).isoformat(), **summarize(dict(row))}
        )
    return found


def shadow_minutes(
    *, tenant_id: int, alias: str, shadow_version: str, since: datetime
) -> list[dict]:
    """The shadow's comparisons per minute since ``since`` (``_shadow_summary`` with ``t``)."""
    rows = ShadowMinute.objects.filter(
        tenant_id=tenant_id,
        alias=alias,
        shadow_version=shadow_version,
        minute__gte=since.replace(second=0, microsecond=0),
    )
    sums = {name: Sum(name) for name in SHADOW_COUNTS}
    return [
        {"t": _aware(row["minute"]).isoformat(), **_shadow_summary(dict(row))}
        for row in rows.values("minute").annotate(**sums).order_by("minute")
    ]
