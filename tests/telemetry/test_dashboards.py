"""Dashboard data: histogram percentiles, rollups with buckets, downsampling, canary evidence."""

from __future__ import annotations

import concurrent.futures
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import Q, Sum

from apps.telemetry import dashboards
from apps.telemetry.histograms import BOUNDS_MS, N_BUCKETS, bucket_of, quantile
from apps.telemetry.models import PlatformRollup, RequestMinute, RequestRollup
from apps.telemetry.records import RequestRecord
from apps.telemetry.writers import write_records


def test_buckets_hold_their_upper_bound_and_the_last_one_is_open():
    assert bucket_of(2) == 0
    assert bucket_of(2.01) == 1
    assert bucket_of(BOUNDS_MS[-1]) == N_BUCKETS - 2
    assert bucket_of(10 * BOUNDS_MS[-1]) == N_BUCKETS - 1


def test_percentiles_come_from_buckets_not_from_the_mean():
    # 95 fast requests (~8 ms) and 5 slow ones (~900 ms): the mean is ~52 ms
    counts = [0] * N_BUCKETS
    counts[bucket_of(8)] = 95
    counts[bucket_of(900)] = 5
    p50 = quantile(counts, 0.5)
    p99 = quantile(counts, 0.99)
    assert 5 < p50 <= 10  # inside the 5-10 ms bucket
    assert 500 < p99 <= 1000  # inside the 500-1000 ms bucket
    assert quantile(counts, 0.95) <= 10  # the 95th request is still a fast one
    assert quantile([0] * N_BUCKETS, 0.95) is None


def test_the_open_last_bucket_ends_at_the_largest_value_seen():
    counts = [0] * N_BUCKETS
    counts[-1] = 10
    assert quantile(counts, 1.0, max_ms=25_000) == pytest.approx(25_000)
    assert quantile(counts, 0.5, max_ms=25_000) == pytest.approx(17_500)


def _record(tenant_id, at, **fields):
    base = {
        "alias": "support",
        "adapter_id": "support",
        "version": "v1",
        "tier": "L1",
        "status": 200,
    }
    return RequestRecord(tenant_id=tenant_id, at=at, **{**base, **fields})


def test_rollups_count_ttft_and_loads_per_bucket(tenant_a):
    at = datetime(2026, 7, 4, 12, 0, 30, tzinfo=UTC)
    write_records(
        "n1",
        [
            _record(tenant_a.id, at, ttft_ms=8),
            _record(tenant_a.id, at, ttft_ms=9, tier="L3", load_ms=40),
            _record(tenant_a.id, at, ttft_ms=700, tier="L4", load_ms=600),
            _record(tenant_a.id, at, status=503, error="load_deadline"),
        ],
    )
    write_records("n1", [_record(tenant_a.id, at, ttft_ms=8)])  # a second batch adds up
    row = RequestMinute.objects.get()
    assert (row.requests, row.server_failures, row.ttft_count) == (5, 1, 4)
    assert getattr(row, f"ttft_b{bucket_of(8):02d}") == 3
    assert getattr(row, f"ttft_b{bucket_of(700):02d}") == 1
    assert getattr(row, f"load_l3_b{bucket_of(40):02d}") == 1
    assert getattr(row, f"load_l4_b{bucket_of(600):02d}") == 1
    assert sum(getattr(row, f"load_l3_b{i:02d}") for i in range(N_BUCKETS)) == 1


def test_later_batches_add_to_every_rollup_row_and_keep_the_slowest_ttft(tenant_a):
    at = datetime(2026, 7, 4, 12, 0, 30, tzinfo=UTC)
    write_records("n1", [_record(tenant_a.id, at, ttft_ms=50), _record(None, at, status=401)])
    write_records("n1", [_record(tenant_a.id, at, ttft_ms=20), _record(None, at, status=401)])
    write_records("n2", [_record(tenant_a.id, at, ttft_ms=30)])
    row = RequestMinute.objects.get(tenant=tenant_a)
    assert (row.requests, row.ttft_count, row.ttft_ms_sum, row.ttft_ms_max) == (3, 3, 100, 50)
    anonymous = RequestMinute.objects.get(tenant=None)  # no key: one row all the same
    assert (anonymous.requests, anonymous.caller_errors) == (2, 2)
    for step in (300, 3600):
        rollup = RequestRollup.objects.get(tenant=tenant_a, step_s=step)
        assert (rollup.requests, rollup.ttft_ms_max) == (3, 50)
    write_records("n1", [_record(tenant_a.id, at, ttft_ms=90)])
    assert RequestMinute.objects.get(tenant=tenant_a).ttft_ms_max == 90


