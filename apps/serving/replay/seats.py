"""Replay a trace's arrivals through the node's fair admission (``serving/fairness.py``), on a
virtual clock: which tenant waited how long for a seat in the engine, under the weights an
operator is trying, before setting them.

Each request holds a seat for its logged time (``Trace.held_s``: arrival to last byte on the
node, so it includes the wait it had there; an approximation that overstates service under
load) and is charged that time as its service, in milliseconds, where the node charges
tokens: a trace carries no token counts, and a seat's time is what a tenant takes from the
others. Requests without a logged time hold their seat ``default_hold_s``.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import numpy as np

from apps.serving.fairness import FairQueue
from apps.serving.replay.traces import Trace


@dataclass(frozen=True)
class TenantWaits:
    tenant: int
    requests: int
    wait_p50_ms: float
    wait_p95_ms: float
    seat_share: float  # of all seat time in the trace


def replay_seats(
    trace: Trace,
    *,
    seats: int,
    headroom: int = 0,
    weights: dict[int, float] | None = None,
    default_hold_s: float = 1.0,
) -> list[TenantWaits]:
    """Per tenant of ``trace``: its waits for a seat and its share of the seat time.
    ``weights``: tenant -> weight (default 1 each)."""
    weights = weights or {}
    fair = FairQueue(seats, headroom=headroom, input_weight=1.0)
    holds = trace.held_s or [default_hold_s] * len(trace)
    tenant_of = [trace.adapters[key].tenant for key in trace.keys]
    waits: dict[int, list[float]] = {}
    seat_ms: dict[int, float] = {}
    ends: list[tuple[float, int, int]] = []  # (time, order, request)
    order = itertools.count()

    def seat_the_next(now: float) -> None:
        while (chosen := fair.next()) is not None:
            tenant, request = chosen
            assert isinstance(tenant, int) and isinstance(request, int)
            waits.setdefault(tenant, []).append((now - trace.at[request]) * 1000)
            held_ms = max(holds[request], 0.0) * 1000
            fair.charge(tenant, prompt=round(held_ms))
            seat_ms[tenant] = seat_ms.get(tenant, 0.0) + held_ms
            heapq.heappush(ends, (now + held_ms / 1000, next(order), request))

    for request, at in enumerate(trace.at):
        while ends and ends[0][0] <= at:
            end, _, done = heapq.heappop(ends)
            fair.done(tenant_of[done])
            seat_the_next(end)
        tenant = tenant_of[request]
        fair.arrive(tenant, request, weight=weights.get(tenant, 1.0))
        seat_the_next(at)
    while ends:
        end, _, done = heapq.heappop(ends)
        fair.done(tenant_of[done])
        seat_the_next(end)
    total = sum(seat_ms.values()) or 1.0
    return [
        TenantWaits(
            tenant=tenant,
            requests=len(values),
            wait_p50_ms=float(np.percentile(values, 50)),
            wait_p95_ms=float(np.percentile(values, 95)),
            seat_share=seat_ms[tenant] / total,
        )
        for tenant, values in sorted(waits.items())
    ]


def seats_table(trace: Trace, runs: dict[str, tuple[dict[int, float], list[TenantWaits]]]) -> str:
    """Per tenant, for each named run (its weights, its waits): weight, seat-wait p50/p95 in
    ms and share of the seat time, side by side."""
    tenants = sorted({w.tenant for _, rows in runs.values() for w in rows})
    by_run = {name: {w.tenant: w for w in rows} for name, (_, rows) in runs.items()}
    head = f"{'tenant':<20}{'requests':>9}" + "".join(
        f"  {name[:12]:>12} {'p50 ms':>8} {'p95 ms':>8} {'share':>6}" for name in runs
    )
    lines = [head]
    for tenant in tenants:
        name = trace.tenant_names.get(tenant, str(tenant))
        any_row = next(rows[tenant] for rows in by_run.values() if tenant in rows)
        line = f"{name[:20]:<20}{any_row.requests:>9}"
        for run, (weights, _) in runs.items():
            w = by_run[run].get(tenant)
            weight = weights.get(tenant, 1.0)
            line += f"  {weight:>12.3g} " + (
                f"{w.wait_p50_ms:>8.1f} {w.wait_p95_ms:>8.1f} {w.seat_share:>6.3f}"
                if w
                else f"{'':>8} {'':>8} {'':>6}"
            )
        lines.append(line)
    return "\n".join(lines) + "\n"
