"""Evaluation sets: JSONL cases validated whole on upload (the line and field of the first
problem, nothing stored), kept as immutable revisions, judged by their expectations."""

from __future__ import annotations

import pytest

from apps.evaluations import cases as evaluation
from apps.evaluations.models import EvaluationRun, EvaluationSet, EvaluationSetRevision
from apps.tenants.models import AuditEvent
from tests.evaluations.sets import GOOD, jsonl, upload
from tests.helpers import key_client


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "x"', "line 2: not valid JSON"),
        ('["x"]', "line 2: a case is a JSON object"),
        ('{"prompt": "x", "expect": {"startswith": "a"}}', "line 2: field 'expect.startswith'"),
        ('{"prompt": "x", "expect": {"regex": "(a+)+$"}}', "backtracks catastrophically"),
        ('{"prompt": "x", "expect": {"regex": "(unclosed"}}', "not a valid regular expression"),
        ('{"prompt": "x", "expect": {"json_schema": {"type": 5}}}', "not a valid JSON Schema"),
        ('{"prompt": "x", "params": {"max_tokens": 100000}}', "field 'params.max_tokens'"),
        ('{"prompt": "x", "params": {"logit_bias": {}}}', "unknown sampling parameter"),
        ('{"prompt": "x", "messages": []}', "either 'prompt'"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "field 'messages[0].role'"),
        ('{"id": "one", "prompt": "x"}', "'one' is also the id of line 1"),
    ],
)
def test_a_bad_line_is_named_with_its_field(line, message):
    with pytest.raises(evaluation.InvalidEvaluationSet) as refused:
        evaluation.parse_cases(jsonl({"id": "one", "prompt": "a"}, line))
    assert message in refused.value.message


def test_limits_are_stated_in_the_refusal():
    too_big = b"x" * (evaluation.MAX_BYTES + 1)
    with pytest.raises(evaluation.InvalidEvaluationSet, match="the limit is 1,048,576 bytes"):
        evaluation.parse_cases(too_big)
    too_many = jsonl(*({"prompt": "p"} for _ in range(evaluation.MAX_CASES + 1)))
    with pytest.raises(evaluation.InvalidEvaluationSet, match=f"line {evaluation.MAX_CASES + 1}"):
        evaluation.parse_cases(too_many)
    with pytest.raises(evaluation.InvalidEvaluationSet, match="no cases"):
        evaluation.parse_cases(b"\n\n")


def test_cases_get_greedy_defaults_and_expectations_judge_answers():
    parsed = evaluation.parse_cases(jsonl(*GOOD))
    assert [c.id for c in parsed] == ["thanks", "line-2", "line-3", "line-4"]
    assert parsed[0].params == {"max_tokens": 64, "temperature": 0.0}
    assert parsed[1].params["max_tokens"] == 8
    assert evaluation.judge(parsed[0], "Thank you for contacting support.") == {"contains": True}
    assert evaluation.judge(parsed[0], "Hello from the helpdesk team!") == {"contains": False}
    assert evaluation.judge(parsed[2], "Sorry, we can") == {"regex": True, "not_contains": True}
    assert evaluation.judge(parsed[2], "we cannot") == {"regex": False, "not_contains": False}
    assert evaluation.judge(parsed[3], '{"a": 1}') == {"json_schema": True}
    assert evaluation.judge(parsed[3], '{"b": 1}') == {"json_schema": False}
    assert evaluation.judge(parsed[3], "not json") == {"json_schema": False}


def test_sets_are_stored_as_immutable_revisions_and_audited(tenant_a, support_versions):
    client = key_client(tenant_a)
    first = upload(client, jsonl(*GOOD))
    assert first.status_code == 201, first.content
    assert (first.json()["revision"], first.json()["case_count"]) == (1, 4)
    assert upload(client, jsonl(*GOOD)).status_code == 200  # the same bytes: no new revision
    second = upload(client, jsonl(*GOOD[:2]))
    assert (second.status_code, second.json()["revision"]) == (201, 2)
    assert EvaluationSetRevision.objects.get(revision=1).case_count == 4  # unchanged
    listed = client.get("/api/adapters/support/evaluation-sets").json()
    assert [(s["name"], s["revisions"], s["latest"]["revision"]) for s in listed] == [
        ("smoke", 2, 2)
    ]
    detail = client.get(f"/api/evaluation-sets/{first.json()['id']}").json()
    assert detail["cases"][0]["expect"] == {"contains": ["Thank"]}
    assert AuditEvent.objects.filter(action="evaluation_set.uploaded").count() == 2


