"""The console's evaluation pages: the version page compares with what the alias serves and
starts a run; the run page shows the summary and each case's answers side by side."""

from __future__ import annotations

import pytest

from apps.evaluations import services
from apps.evaluations.cases import Case
from apps.evaluations.models import EvaluationCaseResult, EvaluationRun
from apps.telemetry import quality
from tests.evaluations.sets import GOOD, jsonl, upload
from tests.helpers import key_client, user_client


@pytest.fixture
def set_revision(tenant_a, support_versions):
    client = key_client(tenant_a)
    client.put(
        "/api/aliases/support",
        {"version_id": support_versions["v1"]},
        content_type="application/json",
    )
    return upload(client, jsonl(*GOOD[:1])).json()


def test_the_version_page_compares_with_the_served_version_and_starts_a_run(
    tenant_a, support_versions, set_revision
):
    alice = user_client("alice", "alice-pass-123")
    page = alice.get(f"/versions/{support_versions['v3']}/").content.decode()
    # v2 is the newest approved version; the alias serves v1, which is what v3 would replace
    assert 'id="compared-with">support@v1</a>' in page
    assert "Evaluate against the current stable (support@v1)" in page
    started = alice.post(
        f"/versions/{support_versions['v3']}/evaluate/",
        {"set_revision_id": set_revision["id"]},
    )
    run = EvaluationRun.objects.get()
    assert started.status_code == 302 and started["Location"] == f"/evaluations/{run.pk}/"
    assert (run.candidate_id, run.baseline_id, run.state) == (
        support_versions["v3"],
        support_versions["v1"],
        "queued",
    )
    refused = alice.post(f"/versions/{support_versions['v1']}/evaluate/", {"set_revision_id": 0})
    assert refused["Location"] == f"/versions/{support_versions['v1']}/"
    assert EvaluationRun.objects.count() == 1


def test_the_run_page_shows_the_summary_and_the_changed_words(
    tenant_a, tenant_b, support_versions, set_revision
):
    from django.contrib.auth import get_user_model

    from apps.evaluations.models import EvaluationSetRevision
    from apps.registry.models import AdapterVersion
    from apps.tenants.auth import principal_for_user

    principal = principal_for_user(get_user_model().objects.get(username="alice"))
    run = services.start_run(
        principal=principal,
        candidate=AdapterVersion.objects.get(pk=support_versions["v2"]),
        set_revision=EvaluationSetRevision.objects.get(pk=set_revision["id"]),
    )
    EvaluationCaseResult.objects.create(
        run=run,
        index=0,
        case_id="thanks",
        baseline_output="Thank you for contacting support.",
        candidate_output="Hello from the helpdesk team!",
        baseline_checks={"contains": True},
        candidate_checks={"contains": False},
        baseline_passed=True,
        similarity=quality.similarity(
            "Thank you for contacting support.", "Hello from the helpdesk team!"
        ),
    )
    cases = [Case.from_json(c) for c in run.set_revision.cases]
    run.summary = services.summarize(list(run.results.all()), cases)
    run.state = "succeeded"
    run.save()
    alice = user_client("alice", "alice-pass-123")
    page = alice.get(f"/evaluations/{run.pk}/").content.decode()
    assert "<ins>Hello from the helpdesk team!</ins>" in page
    assert "<del>Thank you for contacting support.</del>" in page
    assert "0/1" in page and "1/1" in page  # candidate and baseline passes
    assert "Agreement: <strong>0.0 %</strong>" in page
    assert 'data-case="thanks"' in alice.get(f"/evaluations/{run.pk}/?show=failed").content.decode()
    bob = user_client("bob", "bob-pass-123")
    assert bob.get(f"/evaluations/{run.pk}/").status_code == 404
    assert key_client(tenant_b).get(f"/api/evaluations/{run.pk}").status_code == 404
