"""The node's request log as a replay trace: the log stamps a request when it ends, the trace
lists requests as they arrived, with how long each held its version."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.helpers import approved_version


def test_the_log_becomes_a_trace_in_arrival_order_with_each_request_s_hold(
    tenant_a, reviewer, signing_key, tmp_path
):
    from apps.serving.replay.traces import read_export, write_export
    from apps.telemetry.records import RequestRecord
    from apps.telemetry.requestlog import log_rows, trace_from_log
    from apps.telemetry.writers import write_records

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


@pytest.mark.django_db
def test_manage_py_replay_replays_an_export_with_its_holds_and_names_its_costs(tmp_path):
    """``manage.py replay --file`` on an exported log (two engine slots): A is generating when
    C arrives, so B goes for C and A's return is an engine hit; the costs line says which were
    given."""
    import io
    import json

    from django.core.management import call_command

    rows = [  # at, version, how long the request ran (ms), the tier the node reported
        (0.0, 1, 2000.0, "L3"),
        (0.1, 2, 100.0, "L3"),
        (0.5, 3, 100.0, "L3"),
        (1.0, 1, 100.0, "L1"),
    ]
    path = tmp_path / "log.jsonl"
    fields = ("at", "version_id", "duration_ms", "tier")
    path.write_text(
        "".join(
            json.dumps(
                {**dict(zip(fields, row, strict=True)), "tenant": "acme", "alias": "a",
                 "version": f"v{row[1]}", "size_bytes": 1 << 20, "priority": 1}
            ) + "\n"
            for row in rows
        )
    )  # fmt: skip
    out = io.StringIO()
    options = ["--policies", "lru", "--l1", "1", "--l2", "2", "--ttl-minutes", "0"]
    costs = ["--bench-costs", "--l3-ms", "5", "--l4-ms", "10"]
    call_command("replay", "--file", str(path), *options, *costs, stdout=out)
    table = out.getvalue()
    assert "given (--l3-ms, --l4-ms); the rest bench/load_tiers.py's medians" in table
    lru = next(line.split() for line in table.splitlines() if line.startswith("lru"))
    assert lru[1] == "25.0%"  # A's return: the one engine hit of four requests
    assert "as the node reported: L1 25.0%, L2 0.0%, L3 75.0%" in table


@pytest.mark.django_db
def test_manage_py_replay_seats_shows_what_a_tried_engine_weight_does_to_each_tenant_s_waits(
    tmp_path,
):
    """Two tenants send ten one-second requests each at once to two seats: at equal weights
    they wait alike; with one tenant's engine weight at 300 %, its requests go first."""
    import io
    import json

    from django.core.management import CommandError, call_command

    path = tmp_path / "log.jsonl"
    path.write_text(
        "".join(
            json.dumps({"at": 0.0, "version_id": v, "duration_ms": 1000.0, "tenant": tenant,
                        "alias": "a", "version": "1", "size_bytes": 1, "priority": 1}) + "\n"
            for _ in range(10)
            for tenant, v in (("acme", 1), ("globex", 2))
        )
    )  # fmt: skip
    seats = ["--seats", "--file", str(path), "--max-concurrent", "2", "--headroom", "0"]
    out = io.StringIO()
    call_command("replay", *seats, "--engine-weight", "acme=300", stdout=out)
    rows = {line.split()[0]: line.split() for line in out.getvalue().splitlines()[2:]}
    # tenant, requests, then per run: weight, p50, p95, share
    in_force = {t: float(rows[t][3]) for t in ("acme", "globex")}  # wait p50
    tried = {t: float(rows[t][7]) for t in ("acme", "globex")}
    assert in_force["acme"] == in_force["globex"]
    assert tried["acme"] < in_force["acme"] < tried["globex"]
    assert rows["acme"][6] == "3"  # the weight tried: its tier's 1 x 300 %

    for bad, says in (
        ("acme=0", "a whole number from 1 to 10000"),
        ("initech=200", "no tenant initech in this trace"),
    ):
        with pytest.raises(CommandError, match=says):
            call_command("replay", *seats, "--engine-weight", bad, stdout=io.StringIO())
