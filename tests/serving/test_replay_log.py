"""The node's request log as a replay trace: the log stamps a request when it ends, the trace
lists requests as they arrived, with how long each held its version."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.helpers import approved_version


def test_the_log_becomes_a_trace_in_arrival_order_with_each_request_s_hold(
    tenant_a, reviewer, signing_key, tmp_path
):
    from apps.serving.replay.log import log_rows, trace_from_log
    from apps.serving.replay.traces import read_export, write_export
    from apps.serving.stats import RequestRecord, write_records

    long_id = approved_version(tenant_a, "support", "1", reviewer)
    short_id = approved_version(tenant_a, "faq", "1", reviewer)
    start = datetime.now(UTC) - timedelta(minutes=5)

    def request(adapter: str, arrives_s: float, takes_s: float, tier: str) -> RequestRecord:
        return RequestRecord(
            tenant_id=tenant_a.id, alias=adapter, adapter_id=adapter, version="1", tier=tier,
            status=200, ttft_ms=10.0, total_ms=takes_s * 1000,
            at=start + timedelta(seconds=arrives_s + takes_s),  # the log's stamp: its end
        )  # fmt: skip

    # ends at 2 s, 3.5 s and 5 s; arrived at 1 s, 3 s and 0 s
    write_records(
        "n1",
        [request("faq", 1, 1, "L3"), request("faq", 3, 0.5, "L1"), request("support", 0, 5, "L4")],
    )
    rows = list(log_rows(since_hours=1))
    assert [(r["version_id"], r["duration_ms"], r["tier"]) for r in rows] == [
        (long_id, 5000.0, "L4"),
        (short_id, 1000.0, "L3"),
        (short_id, 500.0, "L1"),
    ]
    trace = trace_from_log(since_hours=1)
    assert trace.at == pytest.approx([0.0, 1.0, 3.0])
    assert trace.held_s == pytest.approx([5.0, 1.0, 0.5])
    assert trace.tiers == ["L4", "L3", "L1"]
    for name in ("log.jsonl", "log.csv"):  # an export reads back the same
        write_export(log_rows(since_hours=1), tmp_path / name)
        again = read_export(tmp_path / name)
        assert (again.at, again.held_s, again.keys) == (trace.at, trace.held_s, trace.keys)
