"""The evidence about a version that releases judge and the alias page shows: per-version
request statistics from the nodes' request log (exact windows, not whole minutes), and
shadow comparisons from the per-minute shadow rows. One function each, so the page and the
judge cannot disagree."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from django.db.models import Sum

from apps.registry.choices import AliasAction
from apps.registry.models import AdapterVersion, Alias, AliasEvent
from apps.telemetry import outcomes
from apps.telemetry.models import RequestLog, ShadowMinute
from apps.telemetry.outcomes import Outcome

MAX_ROWS = 200_000  # per version and window: a judgement reads at most this many requests


@dataclass(frozen=True)
class Traffic:
    """One version's requests through an alias in a window, by outcome
    (``outcomes.py``), with the quality markers of its answers."""

    requests: int = 0
    answered: int = 0  # outcome ok: what the quality markers are counted on
    errors: int = 0  # server failures: what counts against a version
    caller_errors: int = 0  # the callers' own mistakes (4xx): shown, never judged
    throttled: int = 0  # 429: callers over their rate limit: shown, never judged
    cancelled: int = 0  # 499: callers gone before the end: shown, never judged
    ttft_p50_ms: float | None = None  # of the answered requests
    ttft_p95_ms: float | None = None
    cut: int = 0  # answers that reached max_tokens
    empty: int = 0  # answers with no text
    json_requests: int = 0  # answered requests that asked for JSON
    json_invalid: int = 0  # of those, answers that were not valid JSON
    refused: int = 0  # requests vLLM refused (caller errors: not a marker of the version)
    markers: int = 0  # answers cut, empty or invalid JSON (each answer counted once)

    @property
    def error_rate(self) -> float | None:
        """Server failures per request, as every dashboard and chart counts them."""
        return self.errors / self.requests if self.requests else None

    @property
    def marker_rate(self) -> float | None:
        """Markers per answered request: a caller's bad body (400, often refused by vLLM) or
        its rate limit (429) is no answer of the version's, and says nothing of its quality."""
        return self.markers / self.answered if self.answered else None

    def as_dict(self) -> dict:
        def share(n: int, of: int) -> float | None:
            return n / of if of else None

        return {
            "requests": self.requests,
            "answered": self.answered,
            "errors": self.errors,
            "error_rate": self.error_rate,
            "caller_errors": self.caller_errors,
            "throttled": self.throttled,
            "ttft_p50_ms": self.ttft_p50_ms,
            "ttft_p95_ms": self.ttft_p95_ms,
            "marker_rate": self.marker_rate,
            "cut_rate": share(self.cut, self.answered),
            "empty_rate": share(self.empty, self.answered),
            "json_invalid_rate": share(self.json_invalid, self.json_requests),
            "refused": self.refused,
        }


def traffic(alias: Alias, version: AdapterVersion, since: datetime) -> Traffic:
    """``version``'s requests through ``alias`` since ``since``, from the request log (exact
    windows, not whole minutes). The alias page's canary figures and the release judge's
    both come from here."""
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
    found: Counter[Outcome] = Counter()
    ttfts: list[float] = []
    cut = empty = json_requests = json_invalid = refused = markers = 0
    for status, ttft, finish, is_empty, was_refused, json_valid in rows:
        outcome = outcomes.classify(status, finish)
        found[outcome] += 1
        refused += bool(was_refused)
        if outcome is not Outcome.OK:
            continue
        if ttft is not None:
            ttfts.append(ttft)
        cut += finish == "length"
        empty += bool(is_empty)
        json_requests += json_valid is not None
        json_invalid += json_valid is False
        markers += finish == "length" or bool(is_empty) or json_valid is False
    return Traffic(
        requests=len(rows),
        answered=found[Outcome.OK],
        errors=found[Outcome.SERVER_FAILURE],
        caller_errors=found[Outcome.CALLER_ERROR],
        throttled=found[Outcome.THROTTLED],
        cancelled=found[Outcome.CANCELLED],
        ttft_p50_ms=float(np.percentile(ttfts, 50)) if ttfts else None,
        ttft_p95_ms=float(np.percentile(ttfts, 95)) if ttfts else None,
        cut=cut,
        empty=empty,
        json_requests=json_requests,
        json_invalid=json_invalid,
        refused=refused,
        markers=markers,
    )


def canary_started(alias: Alias) -> datetime | None:
    """When the alias's canary started: the latest alias event that set this canary version."""
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
    return started or alias.updated_at


def canary_evidence(alias: Alias) -> dict | None:
    """Stable against canary since the canary started, for the alias page (``traffic``)."""
    since = canary_started(alias)
    if since is None or alias.canary_version is None:
        return None
    return {
        "since": since,
        "stable": traffic(alias, alias.version, since).as_dict(),
        "canary": traffic(alias, alias.canary_version, since).as_dict(),
    }


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
