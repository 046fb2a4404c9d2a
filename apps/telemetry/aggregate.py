"""Request records summed into rollup rows: pure, no database (``writers.py`` stores them).

A minute row per (minute, tenant, alias, adapter, version) holds counters (requests, each
outcome but ok, tier hits, the quality markers) and histogram buckets (``histograms.py``);
the coarser steps and the platform-wide rows are sums of minute rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime

from apps.telemetry import outcomes
from apps.telemetry.histograms import bucket_of
from apps.telemetry.quality import FINISH_REASONS
from apps.telemetry.records import RequestRecord, ShadowRecord

Sums = dict[str, float]

KEY_FIELDS = ("tenant_id", "alias", "adapter_id", "version")
ROLLUP_STEPS = (300, 3600)  # the coarser rollups (RequestRollup) beside the minute rows
PLATFORM_STEPS = (60, *ROLLUP_STEPS)  # every tenant together (PlatformRollup)


def step_start(moment: datetime, step: int) -> datetime:
    seconds = int(moment.timestamp())
    return datetime.fromtimestamp(seconds - seconds % step, UTC)


def merge(into: dict[str, float], sums: dict[str, float]) -> None:
    for name, value in sums.items():
        into[name] = max(into[name], value) if name == "ttft_ms_max" else into[name] + value


def minute_rows(records: Iterable[RequestRecord]) -> dict[tuple, Sums]:
    """The records summed per (minute, tenant, alias, adapter, version)."""
    rollups: dict[tuple, Sums] = defaultdict(lambda: defaultdict(float))
    for r in records:
        minute = r.at.replace(second=0, microsecond=0)
        row = rollups[(minute, r.tenant_id, r.alias, r.adapter_id, r.version)]
        row["requests"] += 1
        outcome = outcomes.classify(r.status, r.finish_reason)
        if outcome is not outcomes.Outcome.OK:
            row[outcomes.COUNTERS[outcome]] += 1
        row["degraded"] += 1 if r.degraded else 0
        if r.tier in ("L1", "L2", "L3", "L4"):
            row[f"hits_{r.tier.lower()}"] += 1
        if r.ttft_ms is not None:
            row["ttft_ms_sum"] += r.ttft_ms
            row["ttft_count"] += 1
            row["ttft_ms_max"] = max(row["ttft_ms_max"], r.ttft_ms)
            row[f"ttft_b{bucket_of(r.ttft_ms):02d}"] += 1
            row[f"queue_b{bucket_of(r.queue_ms):02d}"] += 1  # seated and answered
        if r.tier in ("L3", "L4") and r.load_ms > 0:
            row[f"load_{r.tier.lower()}_b{bucket_of(r.load_ms):02d}"] += 1
        row["load_ms_sum"] += r.load_ms
        row["prompt_tokens"] += r.prompt_tokens
        row["completion_tokens"] += r.completion_tokens
        _count_usage(row, r)
        _count_markers(row, r)
    return rollups


def coarser(rollups: dict[tuple, Sums]) -> tuple[dict[tuple, Sums], dict[tuple, Sums]]:
    """Minute rows summed into the coarser steps per key, and into platform-wide rows."""
    coarse: dict[tuple, Sums] = defaultdict(lambda: defaultdict(float))
    platform: dict[tuple, Sums] = defaultdict(lambda: defaultdict(float))
    for (minute, *rest), sums in rollups.items():
        for step in ROLLUP_STEPS:
            merge(coarse[(step, step_start(minute, step), *rest)], sums)
        for step in PLATFORM_STEPS:
            merge(platform[(step, step_start(minute, step))], sums)
    return coarse, platform


def engine_ms(r: RequestRecord) -> float:
    """The engine's time on a request it answered (a first token came): from its seat in the
    engine to its last token, without the admission wait and the adapter load; 0 otherwise."""
    if r.ttft_ms is None:
        return 0.0
    return max(0.0, r.total_ms - r.queue_ms - r.load_ms)


def _count_usage(row: dict[str, float], r: RequestRecord) -> None:
    """Add what a request cost to its rollup row's usage counters (``usage.py``)."""
    row["loads"] += 1 if r.load_caused else 0
    spent = engine_ms(r)
    row["engine_ms_sum"] += spent
    row["engine_token_s_sum"] += spent / 1000 * (r.prompt_tokens + r.completion_tokens)


def _count_markers(row: dict[str, float], r: RequestRecord) -> None:
    """Add a request's output-quality markers to its rollup row's counters."""
    if r.finish_reason in FINISH_REASONS:
        row[f"finish_{r.finish_reason}"] += 1
    row["empty_outputs"] += 1 if r.empty_output else 0
    row["refused"] += 1 if r.refused else 0
    if r.json_requested:
        row["json_requests"] += 1
        row["json_invalid"] += 1 if r.json_valid is False else 0
        row["json_mismatched"] += 1 if r.json_matches is False else 0


def shadow_rows(records: Iterable[ShadowRecord]) -> dict[tuple, Sums]:
    """Mirrored requests summed per (minute, tenant, alias, version, shadow version)."""
    rows: dict[tuple, Sums] = defaultdict(lambda: defaultdict(float))
    for r in records:
        minute = r.at.replace(second=0, microsecond=0)
        row = rows[(minute, r.tenant_id, r.alias, r.version, r.shadow_version)]
        if r.outcome in ("dropped_busy", "dropped_budget"):
            row[r.outcome] += 1
            continue
        row["mirrored"] += 1
        if r.outcome == "error":
            row["errors"] += 1
        else:
            row["compared"] += 1
            row["exact"] += 1 if r.exact else 0
            row["similarity_sum"] += r.similarity
            row["length_ratio_sum"] += r.length_ratio
            row["finish_agree"] += 1 if r.finish_agree else 0
            if r.json_agree is not None:
                row["json_compared"] += 1
                row["json_agree"] += 1 if r.json_agree else 0
        if r.ttft_ms is not None:
            row["ttft_ms_sum"] += r.ttft_ms
            row["ttft_count"] += 1
            row["ttft_ms_max"] = max(row["ttft_ms_max"], r.ttft_ms)
        if r.live_ttft_ms is not None:
            row["live_ttft_ms_sum"] += r.live_ttft_ms
            row["live_ttft_count"] += 1
    return rows


def merge_cache_row(into: dict[str, int], counts: dict[str, int]) -> None:
    """Fold a (minute, tenant) cache row that could not be written back into the live one."""
    for name, value in counts.items():
        peak = name in ("hot", "warm", "seen")
        into[name] = max(into[name], value) if peak else into[name] + value
