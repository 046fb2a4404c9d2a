"""Release drills on the real stack: the session's serving node (vLLM on the demo model), a
Celery worker judging on a 1 s beat, PostgreSQL, Redis and the S3 server. Each drill prints
its timeline and timings."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest
from django.test import Client

from apps.demo import corpus
from apps.registry.models import AliasEvent
from apps.telemetry.models import RequestLog
from apps.tenants import services as tenant_services
from tests.evaluations.sets import thank_you_cases
from tests.harness.waiting import wait_until
from tests.helpers import user_client
from tests.releases.conftest import Traffic, event_of, followed, inject, node_cache, timeline

pytestmark = pytest.mark.engine
V1, V2 = corpus.PHRASES["support-v1"], corpus.PHRASES["support-v2"]
# Not pre-warmed, the candidate's first canary request loads it from disk: against a warm
# baseline its TTFT p95 over a handful of requests can exceed the default 1.5 ratio, and the
# release rolls back on TTFT (seen in CI, at 1.5, at 10: 608 ms against 49 ms, and at 100,
# the most a plan accepts, while a new worker started on the 2 cores: ratio 187). These
# drills are about control flow under faults; the TTFT gate's verdicts have their own tests in
# tests/releases/test_rules.py. The drills turn the gate off.
TTFT_RATIO_OFF = None
CANARY_ONLY = {
    "interval_s": 1,
    "failure_threshold": 2,
    "prewarm": False,
    "canary_max_ttft_ratio": TTFT_RATIO_OFF,
}


@pytest.fixture
def stack(node_url, judge_beat, published, tenant_a):
    """Tenant A's `support` → v1; v2 answers differently; v3 has v1's weights. Alice (tenant
    admin) drives releases through the REST API; callers use an API key."""
    alice = user_client("alice", "alice-pass-123")
    moved = alice.put(
        "/api/aliases/support", {"version_id": published["v1"]}, content_type="application/json"
    )
    assert moved.status_code == 200
    _, key = tenant_services.issue_api_key(tenant=tenant_a, name="callers", actor=None)
    return {"alice": alice, "key": key, "url": node_url, "versions": published}


def start(alice: Client, version_id: int, plan: dict) -> dict:
    started = alice.post(
        "/api/aliases/support/releases",
        {"version_id": version_id, "plan": plan},
        content_type="application/json",
    )
    assert started.status_code == 201, started.content
    return started.json()


def at(event: dict) -> float:
    return datetime.fromisoformat(event["at"]).timestamp()


def test_a_candidate_with_the_stable_weights_goes_through_every_step_and_is_promoted(stack):
    alice, versions = stack["alice"], stack["versions"]
    cases = json.dumps(thank_you_cases(1)[0]).encode()
    from tests.evaluations.sets import upload

    assert upload(alice, cases, name="thanks").status_code == 201
    plan = {
        "interval_s": 1,
        "failure_threshold": 2,
        "prewarm": True,
        "evaluation_sets": ["thanks"],
        "shadow_percent": 100,
        "shadow_duration_s": 2,
        "shadow_min_comparisons": 2,
        "shadow_min_agreement": 0.9,
        "shadow_max_ttft_ratio": TTFT_RATIO_OFF,
        "canary_steps": [
            {"percent": 50, "dwell_s": 2, "min_requests": 2},
            {"percent": 100, "dwell_s": 1, "min_requests": 2},
        ],
        "canary_max_ttft_ratio": TTFT_RATIO_OFF,
    }
    with Traffic(stack["url"], stack["key"]):
        release = start(alice, versions["v3"], plan)
        done = followed(alice, release["id"], ("promoted", "rolled_back", "aborted"), 180)
    print(f"\nrelease #{done['id']} of support@v1 → support@v3:\n{timeline(done)}")
    assert done["state"] == "promoted", done["outcome"]
    kinds = [(e["kind"], e["to_state"]) for e in done["events"]]
    assert kinds == [
        ("start", "prewarming"),
        ("advance", "evaluating"),
        ("advance", "shadowing"),
        ("advance", "canary"),
        ("advance", "canary"),
        ("promote", "promoted"),
    ]
    for event in done["events"][1:]:  # each step's gate values, every one passed
        assert event["gates"] and {g["verdict"] for g in event["gates"]} == {"pass"}
    shadow_gates = {g["gate"]: g for g in done["events"][3]["gates"]}
    assert shadow_gates["shadow agreement"]["value"] == 1.0
    alias = alice.get("/api/aliases/support").json()
    assert alias["version"]["label"] == "support@v3" and alias["held_by"] == ""
    print(f"started → promoted in {at(done['events'][-1]) - at(done['events'][0]):.1f} s")


def test_rollbacks_at_evaluation_and_in_the_canary_and_the_manual_controls(stack):
    alice, versions, url = stack["alice"], stack["versions"], stack["url"]
    from tests.evaluations.sets import upload

    assert (
        upload(alice, json.dumps(thank_you_cases(1)[0]).encode(), name="thanks").status_code == 201
    )

    # 1. support-v2 against a set that expects v1's answers: stops at evaluation
    with Traffic(url, stack["key"]) as traffic:
        first = start(
            alice,
            versions["v2"],
            {**CANARY_ONLY, "prewarm": True, "evaluation_sets": ["thanks"], "shadow_percent": 50},
        )
        stopped = followed(alice, first["id"], ("rolled_back", "promoted"), 120)
    print(f"\nrelease #{stopped['id']} (support@v2, fails its evaluation):\n{timeline(stopped)}")
    assert stopped["state"] == "rolled_back"
    assert stopped["outcome"].startswith("evaluation thanks#1: candidate pass rate failed 2 checks")
    assert not RequestLog.objects.filter(alias="support", version="v2").exists()
    assert {a.adapter for a in traffic.answers} == {"support@v1"}  # no caller ever got v2
    moves = set(AliasEvent.objects.filter(alias__name="support").values_list("action", flat=True))
    assert moves == {"set"}  # the alias never moved
    event_of(alice, first["id"], "cooled")  # recorded once the nodes have let v2 go
    assert versions["v2"] not in node_cache(url)["L1"] | node_cache(url)["L2"]

    # 2. a candidate whose requests fail once it takes traffic: rolled back in the canary
    inject(url, versions["v3"], error=True)
    try:
        with Traffic(url, stack["key"], threads=2) as traffic:
            second = start(
                alice,
                versions["v3"],
                {
                    **CANARY_ONLY,
                    "canary_steps": [{"percent": 50, "dwell_s": 60, "min_requests": 2}],
                },
            )
            rolled = followed(alice, second["id"], ("rolled_back", "promoted"), 60)
            rollback = next(e for e in rolled["events"] if e["kind"] == "rollback")
            time.sleep(2.5)  # callers keep asking after the rollback
    finally:
        inject(url, versions["v3"])  # the fault off again
    print(f"\nrelease #{rolled['id']} (support@v3 failing in the canary):\n{timeline(rolled)}")
    assert rolled["state"] == "rolled_back"
    first_failure = next(e for e in rolled["events"] if e["kind"] == "check")
    took = at(rollback) - at(first_failure)
    print(f"first failed check → rollback: {took:.2f} s (bound: threshold 2 x interval 1 s + 1 s)")
    assert took <= 2 * 1 + 1 + 1  # one tick of the beat's own jitter
    late = [a for a in traffic.answers if a.at > at(rollback) + 1.0]
    assert late and {a.adapter for a in late} == {"support@v1"}
    timings = event_of(alice, second["id"], "cooled")["timings"]
    print(
        f"failing judgement → last node serving the baseline only: "
        f"{timings['judgement_to_last_node_baseline_only_ms']} ms; cooled: {timings['cooled']}"
    )
    assert timings["judgement_to_last_node_baseline_only_ms"] is not None
    cache = node_cache(url)
    assert versions["v3"] not in cache["L1"] | cache["L2"] and versions["v3"] in cache["L3"]

    # 3. pause holds the split, a hand move is refused naming the release, abort rolls back
    third = start(
        alice,
        versions["v3"],
        {
            **CANARY_ONLY,
            "canary_steps": [
                {"percent": 30, "dwell_s": 1, "min_requests": 1},
                {"percent": 100, "dwell_s": 1, "min_requests": 1},
            ],
        },
    )
    paused = alice.post(f"/api/releases/{third['id']}/pause").json()
    assert paused["state"] == "paused"
    with Traffic(url, stack["key"]):
        time.sleep(3)  # three judgements' worth: none moves it
    held = alice.get(f"/api/releases/{third['id']}").json()
    assert (held["state"], held["step"]) == ("paused", 0)
    assert alice.get("/api/aliases/support").json()["canary_percent"] == 30
    refused = alice.put(
        "/api/aliases/support", {"version_id": versions["v2"]}, content_type="application/json"
    )
    assert refused.status_code == 409 and f"release #{third['id']}" in refused.json()["detail"]
    assert alice.post(f"/api/releases/{third['id']}/resume").json()["state"] == "canary"
    aborted = alice.post(
        f"/api/releases/{third['id']}/abort", {"reason": "drill"}, content_type="application/json"
    ).json()
    assert aborted["state"] == "aborted" and aborted["outcome"] == "aborted by alice: drill"
    alias = alice.get("/api/aliases/support").json()
    assert (alias["version"]["label"], alias["canary_version"], alias["held_by"]) == (
        "support@v1",
        None,
        "",
    )


def test_a_release_continues_after_its_worker_is_killed_and_its_node_restarts(
    stack, celery_worker, s3_server, session_node
):
    """kill -9 of the worker that judges, mid-release: the next worker continues from the last
    recorded step. Then the serving node restarts mid-canary: the release waits for traffic
    and continues. Exactly one promotion, and each step entered once."""
    from lorahub.celery import app
    from tests.harness.processes import start_worker, stop

    alice, versions, url = stack["alice"], stack["versions"], stack["url"]
    plan = {
        **CANARY_ONLY,
        "canary_steps": [
            {"percent": 20, "dwell_s": 3, "min_requests": 2},
            {"percent": 50, "dwell_s": 3, "min_requests": 2},
            {"percent": 100, "dwell_s": 1, "min_requests": 2},
        ],
    }
    app.control.cancel_consumer("celery", destination=[celery_worker], reply=True)
    workers = []
    try:
        victim, _ = start_worker(s3_server)
        workers.append(victim)
        with Traffic(url, stack["key"]):
            release = start(alice, versions["v3"], plan)
            time.sleep(2)  # judgements under way on the victim
            victim.kill()  # SIGKILL, whatever it was doing
            victim.wait()
            killed_at = alice.get(f"/api/releases/{release['id']}").json()
            print(f"\nworker killed at {killed_at['state']} step {killed_at['step'] + 1}")
            time.sleep(2)  # nobody judges: the release stays where it was recorded
            still = alice.get(f"/api/releases/{release['id']}").json()
            assert (still["state"], still["step"]) == (killed_at["state"], killed_at["step"])
            successor, _ = start_worker(s3_server)
            workers.append(successor)

            def moved_on(now: dict) -> bool:
                assert now["state"] == "canary", f"release left the canary: {now['outcome']}"
                return now["step"] >= 1

            wait_until(
                lambda: alice.get(f"/api/releases/{release['id']}").json(),
                "the successor to move the release on",
                60,
                0.2,
                until=moved_on,
                describe=lambda now: now["last_check"],
            )
        restarted = time.monotonic()
        session_node.stop()
        session_node.start().wait_ready()
        print(f"node restarted mid-canary in {time.monotonic() - restarted:.1f} s")
        with Traffic(url, stack["key"]):
            done = followed(alice, release["id"], ("promoted", "rolled_back", "aborted"), 120)
    finally:
        for worker in workers:
            stop(worker)
        app.control.add_consumer("celery", destination=[celery_worker], reply=True)
    print(f"release #{done['id']}:\n{timeline(done)}")
    assert done["state"] == "promoted", done["outcome"]
    kinds = [(e["kind"], e["step"]) for e in done["events"] if e["kind"] in ("advance", "promote")]
    assert kinds == [("advance", 1), ("advance", 2), ("promote", 2)]
    assert AliasEvent.objects.filter(alias__name="support", action="promote").count() == 1
