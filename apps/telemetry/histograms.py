"""Fixed-bucket latency histograms for the per-minute rollups, and honest percentiles.

A rollup row keeps, per latency, one count per bucket (``<prefix>_b00`` .. ``_b15``): summing
rows of any time range and any set of adapters is a plain SQL ``SUM`` per column, and a
percentile is read from the summed buckets the way Prometheus' ``histogram_quantile`` reads
them (linear inside the bucket). Never an average labelled p95.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

# Upper bounds in milliseconds; a 16th bucket holds everything above the last.
BOUNDS_MS: tuple[float, ...] = (
    2, 5, 10, 20, 35, 50, 75, 100, 150, 250, 500, 1000, 2500, 5000, 10000,
)  # fmt: skip
N_BUCKETS = len(BOUNDS_MS) + 1
# The latencies kept as histograms: time to first token, adapter loads by source tier, and
# the wait for a seat in the engine's batch (the tenant's fair share).
HISTOGRAMS = ("ttft", "load_l3", "load_l4", "queue")


def bucket_fields(prefix: str) -> list[str]:
    return [f"{prefix}_b{i:02d}" for i in range(N_BUCKETS)]


def bucket_of(ms: float) -> int:
    """The bucket a latency falls in (upper bounds inclusive)."""
    return bisect.bisect_left(BOUNDS_MS, ms)


def quantile(counts: Sequence[int], q: float, *, max_ms: float | None = None) -> float | None:
    """The q-quantile (0..1) of the latencies counted in ``counts``; None when empty.

    Inside a bucket values are taken as spread evenly between its bounds. The open last
    bucket ends at ``max_ms`` (the largest value seen) when known, else at its lower bound.
    """
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0.0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            lower = BOUNDS_MS[i - 1] if i > 0 else 0.0
            upper = BOUNDS_MS[i] if i < len(BOUNDS_MS) else max(max_ms or lower, lower)
            if max_ms is not None:
                upper = min(upper, max(max_ms, lower))
            return lower + (upper - lower) * (rank - seen) / n
        seen += n
    return float(BOUNDS_MS[-1])


def merge(rows: Iterable[Sequence[int]]) -> list[int]:
    total = [0] * N_BUCKETS
    for row in rows:
        for i, n in enumerate(row):
            total[i] += n
    return total


def quantiles(counts, q: float, *, max_ms=None):
    """``quantile`` for many histograms at once: ``counts`` is an (n, N_BUCKETS) array, the
    result n values (NaN where a histogram is empty); ``max_ms`` an optional array of n."""
    import numpy as np

    counts = np.asarray(counts, dtype=float)
    total = counts.sum(axis=1)
    rank = q * total
    cum = counts.cumsum(axis=1)
    # the first non-empty bucket whose cumulative count reaches the rank
    reached = (cum >= rank[:, None]) & (counts > 0)
    index = reached.argmax(axis=1)
    rows = np.arange(len(counts))
    lower_bounds = np.concatenate(([0.0], BOUNDS_MS))
    upper_bounds = np.concatenate((BOUNDS_MS, [np.nan]))
    lower = lower_bounds[index]
    upper = upper_bounds[index]
    if max_ms is not None:
        peak = np.maximum(np.asarray(max_ms, dtype=float), lower)
        upper = np.where(np.isnan(upper), peak, np.minimum(upper, peak))
    upper = np.where(np.isnan(upper), lower, upper)
    in_bucket = counts[rows, index]
    seen = cum[rows, index] - in_bucket
    with np.errstate(invalid="ignore", divide="ignore"):
        values = lower + (upper - lower) * (rank - seen) / in_bucket
    return np.where(total > 0, values, np.nan)
