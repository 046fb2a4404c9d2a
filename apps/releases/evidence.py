"""What the judge reads: per-version request statistics from the nodes' request log (exact
windows, not whole minutes), and shadow comparisons from the per-minute shadow rows."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from django.db.models import Sum

from apps.registry.models import AdapterVersion, Alias
from apps.telemetry import outcomes
from apps.telemetry.models import RequestLog, ShadowMinute
from apps.telemetry.outcomes import Outcome

MAX_ROWS = 200_000  # per version and window: a judgement reads at most this many requests


@dataclass(frozen=True)
class Traffic:
    """One version's requests through an alias in a window."""

    requests: int
    errors: int  # server failures (apps/telemetry/outcomes.py): what counts against a version
    ttft_p95_ms: float | None
    markers: int  # cut by max_tokens, empty, refused, or invalid JSON
    caller_errors: int = 0  # the callers' own mistakes (4xx): shown, never judged
    throttled: int = 0  # 429: callers over their rate limit: shown, never judged

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    @property
    def marker_rate(self) -> float | None:
        return self.markers / self.requests if self.requests else None

    def as_dict(self) -> dict:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": self.error_rate,
            "caller_errors": self.caller_errors,
            "throttled": self.throttled,
            "ttft_p95_ms": self.ttft_p95_ms,
            "marker_rate": self.marker_rate,
        }


def traffic(alias: Alias, version: AdapterVersion, since: datetime) -> Traffic:
    rows = list(
        RequestLog.objects.filter(
            tenant_id=alias.tenant_id,
            alias=alias.name,
            adapter_id=alias.adapter.adapter_id,
            version=version.version,
            at__gte=since,
        ).values_list(
            "status", "ttft_ms", "finish_reason", "empty_output", "refused", "json_valid"
        )[:MAX_ROWS]
    )
    ttfts = [row[1] for row in rows if row[1] is not None]
    found = Counter(outcomes.classify(row[0], row[2]) for row in rows)
    return Traffic(
        requests=len(rows),
        errors=found[Outcome.SERVER_FAILURE],
        caller_errors=found[Outcome.CALLER_ERROR],
        throttled=found[Outcome.THROTTLED],
        ttft_p95_ms=float(np.percentile(ttfts, 95)) if ttfts else None,
        markers=sum(
            1
            for _, _, finish, empty, refused, json_valid in rows
            if finish == "length" or empty or refused or json_valid is False
        ),
    )


@dataclass(frozen=True)
class Shadowed:
    """The shadow's copies of an alias's requests since a moment (from its minute on)."""

    mirrored: int  # copies answered (or failed); dropped ones apart
    dropped: int  # the node was busy, or copies were over their budget
    compared: int
    exact: int
    errors: int
    ttft_ms: float | None  # the shadow's mean
    live_ttft_ms: float | None  # the live answers' mean, for the same requests

    @property
    def agreement(self) -> float | None:
        return self.exact / self.compared if self.compared else None

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.mirrored if self.mirrored else None

    def as_dict(self) -> dict:
        return {
            "mirrored": self.mirrored,
            "dropped": self.dropped,
            "compared": self.compared,
            "agreement": self.agreement,
            "error_rate": self.error_rate,
            "ttft_ms": self.ttft_ms,
            "live_ttft_ms": self.live_ttft_ms,
        }


def shadowed(alias: Alias, version: AdapterVersion, since: datetime) -> Shadowed:
    sums = ShadowMinute.objects.filter(
        tenant_id=alias.tenant_id,
        alias=alias.name,
        shadow_version=version.version,
        minute__gte=since.replace(second=0, microsecond=0),
    ).aggregate(
        **{
            name: Sum(name)
            for name in (
                "mirrored",
                "dropped_busy",
                "dropped_budget",
                "compared",
                "exact",
                "errors",
                "ttft_ms_sum",
                "ttft_count",
                "live_ttft_ms_sum",
                "live_ttft_count",
            )
        }
    )

    def mean(total: str, count: str) -> float | None:
        return (sums[total] or 0) / sums[count] if sums[count] else None

    return Shadowed(
        mirrored=sums["mirrored"] or 0,
        dropped=(sums["dropped_busy"] or 0) + (sums["dropped_budget"] or 0),
        compared=sums["compared"] or 0,
        exact=sums["exact"] or 0,
        errors=sums["errors"] or 0,
        ttft_ms=mean("ttft_ms_sum", "ttft_count"),
        live_ttft_ms=mean("live_ttft_ms_sum", "live_ttft_count"),
    )
