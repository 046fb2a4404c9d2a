"""Evaluation runs on the real stack: a Celery worker asks the serving node (vLLM on the demo
model) for each case's answer from the candidate and the baseline, through the node's own
request path, and judges them."""

from __future__ import annotations

import pytest

from apps.demo import corpus
from tests.evaluations.sets import jsonl, thank_you_cases, upload
from tests.harness.waiting import wait_until
from tests.helpers import key_client

pytestmark = pytest.mark.engine
V1, V2 = corpus.PHRASES["support-v1"], corpus.PHRASES["support-v2"]


def finished(client, run_id: int, seconds: float = 180) -> dict:
    return wait_until(
        lambda: client.get(f"/api/evaluations/{run_id}").json(),
        f"evaluation run {run_id} to finish",
        seconds,
        0.5,
        until=lambda run: run["state"] in ("succeeded", "failed"),
    )


def test_a_new_version_that_answers_differently_fails_the_set_and_the_same_weights_agree(
    node_url, celery_worker, published, tenant_a
):
    client = key_client(tenant_a)
    client.put(
        "/api/aliases/support", {"version_id": published["v1"]}, content_type="application/json"
    )
    cases = thank_you_cases(3)
    revision = upload(client, jsonl(*cases)).json()

    def evaluate(candidate: str) -> dict:
        started = client.post(
            "/api/evaluations",
            {"candidate_version_id": published[candidate], "set_revision_id": revision["id"]},
            content_type="application/json",
        )
        assert started.status_code == 202, started.content
        assert started.json()["baseline"] == "support@v1"  # what the alias serves now
        return finished(client, started.json()["id"])

    run = evaluate("v2")  # support-v2's weights: "Hello from the helpdesk team!"
    assert run["state"] == "succeeded", run["error"]
    summary = run["summary"]
    assert (summary["baseline"]["pass_rate"], summary["candidate"]["pass_rate"]) == (1.0, 0.0)
    assert summary["agreement"] == 0.0 and summary["mean_similarity"] < 0.3
    assert summary["candidate"]["ttft_p50_ms"] > 0
    results = client.get(f"/api/evaluations/{run['id']}/cases").json()
    assert all(r["candidate_output"].strip().startswith(V2) for r in results)
    assert all(r["baseline_output"].strip().startswith(V1) for r in results)
    assert results[0]["candidate_checks"] == {"contains": False}
    failed = client.get(f"/api/evaluations/{run['id']}/cases?failed=true").json()
    assert len(failed) == 3

    same = evaluate("v3")  # support-v1's weights uploaded again as a new version
    assert same["state"] == "succeeded", same["error"]
    assert same["summary"]["agreement"] == 1.0
    assert same["summary"]["candidate"]["pass_rate"] == 1.0
    assert client.get(f"/api/evaluations/{same['id']}/cases?changed=true").json() == []
    # runs never move the alias
    assert client.get("/api/aliases/support").json()["version"]["label"] == "support@v1"
