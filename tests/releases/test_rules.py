"""Release rules on the real database, with request-log rows made by a factory instead of a
node: the plan's validation, the hold on the alias, the gates' wait/fail/pass, rollback after
`failure_threshold` consecutive failed checks, the controls, and a judgement that dies half-way
leaving nothing half-done."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.http import QueryDict
from django.test import Client
from django.utils import timezone

from apps.registry import aliases
from apps.registry.models import AdapterVersion, Alias, AliasEvent
from apps.releases import services, timeline
from apps.releases.models import Release, ReleaseEvent
from apps.releases.plan import PlanError, build
from apps.releases.views import plan_from_form
from apps.telemetry.models import RequestLog
from apps.tenants.auth import principal_for_user
from apps.tenants.models import AuditEvent

FAST = {
    "interval_s": 1,
    "failure_threshold": 2,
    "prewarm": False,
    "canary_steps": [
        {"percent": 10, "dwell_s": 1, "min_requests": 5},
        {"percent": 100, "dwell_s": 1, "min_requests": 5},
    ],
}


@pytest.fixture
def alice(tenant_a):
    return principal_for_user(get_user_model().objects.get(username="alice"))


@pytest.fixture
def alias(support_versions, alice, tenant_a):
    return aliases.set_alias(
        principal=alice, tenant=tenant_a, name="support", version_id=support_versions["v1"]
    )


def requests(alias: Alias, version: str, n: int, *, status=200, ttft=100.0, **fields) -> None:
    """``n`` finished requests of ``version`` through ``alias``, as a node records them."""
    RequestLog.objects.bulk_create(
        RequestLog(
            at=timezone.now(),
            node="n1",
            tenant_id=alias.tenant_id,
            alias=alias.name,
            adapter_id="support",
            version=version,
            tier="L1",
            ttft_ms=ttft,
            total_ms=ttft * 2,
            status=status,
            finish_reason=fields.get("finish_reason", "stop"),
        )
        for _ in range(n)
    )


def start_v2(alice, alias: Alias, support_versions, plan: dict = FAST) -> Release:
    """A release of ``alias`` to v2 with ``plan``."""
    candidate = AdapterVersion.objects.get(pk=support_versions["v2"])
    return services.start(principal=alice, alias=alias, candidate=candidate, plan=plan)


def ready_to_advance(alice, alias: Alias, support_versions) -> Release:
    """A FAST release at canary step 1 with enough healthy traffic, its dwell over."""
    release = start_v2(alice, alias, support_versions)
    requests(alias, "v1", 20)
    requests(alias, "v2", 6)
    backdate(release)
    return release


def backdate(release: Release, seconds: float = 2) -> None:
    """As if the step began ``seconds`` ago (its dwell is over)."""
    Release.objects.filter(pk=release.pk).update(
        step_started_at=timezone.now() - timedelta(seconds=seconds)
    )


def test_a_bad_plan_is_refused_field_by_field():
    with pytest.raises(PlanError) as refused:
        build(
            {
                "interval_s": 0,
                "shadow_min_agreement": 1.5,
                "canary_steps": [
                    {"percent": 50, "dwell_s": 1, "min_requests": 1},
                    {"percent": 25, "dwell_s": 1, "min_requests": 1},
                ],
                "surprise": 1,
            }
        )
    fields = refused.value.fields
    assert set(fields) == {"interval_s", "shadow_min_agreement", "surprise"}
    assert "greater than or equal to 1" in fields["interval_s"]
    with pytest.raises(PlanError) as steps:
        build(
            {
                "canary_steps": [
                    {"percent": 50, "dwell_s": 1, "min_requests": 1},
                    {"percent": 25, "dwell_s": 1, "min_requests": 1},
                ]
            }
        )
    assert steps.value.fields == {
        "canary_steps": "each step's percent must be above the one before, got [50, 25]"
    }


def test_the_rest_api_names_the_bad_fields_and_stores_nothing(alias, support_versions, tenant_a):
    client = Client()
    assert client.login(username="alice", password="alice-pass-123")
    refused = client.post(
        "/api/aliases/support/releases",
        {
            "version_id": support_versions["v2"],
            "plan": {"failure_threshold": 0, "evaluation_sets": ["nope"]},
        },
        content_type="application/json",
    )
    assert refused.status_code == 422
    assert set(refused.json()["fields"]) == {"failure_threshold"}
    missing = client.post(
        "/api/aliases/support/releases",
        {"version_id": support_versions["v2"], "plan": {"evaluation_sets": ["nope"]}},
        content_type="application/json",
    )
    assert missing.status_code == 422
    assert "has no set nope" in missing.json()["fields"]["evaluation_sets"]
    assert not Release.objects.exists()
    assert Alias.objects.get(pk=alias.pk).held_by == ""


def test_a_release_holds_its_alias_against_hand_moves_and_is_the_only_one(
    alias, support_versions, alice, tenant_a
):
    release = start_v2(alice, alias, support_versions)
    assert release.state == "canary"  # no prewarm, no sets, no shadow: straight to step 1
    held = Alias.objects.get(pk=alias.pk)
    assert (held.held_by, held.canary_version_id, held.canary_percent) == (
        f"release #{release.pk}",
        support_versions["v2"],
        10,
    )
    client = Client()
    assert client.login(username="alice", password="alice-pass-123")
    moved = client.put(
        "/api/aliases/support",
        {"version_id": support_versions["v3"]},
        content_type="application/json",
    )
    assert moved.status_code == 409
    assert moved.json()["detail"] == (
        f"alias 'support' is being moved by release #{release.pk}; pause it to hold the split, "
        "or promote or abort it from its page before moving the alias by hand"
    )
    assert (
        client.post(
            "/api/aliases/support/rollback", {}, content_type="application/json"
        ).status_code
        == 409
    )
    second = client.post(
        "/api/aliases/support/releases",
        {"version_id": support_versions["v3"]},
        content_type="application/json",
    )
    assert second.status_code == 409 and f"release #{release.pk}" in second.json()["detail"]
    assert AuditEvent.objects.filter(action="release.start").count() == 1


def test_a_canary_step_waits_for_traffic_then_moves_on_and_promotes(alias, support_versions, alice):
    release = start_v2(alice, alias, support_versions)
    requests(alias, "v1", 20)
    requests(alias, "v2", 2)
    backdate(release)
    assert services.judge(release.pk) == "wait"  # 2 of 5: it never passes for lack of data
    release.refresh_from_db()
    waiting = {g["gate"]: g for g in release.last_check["gates"]}
    assert waiting["canary requests"]["verdict"] == "wait"
    assert waiting["canary requests"]["detail"] == "2 of 5 requests"
    requests(alias, "v2", 4)
    assert services.judge(release.pk) == "advance"
    release.refresh_from_db()
    assert (release.state, release.step) == ("canary", 1)
    assert Alias.objects.get(pk=alias.pk).canary_percent == 100
    advance = ReleaseEvent.objects.get(release=release, kind="advance")
    assert {g["gate"]: g["verdict"] for g in advance.gates} == {
        "canary requests": "pass",
        "canary error rate": "pass",
        "canary TTFT p95 ratio": "pass",
        "canary quality markers": "pass",
    }
    requests(alias, "v2", 5)
    assert services.judge(release.pk) == "hold"  # the new step's dwell is not over
    backdate(release)
    assert services.judge(release.pk) == "advance"
    release.refresh_from_db()
    promoted = Alias.objects.get(pk=alias.pk)
    assert release.state == "promoted"
    assert (promoted.version_id, promoted.canary_version_id, promoted.held_by) == (
        support_versions["v2"],
        None,
        "",
    )
    assert list(ReleaseEvent.objects.filter(release=release).values_list("kind", flat=True)) == [
        "start",
        "advance",
        "promote",
    ]


def test_failure_threshold_failed_checks_in_a_row_roll_back(alias, support_versions, alice):
    release = start_v2(alice, alias, support_versions)
    requests(alias, "v1", 50)
    requests(alias, "v2", 6, status=500)
    assert services.judge(release.pk) == "fail"
    release.refresh_from_db()
    assert (release.state, release.consecutive_failures) == ("canary", 1)
    check = ReleaseEvent.objects.get(release=release, kind="check")
    assert check.note.startswith("failed check 1 of 2: canary error rate 1.0 (needs <= 0.01)")
    assert services.judge(release.pk) == "fail"
    release.refresh_from_db()
    rolled = Alias.objects.get(pk=alias.pk)
    assert release.state == "rolled_back"
    assert release.outcome.startswith("canary error rate failed 2 checks in a row")
    assert (rolled.version_id, rolled.canary_version_id, rolled.held_by) == (
        support_versions["v1"],
        None,
        "",
    )
    kinds = list(ReleaseEvent.objects.filter(release=release).values_list("kind", flat=True))
    assert kinds == ["start", "check", "rollback", "cooled"]
    audit = AuditEvent.objects.get(action="release.rollback")
    assert audit.after["gates"][1]["gate"] == "canary error rate"
    assert audit.after["gates"][1]["value"] == 1.0


def test_a_canary_slower_than_the_ratio_allows_fails_the_ttft_gate(alias, support_versions, alice):
    release = start_v2(alice, alias, support_versions, {**FAST, "canary_max_ttft_ratio": 1.5})
    requests(alias, "v1", 50, ttft=100.0)
    requests(alias, "v2", 6, ttft=160.0)
    assert services.judge(release.pk) == "fail"
    release.refresh_from_db()
    gate = {g["gate"]: g for g in release.last_check["gates"]}["canary TTFT p95 ratio"]
    assert (gate["verdict"], gate["value"], gate["threshold"]) == ("fail", 1.6, 1.5)
    assert gate["detail"] == "160 ms against 100 ms"


def test_a_plan_may_turn_the_ttft_gate_off(alias, support_versions, alice):
    """null over the API, "off" in the console: no TTFT gate, the others still judge."""
    form = QueryDict(mutable=True)
    form.update({"canary_max_ttft_ratio": "Off", "canary_steps": "10"})
    assert plan_from_form(form)["canary_max_ttft_ratio"] is None
    form["canary_max_ttft_ratio"] = "fast"
    with pytest.raises(PlanError) as refused:
        plan_from_form(form)
    assert refused.value.fields == {"canary_max_ttft_ratio": "'fast' is not a number, or off"}

    release = start_v2(alice, alias, support_versions, {**FAST, "canary_max_ttft_ratio": None})
    requests(alias, "v1", 50, ttft=10.0)
    requests(alias, "v2", 6, ttft=5000.0)  # 500 times the baseline: no gate to fail
    assert services.judge(release.pk) in ("hold", "advance")
    release.refresh_from_db()
    gates = [g["gate"] for g in release.last_check["gates"]]
    assert gates == ["canary requests", "canary error rate", "canary quality markers"]


def test_a_passing_check_resets_the_count_and_quality_markers_are_judged(
    alias, support_versions, alice
):
    release = start_v2(
        alice,
        alias,
        support_versions,
        {**FAST, "canary_steps": [{"percent": 10, "dwell_s": 600, "min_requests": 5}]},
    )
    requests(alias, "v1", 50)
    requests(alias, "v2", 5, finish_reason="length")  # every answer cut by max_tokens
    assert services.judge(release.pk) == "fail"
    RequestLog.objects.filter(version="v2").update(finish_reason="stop")
    assert services.judge(release.pk) == "hold"
    release.refresh_from_db()
    assert release.consecutive_failures == 0


def test_pause_holds_the_split_resume_continues_abort_rolls_back(alias, support_versions, alice):
    release = start_v2(alice, alias, support_versions)
    services.pause(principal=alice, release=release)
    requests(alias, "v1", 20)
    requests(alias, "v2", 20)
    backdate(release)
    assert services.judge(release.pk) == "paused"
    assert services.due() == []
    assert Alias.objects.get(pk=alias.pk).canary_percent == 10
    services.resume(principal=alice, release=release)
    release.refresh_from_db()
    assert release.state == "canary" and release.step == 0
    services.abort(principal=alice, release=release, reason="not today")
    release.refresh_from_db()
    back = Alias.objects.get(pk=alias.pk)
    assert release.state == "aborted" and release.outcome == "aborted by alice: not today"
    assert (back.version_id, back.canary_version_id, back.held_by) == (
        support_versions["v1"],
        None,
        "",
    )
    assert AliasEvent.objects.filter(alias=alias, action="clear_canary").count() == 1


def test_members_may_not_control_releases(alias, support_versions, alice, tenant_a):
    from apps.tenants import services as tenant_services
    from apps.tenants.choices import TenantRole

    release = start_v2(alice, alias, support_versions)
    mia = tenant_services.ensure_user(username="mia", password="mia-pass-123")
    tenant_services.add_member(tenant=tenant_a, user=mia, role=TenantRole.MEMBER)
    client = Client()
    assert client.login(username="mia", password="mia-pass-123")
    refused = client.post(f"/api/releases/{release.pk}/abort", {}, content_type="application/json")
    assert refused.status_code == 403
    assert client.get(f"/api/releases/{release.pk}").json()["state"] == "canary"  # may read


@pytest.mark.django_db(transaction=True)
def test_a_judgement_that_dies_half_way_leaves_the_release_and_alias_as_they_were(
    support_versions, tenant_a, signing_key, reviewer, monkeypatch
):
    """As when the worker is killed mid-judgement: the alias move and the release's new step
    commit together or not at all, and the next judgement does the step again."""
    monkeypatch.setattr(services, "queue_judgement", lambda release_id: None)  # only ours judge
    alice = principal_for_user(get_user_model().objects.get(username="alice"))
    alias = aliases.set_alias(
        principal=alice, tenant=tenant_a, name="support", version_id=support_versions["v1"]
    )
    release = ready_to_advance(alice, alias, support_versions)

    def dies(*args, **kwargs):
        raise SystemExit("the worker was killed")

    audit = timeline.audit
    monkeypatch.setattr(timeline, "audit", dies)
    with pytest.raises(SystemExit):
        services.judge(release.pk)
    release.refresh_from_db()
    assert (release.state, release.step) == ("canary", 0)
    assert Alias.objects.get(pk=alias.pk).canary_percent == 10  # the step-2 move rolled back
    monkeypatch.setattr(timeline, "audit", audit)  # the next worker is not killed
    assert services.judge(release.pk) == "advance"
    assert Alias.objects.get(pk=alias.pk).canary_percent == 100
    assert ReleaseEvent.objects.filter(release=release, kind="advance").count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_judges_at_once_move_the_release_once(
    support_versions, tenant_a, signing_key, reviewer, monkeypatch
):
    monkeypatch.setattr(services, "queue_judgement", lambda release_id: None)  # only ours judge
    alice = principal_for_user(get_user_model().objects.get(username="alice"))
    alias = aliases.set_alias(
        principal=alice, tenant=tenant_a, name="support", version_id=support_versions["v1"]
    )
    release = ready_to_advance(alice, alias, support_versions)
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def judge() -> None:
        from django.db import connection

        barrier.wait()
        try:
            outcomes.append(services.judge(release.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=judge) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # the second judge finds the row locked (busy), or, once the first has committed, step 2
    # with no request of its own yet (wait): either way it moves nothing
    assert sorted(outcomes) in (["advance", "busy"], ["advance", "wait"]), outcomes
    assert ReleaseEvent.objects.filter(release=release, kind="advance").count() == 1
    assert Alias.objects.get(pk=alias.pk).canary_percent == 100


def test_tenant_defaults_are_the_start_of_every_plan(alias, support_versions, alice, tenant_a):
    client = Client()
    assert client.login(username="alice", password="alice-pass-123")
    bad = client.put(
        "/api/tenants/tenant-a/release-defaults",
        {"shadow_percent": 120},
        content_type="application/json",
    )
    assert bad.status_code == 422 and set(bad.json()["fields"]) == {"shadow_percent"}
    good = client.put(
        "/api/tenants/tenant-a/release-defaults",
        {"shadow_percent": 10, "failure_threshold": 3},
        content_type="application/json",
    )
    assert good.status_code == 200 and good.json()["shadow_percent"] == 10
    release = start_v2(alice, alias, support_versions, {"failure_threshold": 4, "prewarm": False})
    assert (release.plan["shadow_percent"], release.plan["failure_threshold"]) == (10, 4)
    assert release.state == "shadowing"  # the tenant's shadow, then the release's own fields
    assert AuditEvent.objects.filter(action="release.defaults").count() == 1