@pytest.mark.parametrize(
    "body",
    [
        jsonl(GOOD[0], '{"prompt": "x", "expect": {"regex": "(x+x+)+y"}}'),
        jsonl(GOOD[0], '{"prompt": "x", "expect": {"json_schema": {"type": "nope"}}}'),
        jsonl(GOOD[0], "{not json"),
        b"x" * (evaluation.MAX_BYTES + 1),
    ],
    ids=["catastrophic regex", "not JSON Schema", "bad JSON line", "over the size limit"],
)
def test_a_bad_set_is_a_400_that_stores_nothing(tenant_a, support_versions, body):
    answer = upload(key_client(tenant_a), body)
    assert answer.status_code == 400, answer.content
    assert answer.json()["code"] == "invalid_evaluation_set"
    assert "line 2" in answer.json()["detail"] or "limit" in answer.json()["detail"]
    assert not EvaluationSet.objects.exists() and not EvaluationSetRevision.objects.exists()
    assert not AuditEvent.objects.filter(action="evaluation_set.uploaded").exists()


def test_other_tenants_cannot_see_or_use_a_tenants_sets(tenant_a, tenant_b, support_versions):
    revision = upload(key_client(tenant_a), jsonl(*GOOD)).json()
    other = key_client(tenant_b)
    assert other.get(f"/api/evaluation-sets/{revision['id']}").status_code == 404
    assert other.get("/api/adapters/support/evaluation-sets").json() == []
    assert upload(other, jsonl(*GOOD)).status_code == 404  # tenant B has no 'support'
    started = other.post(
        "/api/evaluations",
        {"candidate_version_id": support_versions["v2"], "set_revision_id": revision["id"]},
        content_type="application/json",
    )
    assert started.status_code == 404
    assert not EvaluationRun.objects.exists()


def test_a_run_needs_approved_versions_of_the_sets_adapter_and_a_baseline(
    tenant_a, support_versions
):
    client = key_client(tenant_a)
    revision = upload(client, jsonl(*GOOD)).json()

    def start(**body):
        return client.post(
            "/api/evaluations",
            {"set_revision_id": revision["id"], **body},
            content_type="application/json",
        )

    no_alias = start(candidate_version_id=support_versions["v2"])
    assert no_alias.status_code == 422
    assert "has no alias to compare with" in no_alias.json()["detail"]
    client.put(
        "/api/aliases/support",
        {"version_id": support_versions["v1"]},
        content_type="application/json",
    )
    same = start(candidate_version_id=support_versions["v1"])
    assert "already what the alias serves" in same.json()["detail"]
    assert not EvaluationRun.objects.exists()


def test_a_reviewer_reads_other_tenants_runs_but_starts_none_on_their_versions(
    tenant_a, support_versions, reviewer, operator
):
    """docs/security.md: a run spends the tenant's share of a node and is audited under the
    tenant, so only its members and operators start one; reviewers read them."""
    from tests.helpers import user_client

    member = key_client(tenant_a)
    revision = upload(member, jsonl(*GOOD)).json()
    member.put(
        "/api/aliases/support",
        {"version_id": support_versions["v1"]},
        content_type="application/json",
    )
    body = {"set_revision_id": revision["id"], "candidate_version_id": support_versions["v2"]}
    rita = user_client("rita", "rita-pass-123")
    refused = rita.post("/api/evaluations", body, content_type="application/json")
    assert refused.status_code == 403
    assert "only its members and operators" in refused.json()["detail"]
    assert not EvaluationRun.objects.exists()
    assert not AuditEvent.objects.filter(action="evaluation.started").exists()
    otto = user_client("otto", "otto-pass-123")
    started = otto.post("/api/evaluations", body, content_type="application/json")
    assert started.status_code == 202, started.content
    # the reviewer still reads it
    assert rita.get(f"/api/evaluations/{started.json()['id']}").status_code == 200
