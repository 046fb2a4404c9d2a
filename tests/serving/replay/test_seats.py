"""The replay of a trace through the node's fair admission: an operator trying weights sees
the waits move the way the node's would."""

from __future__ import annotations

from apps.serving.replay.seats import replay_seats
from apps.serving.replay.traces import Adapter, Trace


def flood_trace() -> Trace:
    """Tenant 1 sends 40 two-second requests at t=0; tenant 2 a one-second request every
    second from t=1 to t=20."""
    at = [0.0] * 40 + [1.0 + i for i in range(20)]
    keys = [1] * 40 + [2] * 20
    return Trace(
        name="flood",
        description="one tenant floods, another trickles",
        adapters={1: Adapter(1, tenant=1, size_bytes=1), 2: Adapter(2, tenant=2, size_bytes=1)},
        priorities={1: 1, 2: 1},
        at=at,
        keys=keys,
        held_s=[2.0] * 40 + [1.0] * 20,
    )


def test_the_trickling_tenant_waits_for_no_flood_with_headroom():
    plain = {w.tenant: w for w in replay_seats(flood_trace(), seats=4)}
    assert plain[2].wait_p95_ms > 0  # behind the flood for a seat
    kept = {w.tenant: w for w in replay_seats(flood_trace(), seats=4, headroom=1)}
    assert kept[2].wait_p95_ms == 0  # a headroom seat each time
    assert plain[1].requests == 40 and plain[2].requests == 20
    assert abs(sum(w.seat_share for w in plain.values()) - 1) < 1e-9


def test_of_two_flooding_tenants_the_heavier_one_waits_less():
    trace = flood_trace()
    both = Trace(
        name="two floods", description="", adapters=trace.adapters, priorities=trace.priorities,
        at=[0.0] * 80, keys=[1, 2] * 40, held_s=[2.0] * 80,
    )  # fmt: skip
    even = {w.tenant: w for w in replay_seats(both, seats=4)}
    assert even[1].wait_p50_ms == even[2].wait_p50_ms
    weighted = {w.tenant: w for w in replay_seats(both, seats=4, weights={1: 1.0, 2: 3.0})}
    assert weighted[2].wait_p50_ms < even[2].wait_p50_ms < weighted[1].wait_p50_ms


def test_a_lone_tenant_gets_every_seat():
    trace = flood_trace()
    alone = Trace(
        name="alone", description="", adapters=trace.adapters, priorities=trace.priorities,
        at=trace.at[:40], keys=trace.keys[:40], held_s=trace.held_s[:40],
    )  # fmt: skip
    (only,) = replay_seats(alone, seats=4, headroom=2)
    # 40 two-second requests, 4 at a time (the headroom is not the lone tenant's): 10 rounds
    assert only.wait_p95_ms == 18_000
