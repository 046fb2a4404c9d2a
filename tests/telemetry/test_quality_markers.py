"""Output-quality markers: how an answer finished, empty answers, refusals, and JSON that does
not parse or match its schema — judged per request, rolled up per version, and shown beside
error rate and TTFT (the dashboards and the canary evidence)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model

from apps.registry import aliases
from apps.serving.node.generation import Generation
from apps.telemetry import dashboards, quality
from apps.telemetry.evidence import canary_evidence
from apps.telemetry.models import RequestLog, RequestMinute, RequestRollup
from apps.telemetry.records import RequestRecord
from apps.telemetry.writers import write_records
from apps.tenants.auth import principal_for_user

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def test_only_a_response_format_that_asks_for_json_is_judged_as_json():
    assert quality.json_wanted({"model": "m"}) is None
    assert quality.json_wanted({"response_format": {"type": "text"}}) is None
    assert quality.json_wanted({"response_format": "json"}) is None  # not the API's shape
    assert quality.json_wanted({"response_format": {"type": "json_object"}}) == (
        quality.JsonWanted()
    )
    wanted = quality.json_wanted(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}}
    )
    assert wanted is not None and json.loads(wanted.schema) == SCHEMA


@pytest.mark.parametrize(
    ("texts", "schema", "valid", "matches"),
    [
        (['{"answer": "yes"}'], None, True, None),
        (['{"answer": "ye'], None, False, None),  # cut mid-object
        ([""], None, False, None),
        (['{"answer": "yes"}'], SCHEMA, True, True),
        (['{"reply": "yes"}'], SCHEMA, True, False),  # parses, misses the required key
        (['{"answer": 1}', '{"answer": "b"}'], SCHEMA, True, False),  # one choice of two
        (["not json"], SCHEMA, False, False),
    ],
)
def test_json_answers_are_judged_on_every_choice(texts, schema, valid, matches):
    wanted = quality.JsonWanted(json.dumps(schema) if schema else None)
    assert quality.judge_json(texts, wanted) == quality.JsonVerdict(valid, matches)


def test_a_schema_that_is_not_json_schema_judges_only_parsing():
    wanted = quality.JsonWanted(json.dumps({"type": "no-such-type"}))
    assert quality.judge_json(['{"a": 1}'], wanted) == quality.JsonVerdict(True, None)


def test_a_generation_knows_how_its_choices_finished_from_streamed_deltas():
    streamed = Generation(keep_text=True)
    for piece, reason in (('{"ans', None), ('wer": ', None), ('"x"}', "stop")):
        streamed.saw("r1", 0, piece, reason, delta=True)
    assert (streamed.finish_reason, streamed.empty_output) == ("stop", False)
    assert streamed.texts() == ['{"answer": "x"}']

    cut = Generation()  # cumulative outputs, two choices: one cut, one empty
    cut.saw("r1", 0, "Hel", None, delta=False)
    cut.saw("r1", 0, "Hello", "length", delta=False)
    cut.saw("r1", 1, "", "stop", delta=False)
    assert (cut.finish_reason, cut.empty_output) == ("length", True)
    assert cut.texts() == ["", ""]  # text is kept only when JSON was asked for

    assert (Generation().finish_reason, Generation().empty_output) == ("", False)


def _record(tenant_id, at, **fields):
    base = {"alias": "support", "adapter_id": "support", "version": "v1", "tier": "L1"}
    return RequestRecord(tenant_id=tenant_id, at=at, **{"status": 200, **base, **fields})


MARKED = [
    dict(finish_reason="stop"),
    dict(finish_reason="length"),
    dict(finish_reason="length", json_requested=True, json_valid=False),
    dict(finish_reason="stop", json_requested=True, json_valid=True, json_matches=False),
    dict(finish_reason="stop", empty_output=True),
    dict(status=400, error="invalid_request", refused=True),
    dict(status=503, error="engine_unavailable", finish_reason="error"),
]


def test_markers_are_logged_per_request_and_counted_in_every_rollup(tenant_a):
    at = datetime(2026, 7, 4, 12, 0, 30, tzinfo=UTC)
    write_records("n1", [_record(tenant_a.id, at, **m) for m in MARKED])
    row = RequestMinute.objects.get()
    counted = {name: getattr(row, name) for name in dashboards.MARKERS}
    assert counted == {
        "finish_stop": 3,
        "finish_length": 2,
        "finish_error": 1,
        "empty_outputs": 1,
        "refused": 1,
        "json_requests": 2,
        "json_invalid": 1,
        "json_mismatched": 1,
    }
    for step in (300, 3600):
        rollup = RequestRollup.objects.get(step_s=step)
        assert {name: getattr(rollup, name) for name in dashboards.MARKERS} == counted
    logged = RequestLog.objects.filter(finish_reason="length").order_by("id")
    assert [r.json_valid for r in logged] == [None, False]
    assert RequestLog.objects.get(refused=True).status == 400


def test_dashboards_show_marker_shares_per_step_and_per_version(tenant_a, support_versions):
    now = datetime.now(UTC).replace(second=30, microsecond=0)
    write_records(
        "n1",
        [_record(tenant_a.id, now, version="v1", finish_reason="stop") for _ in range(4)]
        + [
            _record(tenant_a.id, now, version="v2", **m)
            for m in MARKED[1:4]  # two cut, one of them invalid JSON; one not matching
        ],
    )
    hour = dashboards.RANGES["hour"]
    later = now + timedelta(minutes=1)
    data = dashboards.series(dashboards.scope(tenant=tenant_a), hour, now=later)
    assert data["cut_share"] == [round(2 / 7, 2)]  # shares go to the charts rounded
    assert data["json_invalid_share"] == [0.5]  # of the two requests that asked for JSON
    assert data["totals"]["cut_rate"] == pytest.approx(2 / 7)
    rows = dashboards.by_version(hour, tenant=tenant_a, adapter_id="support", now=now)
    assert [r["version"] for r in rows] == ["v2", "v1"]  # newest upload first
    newest, oldest = rows
    assert (newest["cut_rate"], newest["json_invalid_rate"]) == (pytest.approx(2 / 3), 0.5)
    assert newest["json_mismatched_rate"] == 0.5
    assert (oldest["cut_rate"], oldest["json_invalid_rate"]) == (0.0, None)


def test_the_canary_evidence_sets_stable_and_canary_markers_side_by_side(
    tenant_a, support_versions
):
    principal = principal_for_user(get_user_model().objects.get(username="alice"))
    common = {"principal": principal, "tenant": tenant_a, "name": "support"}
    aliases.set_alias(**common, version_id=support_versions["v1"])
    alias = aliases.set_canary(**common, version_id=support_versions["v2"], percent=10)
    now = datetime.now(UTC)
    write_records(
        "n1",
        [
            _record(tenant_a.id, now, version="v1", finish_reason="stop"),
            _record(tenant_a.id, now, version="v2", finish_reason="length", empty_output=True),
        ],
    )
    evidence = canary_evidence(alias)
    assert (evidence["stable"]["cut_rate"], evidence["canary"]["cut_rate"]) == (0.0, 1.0)
    assert (evidence["stable"]["empty_rate"], evidence["canary"]["empty_rate"]) == (0.0, 1.0)