@pytest.mark.django_db(transaction=True)
def test_nodes_flushing_the_same_new_rows_at_once_lose_no_count(tenant_a, tenant_b):
    """Several nodes flush at the same moment, each creating the same minute's rows for the
    first time: every request is counted once, in every rollup, and nobody's batch fails."""
    from django.db import connection

    at = datetime(2026, 7, 4, 12, 0, 30, tzinfo=UTC)
    per_node = [
        _record(tenant.id, at, alias=alias, adapter_id=alias, ttft_ms=10.0 + i)
        for i, (tenant, alias) in enumerate(
            (t, a) for t in (tenant_a, tenant_b) for a in ("support", "billing", "faq")
        )
    ]
    nodes, start = 4, threading.Barrier(4)

    def flush(node: str) -> None:
        try:
            start.wait()
            write_records(node, per_node)
        finally:
            connection.close()  # each thread has its own connection

    with concurrent.futures.ThreadPoolExecutor(nodes) as pool:
        list(pool.map(flush, [f"n{i}" for i in range(nodes)]))
    minutes = RequestMinute.objects.all()
    assert minutes.count() == len(per_node)
    assert {row.requests for row in minutes} == {nodes}
    assert {row.ttft_count for row in minutes} == {nodes}
    for step in (300, 3600):
        assert RequestRollup.objects.filter(step_s=step).aggregate(n=Sum("requests"))["n"] == (
            nodes * len(per_node)
        )
    platform = dict(PlatformRollup.objects.values_list("step_s").annotate(n=Sum("requests")))
    assert platform == {
        60: nodes * len(per_node),
        300: nodes * len(per_node),
        3600: nodes * len(per_node),
    }


def test_a_flush_costs_the_same_few_statements_however_many_rows_it_writes(
    tenant_a, django_assert_max_num_queries
):
    """The node's stats thread shares the serving process: a flush of 150 new rollup keys
    (and their 5-minute, hourly and platform rows) is a handful of statements, not a few per
    row (bench/stats_writer.py prints what that costs)."""
    at = datetime(2026, 7, 4, 12, 0, 30, tzinfo=UTC)
    records = [_record(tenant_a.id, at, alias=f"a{i}", adapter_id=f"a{i}") for i in range(150)]
    with django_assert_max_num_queries(10):
        write_records("n1", records)
    assert RequestMinute.objects.count() == 150
    assert RequestRollup.objects.count() == 300


def test_a_week_is_downsampled_to_five_minute_steps_and_sums_add_up(tenant_a, tenant_b):
    now = datetime(2026, 7, 4, 12, 0, tzinfo=UTC)
    records = []
    for minute in range(12):  # 12 minutes, one request each
        at = now - timedelta(minutes=minute + 1) + timedelta(seconds=5)  # 11:48 .. 11:59
        records.append(_record(tenant_a.id, at, ttft_ms=10 + minute))
    records.append(_record(tenant_b.id, now, ttft_ms=5))  # another tenant's: not counted
    write_records("n1", records)
    week = dashboards.series(
        dashboards.scope(tenant=tenant_a), dashboards.RANGES["week"], now=now + timedelta(minutes=1)
    )
    assert sum(week["requests"]) == 12
    assert len(week["t"]) == 3  # 12 minutes fall in three 5-minute steps
    assert week["step_s"] == 300
    hour = dashboards.series(
        dashboards.scope(tenant=tenant_a), dashboards.RANGES["hour"], now=now + timedelta(minutes=1)
    )
    assert len(hour["t"]) == 12 and sum(hour["requests"]) == 12
    assert all(v == 1.0 for v in hour["hit_l1"])
    assert hour["ttft_p95"][0] is not None


def test_fairness_puts_every_tenants_hit_rate_and_p95_side_by_side(tenant_a, tenant_b):
    now = datetime.now(UTC)
    write_records(
        "n1",
        [
            _record(tenant_a.id, now, ttft_ms=8),
            _record(tenant_a.id, now, ttft_ms=8, tier="L4", load_ms=300),
            _record(tenant_b.id, now, ttft_ms=400),
        ],
    )
    rows = {r["tenant"]: r for r in dashboards.fairness(dashboards.RANGES["hour"])}
    assert rows["tenant-a"]["hit_rate"] == 0.5
    assert rows["tenant-b"]["hit_rate"] == 1.0
    assert rows["tenant-b"]["ttft_p95"] > rows["tenant-a"]["ttft_p95"]


