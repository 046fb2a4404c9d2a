"""One definition of an error (apps/telemetry/outcomes.py) from the request log to the gate and the
chart: a release during which one caller is throttled and another sends bad requests is judged
on server failures alone, its chart plots the number the gate judged, shows the callers' 4xx and
429s as series of their own, and ends where the release ended."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from apps.registry import aliases
from apps.registry.models import AdapterVersion
from apps.releases import charts, services
from apps.releases.models import Release
from apps.telemetry import dashboards, outcomes
from apps.telemetry.models import RequestMinute
from apps.telemetry.outcomes import Outcome
from apps.tenants.auth import principal_for_user
from tests.helpers import record_requests

pytestmark = pytest.mark.django_db

PLAN = {
    "interval_s": 1,
    "prewarm": False,
    "canary_max_error_increase": 0.05,
    "canary_steps": [{"percent": 100, "dwell_s": 1, "min_requests": 5}],
}


record = record_requests  # tests/helpers.py


@pytest.mark.parametrize(
    ("status", "finish", "outcome"),
    [
        (200, "stop", Outcome.OK),
        (200, "error", Outcome.SERVER_FAILURE),
        (503, "", Outcome.SERVER_FAILURE),
        (500, "", Outcome.SERVER_FAILURE),
        (400, "", Outcome.CALLER_ERROR),
        (404, "", Outcome.CALLER_ERROR),
        (429, "", Outcome.THROTTLED),
        (499, "", Outcome.CANCELLED),
    ],
)
def test_the_one_definition_and_its_query_agree(status, finish, outcome, tenant_a):
    from apps.telemetry.models import RequestLog

    assert outcomes.classify(status, finish) is outcome
    RequestLog.objects.create(
        at=timezone.now(), node="n", status=status, finish_reason=finish, tenant=tenant_a
    )
    matching = [o for o in Outcome if RequestLog.objects.filter(outcomes.q(o)).exists()]
    assert matching == [outcome]


def test_a_release_is_judged_and_plotted_on_server_failures_alone(support_versions, tenant_a):
    alice = principal_for_user(get_user_model().objects.get(username="alice"))
    alias = aliases.set_alias(
        principal=alice, tenant=tenant_a, name="support", version_id=support_versions["v1"]
    )
    release = services.start(
        principal=alice,
        alias=alias,
        candidate=AdapterVersion.objects.get(pk=support_versions["v2"]),
        plan=PLAN,
    )
    Release.objects.filter(pk=release.pk).update(
        step_started_at=timezone.now() - timedelta(seconds=2)
    )
    now = timezone.now()  # one moment for every row: one minute's bucket, whatever the clock
    record(tenant_a, "v1", 30, at=now)
    record(tenant_a, "v2", 18, at=now)
    record(tenant_a, "v2", 1, status=503, at=now)  # the one server failure
    record(tenant_a, "v2", 6, status=429, at=now)  # a caller over its rate limit
    record(tenant_a, "v2", 5, status=400, at=now)  # a caller sending bad requests
    assert services.judge(release.pk) == "advance"
    release.refresh_from_db()
    assert release.state == "promoted", release.outcome
    gate = {g["gate"]: g for g in release.last_check["gates"]}["canary error rate"]
    assert gate["verdict"] == "pass" and gate["value"] == round(1 / 30, 4)
    assert "not judged: 5 caller errors, 6 throttled" in gate["detail"]

    # after the release, the alias gets bad requests: not the release's story
    record(tenant_a, "v2", 20, status=400, at=release.finished_at + timedelta(minutes=2))

    figures = charts.figures(release)
    errors = figures["chart-release-errors"]
    judged = next(t for t in errors["data"] if "the canary gate's value" in t["name"])
    assert judged["y"] == [gate["value"]]  # the very number the gate judged
    per_minute = next(t for t in errors["data"] if t["name"] == "support@v2 per minute")
    assert per_minute["y"] == [pytest.approx(1 / 30)]
    callers = {t["name"]: t["y"] for t in figures["chart-release-callers"]["data"]}
    assert callers["support@v2 caller errors"] == [pytest.approx(5 / 30)]
    assert callers["support@v2 throttled"] == [pytest.approx(6 / 30)]
    assert callers["support@v1 caller errors"] == [0.0]
    end = release.finished_at.isoformat()
    for figure in figures.values():
        start, shown_until = figure["layout"]["xaxis"]["range"]
        assert start == release.created_at.isoformat()
        # the axis ends a moment after the release (its last marker stays inside), the data
        # at its end
        assert end < shown_until <= (release.finished_at + timedelta(seconds=2)).isoformat()
        for trace in figure["data"]:
            assert all(start <= x <= end for x in trace["x"]), trace["name"]
    labels = [(n["text"], n["y"]) for n in errors["layout"]["annotations"]]
    assert [text for text, _ in labels] == ["step 1", "promoted"]
    assert len({y for _, y in labels}) == 2  # seconds apart, on rows of their own


def test_dashboards_plot_server_failures_with_callers_apart(tenant_a):
    # the middle of the last whole minute: every row in one bucket, whenever the test runs
    # (rows written on both sides of a minute's end once gave ``[0.2, 0.0]``)
    at = timezone.now().replace(second=30, microsecond=0) - timedelta(minutes=1)
    record(tenant_a, "v1", 8, at=at)
    record(tenant_a, "v1", 2, status=503, at=at)
    record(tenant_a, "v1", 5, status=429, at=at)
    record(tenant_a, "v1", 5, status=404, at=at)
    where = dashboards.scope(tenant=tenant_a)
    data = dashboards.series(where, dashboards.RANGES["hour"])
    assert data["server_failure_rate"] == [0.1]
    assert data["caller_error_rate"] == [0.25]
    assert data["throttled_rate"] == [0.25]
    assert data["totals"]["error_rate"] == pytest.approx(0.1)  # never 0.6
    platform = dashboards.series(dashboards.scope(), dashboards.RANGES["hour"])
    assert platform["server_failures"] == [2] and platform["throttled"] == [5]


def test_minutes_counted_before_the_outcomes_show_a_gap_not_a_wrong_rate(tenant_a):
    record(tenant_a, "v1", 10, status=429)
    RequestMinute.objects.update(legacy_minutes=1, server_failures=0, throttled=0)
    data = dashboards.series(dashboards.scope(tenant=tenant_a), dashboards.RANGES["hour"])
    assert data["server_failure_rate"] == [None]
    assert data["totals"]["error_rate"] is None
