"""The operator's replay page: a replay runs as a Celery task in a real worker, its report is
shown and plotted, and a chosen policy and capacities go to the cache configuration."""

from __future__ import annotations

import pytest

from apps.serving import config
from apps.serving.models import ReplayRun
from apps.serving.replay.run import Spec
from apps.serving.replay_views import ReplayForm
from apps.tenants.models import AuditEvent
from tests.harness.waiting import wait_until
from tests.helpers import user_client
from tests.serving.replay.specs import SMALL


def wait_until_finished(run_id: int, seconds: float = 60) -> ReplayRun:
    return wait_until(
        lambda: ReplayRun.objects.get(pk=run_id),
        f"replay {run_id} to finish",
        seconds,
        0.2,
        until=lambda row: row.state in (ReplayRun.State.DONE, ReplayRun.State.FAILED),
        describe=lambda row: f"{row.state} at {row.step!r}",
    )


@pytest.mark.django_db(transaction=True)
def test_a_replay_runs_in_the_worker_and_its_policy_can_be_applied(celery_worker, operator):
    otto = user_client("otto", "otto-pass-123")
    assert otto.get("/operator/replay/").status_code == 200
    response = otto.post("/operator/replay/", SMALL)
    assert response.status_code == 302
    run_id = int(response["Location"].rstrip("/").rsplit("/", 1)[1])
    row = wait_until_finished(run_id)
    assert row.state == ReplayRun.State.DONE, row.error
    assert row.progress == 1.0
    report = row.report
    assert set(report["policies"]) == {"weighted", "lru", "lfu"}
    assert report["optimum"]["kind"] == "Belady MIN"
    for run in report["policies"].values():  # no policy beats the bound
        assert run["hit_rate"] <= report["optimum"]["hit_rate"]
        assert sum(run["tier_rates"].values()) == pytest.approx(1.0)
    # a generated trace also gets the online ceiling, which foresight (Belady) beats
    ceiling = report["optimum"]["known_popularity_hit_rate"]
    assert 0 < ceiling < report["optimum"]["hit_rate"]
    assert report["sweeps"]["l2"]["values"] == [4, 8, 16, 32, 64, 128, 256]

    page = otto.get(f"/operator/replay/{run_id}/").content.decode()
    for name in ("weighted", "lru", "lfu", "Belady MIN"):
        assert name in page
    assert "A0</strong>, which knows the trace's popularity" in page.replace("&#x27;", "'")
    assert 'id="replay-tenants"' in page  # per-tenant hit rate and TTFT under each policy
    # which load costs the TTFT column used (no node has measured any here)
    assert "bench/load_tiers.py&#x27;s medians (no node measurements)" in page
    rows = [page.index(f'data-policy="{p}"') for p in ("weighted", "lru", "lfu")]
    assert rows == sorted(rows)  # as asked, the default first (jsonb keeps no key order)
    data = otto.get(f"/operator/replay/{run_id}/data").json()
    assert data["state"] == "done"
    assert set(data["figures"]) == {
        "chart-replay-tiers",
        "chart-replay-reload",
        "chart-replay-ttft",
        "chart-replay-sweep",
    }
    tiers = data["figures"]["chart-replay-tiers"]["data"]
    l1 = next(trace for trace in tiers if trace["name"] == "L1")
    assert l1["y"] == [report["policies"][p]["tier_rates"]["L1"] for p in l1["x"]]
    a0 = next(trace for trace in tiers if trace["name"].startswith("A0"))
    assert set(a0["y"]) == {ceiling}

    applied = otto.post(f"/operator/replay/{run_id}/apply", {"policy": "lfu"})
    assert applied.status_code == 302 and applied["Location"] == "/operator/cache/"
    cache = config.effective_config().adapter_cache
    assert cache.gpu_hot.eviction_policy == "lfu"
    assert (cache.gpu_hot.max_adapters, cache.cpu_warm.max_adapters) == (4, 12)
    event = AuditEvent.objects.filter(action="cache_config.set").latest("id")
    assert event.after["adapter_cache"]["gpu_hot"]["eviction_policy"] == "lfu"


@pytest.mark.django_db
def test_bad_fields_are_shown_beside_them_and_nothing_starts(operator):
    otto = user_client("otto", "otto-pass-123")
    response = otto.post("/operator/replay/", {**SMALL, "l1": "32", "requests": "many"})
    assert response.status_code == 422
    page = response.content.decode()
    assert "L1 slots cannot exceed L2 slots" in page
    assert "Enter a whole number" in page
    assert not ReplayRun.objects.exists()


@pytest.mark.django_db
def test_a_replay_can_start_from_a_prewarmed_disk_as_the_bench_s_node_does(operator):
    otto = user_client("otto", "otto-pass-123")
    assert 'name="warm_disk"' in otto.get("/operator/replay/").content.decode()
    unticked = ReplayForm({**SMALL, "l3_gb": "1"})
    assert unticked.is_valid(), unticked.errors
    assert not unticked.spec().capacity.warm_disk  # an empty disk unless asked
    form = ReplayForm({**SMALL, "l3_gb": "1", "warm_disk": "on"})
    assert form.is_valid(), form.errors
    spec = Spec.from_json(form.spec().to_json())  # as the worker reads it back
    assert spec.capacity.warm_disk
    assert spec.capacity.describe().endswith("L3 1024 MB (prewarmed)")