def test_rebuilding_the_coarse_rollups_from_minutes_gives_what_was_written(tenant_a):
    from apps.telemetry.models import RequestRollup
    from apps.telemetry.writers import rebuild_rollups

    now = datetime(2026, 7, 4, 12, 0, tzinfo=UTC)
    write_records(
        "n1",
        [_record(tenant_a.id, now + timedelta(minutes=m), ttft_ms=5 * m + 1) for m in range(70)],
    )
    fields = ["step_s", "start", "requests", "ttft_count", "ttft_ms_max", "ttft_b03", "ttft_b08"]
    written = sorted(RequestRollup.objects.values_list(*fields))
    assert {row[0] for row in written} == {300, 3600}
    assert sum(row[2] for row in written if row[0] == 3600) == 70
    rebuild_rollups()
    assert sorted(RequestRollup.objects.values_list(*fields)) == written


def test_percentiles_of_many_steps_at_once_equal_one_at_a_time():
    import random

    from apps.telemetry.histograms import quantiles

    rng = random.Random(3)
    rows = [[rng.choice([0, 0, 1, 5, 40]) for _ in range(N_BUCKETS)] for _ in range(200)]
    rows.append([0] * N_BUCKETS)
    peaks = [rng.uniform(1, 30_000) for _ in rows]
    for q in (0.5, 0.95, 0.99):
        many = quantiles(rows, q, max_ms=peaks)
        for row, peak, value in zip(rows, peaks, many, strict=True):
            one = quantile(row, q, max_ms=peak)
            assert (one is None and value != value) or value == pytest.approx(one), (row, q)


def test_evictions_and_residency_changes_are_recorded_per_minute_and_carried_forward(
    tenant_a, tenant_b
):
    from apps.serving.node.stats_recorder import StatsRecorder
    from apps.telemetry.models import CacheMinute

    recorder = StatsRecorder("n1")
    recorder.note_residency({tenant_a.id: (1, 3)})
    recorder.count_eviction("L2", tenant_a.id)
    recorder.count_eviction("L3", tenant_a.id)
    recorder.count_eviction("L1", tenant_a.id)  # an unpin is no eviction
    recorder.flush()
    recorder.note_residency({tenant_a.id: (1, 3)})  # unchanged: nothing to write
    recorder.flush()
    assert CacheMinute.objects.count() == 1
    row = CacheMinute.objects.get()
    assert (row.evictions_l2, row.evictions_l3, row.hot, row.warm) == (1, 1, 1, 3)

    # an hour later the tenant's residency is remembered by the chart, then drops to nothing
    CacheMinute.objects.update(minute=row.minute - timedelta(hours=2))
    recorder.note_residency({tenant_b.id: (0, 1)})  # tenant A has nothing left: written as 0
    recorder.flush()
    data = dashboards.cache_series(dashboards.RANGES["hour"], tenant=tenant_a)
    assert data["warm"] == [0] and data["evictions_l2"] == [0]
    day = dashboards.cache_series(dashboards.RANGES["day"], tenant=tenant_a)
    assert day["warm"] == [3, 0] and day["evictions_l2"] == [1, 0] and day["hot"] == [1, 0]
    everyone = dashboards.cache_series(dashboards.RANGES["day"])
    assert sum(everyone["evictions_l3"]) == 1 and everyone["warm"] == []


def test_the_platform_series_is_the_sum_of_every_tenants_and_reads_one_row_per_step(
    tenant_a, tenant_b, django_assert_max_num_queries
):
    """The operator's charts read the platform-wide rows; they plot what the tenants' rows
    add up to, in every range (minute, 5-minute and hourly steps)."""

    now = datetime(2026, 7, 4, 12, 0, tzinfo=UTC)
    records = []
    for minute in range(150):  # two and a half hours, two tenants and the anonymous row
        at = now - timedelta(minutes=minute, seconds=-5)
        records.append(_record(tenant_a.id, at, ttft_ms=5 + minute % 40))
        if minute % 3 == 0:
            records.append(_record(tenant_b.id, at, ttft_ms=300, tier="L3", load_ms=90))
        if minute % 7 == 0:
            records.append(_record(None, at, status=401))
    write_records("n1", records[: len(records) // 2])
    write_records("n2", records[len(records) // 2 :])  # two nodes' batches add up
    later = now + timedelta(minutes=2)
    for key in ("hour", "day", "week", "90d"):
        rng = dashboards.RANGES[key]
        platform = dashboards.series(dashboards.PLATFORM, rng, now=later)
        every_row = dashboards.series(dashboards.ALL_ROWS, rng, now=later)
        assert platform == every_row, key
        tenants = [
            dashboards.series(dashboards.scope(tenant=t), rng, now=later)
            for t in (tenant_a, tenant_b)
        ]
        anonymous = dashboards.series(Q(tenant=None), rng, now=later)
        per_step: dict[str, int] = {}
        for part in (*tenants, anonymous):
            for t, n in zip(part["t"], part.get("requests", []), strict=True):
                per_step[t] = per_step.get(t, 0) + n
        assert dict(zip(platform["t"], platform["requests"], strict=True)) == per_step, key
    steps = dict(PlatformRollup.objects.values_list("step_s").annotate(n=Sum("requests")))
    assert steps == {60: len(records), 300: len(records), 3600: len(records)}
    with django_assert_max_num_queries(2):  # the series and its totals
        dashboards.series(dashboards.PLATFORM, dashboards.RANGES["day"], now=later)


def test_rebuilding_the_platform_rows_from_minutes_gives_what_was_written(tenant_a, tenant_b):
    from apps.telemetry.writers import rebuild_platform_rollups

    now = datetime(2026, 7, 4, 12, 0, tzinfo=UTC)
    write_records(
        "n1", [_record(tenant_a.id, now + timedelta(minutes=m), ttft_ms=m) for m in range(70)]
    )
    write_records(
        "n1", [_record(tenant_b.id, now + timedelta(minutes=m), ttft_ms=99) for m in range(9)]
    )
    fields = ["step_s", "start", "requests", "ttft_count", "ttft_ms_max", "ttft_b03", "hits_l1"]
    written = sorted(PlatformRollup.objects.values_list(*fields))
    assert len(written) == 70 + 14 + 2  # minutes, 5-minute steps, hours
    rebuild_platform_rollups()
    assert sorted(PlatformRollup.objects.values_list(*fields)) == written


@pytest.mark.parametrize(
    ("ages_min", "expected", "platform"),
    [
        ((), "day", "week"),  # tenant a has nothing at all; tenant b's request is 2 days old
        ((3, 40), "hour", "hour"),  # a fresh install's first minutes
        ((3, 200), "day", "day"),
        ((60 * 30,), "week", "week"),  # quiet for a day, busy yesterday
        ((60 * 24 * 20,), "90d", "week"),
    ],
)
def test_a_dashboard_opens_on_the_range_that_holds_its_data(
    tenant_a, tenant_b, ages_min, expected, platform
):
    from apps.telemetry.writers import rebuild_rollups

    now = datetime.now(UTC)
    write_records("n1", [_record(tenant_a.id, now - timedelta(minutes=m)) for m in ages_min])
    write_records("n1", [_record(tenant_b.id, now - timedelta(days=2, minutes=5))])
    rebuild_rollups()
    assert dashboards.default_range(dashboards.scope(tenant=tenant_a)).key == expected
    assert dashboards.default_range(dashboards.PLATFORM).key == platform


@pytest.mark.django_db
def test_a_tenant_sees_its_queue_wait_and_its_share_of_the_engine_against_its_weight(
    tenant_a, tenant_b
):
    """tenant-a (premium, weight 2) and tenant-b (standard, 1) in one minute: a's fair share
    is 2/3; it got 100 of 150 weighted tokens (input once, output twice)."""
    from apps.telemetry import charts
    from apps.telemetry.engine_share import engine_share

    now = datetime.now(UTC).replace(second=30)
    write_records(
        "n1",
        [
            _record(
                tenant_a.id, now, ttft_ms=8, queue_ms=3, prompt_tokens=20, completion_tokens=40
            ),
            _record(tenant_a.id, now, ttft_ms=8, queue_ms=400),
            _record(tenant_b.id, now, ttft_ms=8, prompt_tokens=10, completion_tokens=20),
        ],
    )
    rng = dashboards.RANGES["hour"]
    share = engine_share(tenant_a, rng)
    assert share["share"] == [round(100 / 150, 4)]
    assert share["fair"] == [round(2 / 3, 4)]
    assert engine_share(tenant_b, rng)["fair"] == [round(1 / 3, 4)]
    data = dashboards.series(dashboards.scope(tenant=tenant_a), rng)
    assert 250 < data["queue_p95"][0] <= 500  # the 400 ms wait, read from its bucket
    figures = charts.engine(data, share)
    assert figures["chart-engine-share"]["data"][1]["y"] == [round(2 / 3, 4)]