@pytest.mark.django_db
def test_a_policy_outside_the_run_or_an_unfinished_run_changes_nothing(operator):
    otto = user_client("otto", "otto-pass-123")
    row = ReplayRun.objects.create(spec={"capacity": {"l1_slots": 4, "l2_slots": 12}})
    before = config.effective_config()
    response = otto.post(f"/operator/replay/{row.pk}/apply", {"policy": "lru"}, follow=True)
    assert "Pick one of this finished run" in response.content.decode()
    assert config.effective_config() == before
    assert not AuditEvent.objects.filter(action="cache_config.set").exists()


@pytest.mark.django_db
def test_the_trace_file_is_the_server_s_never_a_path_from_the_form(operator, tmp_path, settings):
    settings.LORAHUB_TRACES_DIR = tmp_path  # no Azure trace here: not offered
    otto = user_client("otto", "otto-pass-123")
    assert b'value="azure"' not in otto.get("/operator/replay/").content
    response = otto.post("/operator/replay/", {**SMALL, "source": "csv", "path": "/etc/passwd"})
    assert response.status_code == 422  # csv is no choice; and "path" is no field
    assert not ReplayRun.objects.exists()


@pytest.mark.django_db
def test_the_replay_pages_are_for_operators_only(tenant_a):
    member_client = user_client("alice", "alice-pass-123")  # tenant A's admin
    for url in ("/operator/replay/", "/operator/replay/1/", "/operator/replay/1/data"):
        assert member_client.get(url).status_code == 404
    assert member_client.post("/operator/replay/1/apply", {"policy": "lru"}).status_code == 404


def test_the_replay_takes_the_load_costs_the_nodes_measured_and_says_so(tenant_a):
    """Without measurements the bench's costs; with them, the medians of the platform's load
    histograms (L4 minus L3: a load from L4 includes the L3 steps) and of L1 hits' TTFT."""
    from datetime import UTC, datetime

    from apps.serving.replay.report import policy_table
    from apps.serving.replay.run import Spec, TraceSpec, execute
    from apps.serving.replay.simulate import Costs
    from apps.telemetry.records import RequestRecord
    from apps.telemetry.requestlog import costs_from_log
    from apps.telemetry.writers import write_records

    assert costs_from_log() == Costs()
    now = datetime.now(UTC)

    def record(tier: str, ttft_ms: float, load_ms: float = 0.0) -> RequestRecord:
        return RequestRecord(
            tenant_id=tenant_a.id, at=now, alias="support", adapter_id="support",
            version="1", tier=tier, status=200, ttft_ms=ttft_ms, load_ms=load_ms,
        )  # fmt: skip

    write_records(
        "n1",
        [record("L1", 20.0) for _ in range(9)]
        + [record("L3", 120.0, load_ms=90.0) for _ in range(5)]
        + [record("L4", 400.0, load_ms=300.0) for _ in range(3)],
    )
    costs = costs_from_log()
    assert costs.base_ttft_ms == 20.0
    assert 80 <= costs.l3_ms <= 100  # inside the bucket that holds 90 ms
    assert 250 - 100 <= costs.l4_ms <= 500 - 80  # the bucket holding 300 ms, less L3's
    assert costs.l3_ms_per_mb == costs.l4_ms_per_mb == 0.0
    assert costs.source.startswith("measured by the nodes")
    report = execute(Spec(trace=TraceSpec(requests=500), policies=("weighted",), costs=costs))
    assert "load costs: base TTFT 20 ms" in policy_table(report)
    assert "measured by the nodes" in policy_table(report)


def test_the_replay_fits_each_tier_s_cost_to_the_loads_bytes_and_times(tenant_a):
    """With the loads' own work logged (no waits for a load slot), a tier's cost is fixed +
    per MB, fitted to the sizes of the versions loaded: at the seeds' scale sizes differ
    2-4x and so do their loads. L4's is the landing on top of L3's check and add."""
    from datetime import UTC, datetime

    from apps.registry.models import Adapter, AdapterVersion
    from apps.telemetry.records import RequestRecord
    from apps.telemetry.requestlog import costs_from_log, fit_cost
    from apps.telemetry.writers import write_records

    mb = 1 << 20
    adapter = Adapter.objects.create(tenant=tenant_a, adapter_id="seed")
    sizes = {"1": 20, "2": 40, "3": 80}  # MB
    for version, size in sizes.items():
        AdapterVersion.objects.create(adapter=adapter, version=version, size_bytes=size * mb)
    now = datetime.now(UTC)

    def load(tier: str, version: str, work_ms: float) -> RequestRecord:
        return RequestRecord(
            tenant_id=tenant_a.id, at=now, alias="seed", adapter_id="seed", version=version,
            tier=tier, status=200, ttft_ms=work_ms + 30, load_ms=work_ms + 50,
            load_work_ms=work_ms,
        )  # fmt: skip

    rows = []
    for version, size in sizes.items():
        for noise in (-1.0, 0.0, 1.0, 40.0):  # one slow load per version: the median holds
            rows.append(load("L3", version, 5 + 0.5 * size + noise))
            rows.append(load("L4", version, 40 + 1.5 * size + noise))
    write_records("n1", rows)

    costs = costs_from_log()
    assert costs.l3_ms == pytest.approx(5, abs=1)
    assert costs.l3_ms_per_mb == pytest.approx(0.5, abs=0.05)
    assert costs.l4_ms == pytest.approx(35, abs=1.5)  # 40 less L3's 5
    assert costs.l4_ms_per_mb == pytest.approx(1.0, abs=0.05)
    assert "L4 fitted to 12 loads" in costs.source
    assert fit_cost([(40 * mb, 10.0)] * 4) is None  # too few to say
    assert fit_cost([(40 * mb, 10.0)] * 6) == (10.0, 0.0)  # one size: no slope to tell
