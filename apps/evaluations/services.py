"""Evaluation workflows: attach a set to an adapter, start a run, execute it on a node.

A run asks a serving node's internal API (``/internal/generate``) for each case's answer from
the candidate and from the baseline: the node's own request path (trust checks, placement,
admission, vLLM's serving layer), so only approved, signed versions answer. Runs read the
registry and never move an alias.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import statistics
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction
from django.db.models import Max

from apps.evaluations.cases import Case, InvalidEvaluationSet, judge, parse_cases
from apps.evaluations.models import (
    EvaluationCaseResult,
    EvaluationRun,
    EvaluationSet,
    EvaluationSetRevision,
)
from apps.fleet.node_client import NodeClient, configured_nodes
from apps.registry import snapshots
from apps.registry.models import Adapter, AdapterVersion
from apps.telemetry import outcomes, quality
from apps.telemetry.outcomes import Outcome
from apps.tenants import services as tenant_services
from apps.tenants.auth import Principal
from apps.tenants.errors import DomainError, Forbidden, Invalid, NotFound
from apps.tenants.models import Tenant, slug_validator
from lorahub import queueing

logger = logging.getLogger(__name__)
RUN_TASK = "apps.evaluations.tasks.run_evaluation"
GENERATE_TIMEOUT_S = 120.0
NODE_WAIT_S = 30.0


def _actor(principal: Principal) -> dict[str, Any]:
    return {"actor": principal.user, "actor_key": principal.api_key}


def _creator(principal: Principal) -> dict[str, Any]:
    return {"created_by": principal.user, "created_by_key": principal.api_key}


# --- sets --------------------------------------------------------------------------------------


def upload_set(
    *, principal: Principal, tenant: Tenant, adapter_id: str, name: str, raw: bytes
) -> tuple[EvaluationSetRevision, bool]:
    """Validate ``raw`` (JSONL) whole and store it as the set's next revision; nothing is
    stored when any line is wrong. The same bytes as the latest revision add none. Returns
    the revision and whether it is new."""
    adapter = Adapter.objects.filter(tenant=tenant, adapter_id=adapter_id).first()
    if adapter is None:
        raise NotFound(f"tenant '{tenant.slug}' has no adapter '{adapter_id}'")
    try:
        slug_validator(name)
    except Exception:
        raise InvalidEvaluationSet(
            f"set name '{name}' is not valid: use 2-63 lowercase letters, digits and hyphens"
        ) from None
    cases = parse_cases(raw)
    digest = hashlib.sha256(raw).hexdigest()
    with transaction.atomic():
        evaluation_set, _ = EvaluationSet.objects.get_or_create(
            tenant=tenant, adapter=adapter, name=name
        )
        EvaluationSet.objects.select_for_update().filter(pk=evaluation_set.pk).get()
        latest = evaluation_set.revisions.order_by("-revision").first()
        if latest is not None and latest.sha256 == digest:
            return latest, False
        revision = EvaluationSetRevision.objects.create(
            set=evaluation_set,
            revision=(evaluation_set.revisions.aggregate(n=Max("revision"))["n"] or 0) + 1,
            cases=[case.as_json() for case in cases],
            case_count=len(cases),
            size_bytes=len(raw),
            sha256=digest,
            **_creator(principal),
        )
        tenant_services.record_event(
            action="evaluation_set.uploaded",
            obj=revision,
            tenant=tenant,
            after={
                "set": f"{adapter_id}/{name}",
                "revision": revision.revision,
                "cases": len(cases),
            },
            **_actor(principal),
        )
    return revision, True


# --- runs --------------------------------------------------------------------------------------


def start_run(
    *,
    principal: Principal,
    candidate: AdapterVersion,
    set_revision: EvaluationSetRevision,
    baseline: AdapterVersion | None = None,
    alias: str | None = None,
) -> EvaluationRun:
    """Queue ``candidate`` against ``baseline`` (default: what the adapter's alias serves now)
    on one set revision. Both must be approved and signed versions of the set's adapter.

    Who may start one: the tenant's members, and operators. A reviewer reads every tenant's
    runs (they inform a review) but starts none on another tenant's versions: a run spends
    that tenant's share of a node and is audited under that tenant (docs/security.md)."""
    adapter = candidate.adapter
    if adapter.tenant_id not in principal.tenant_ids and not principal.is_operator:
        raise Forbidden(
            f"{candidate.label} belongs to tenant '{adapter.tenant.slug}': only its members and "
            "operators start evaluation runs on it (reviewers read them); ask the tenant"
        )
    if set_revision.set.adapter_id != adapter.pk:
        raise Invalid(
            f"set {set_revision.label} belongs to adapter '{set_revision.set.adapter.adapter_id}', "
            f"not '{adapter.adapter_id}'"
        )
    if baseline is None:
        baseline = snapshots.serving_version(adapter, alias)
        if baseline is None:
            raise Invalid(
                f"adapter '{adapter.adapter_id}' has no alias to compare with: name a baseline "
                "version (baseline_version_id) or an alias"
            )
    if baseline.adapter_id != adapter.pk:
        raise Invalid(f"the baseline {baseline.label} is a version of another adapter")
    for role, version in (("candidate", candidate), ("baseline", baseline)):
        if not version.is_servable:
            raise Invalid(
                f"the {role} {version.label} is {version.state.replace('_', ' ')}: evaluations "
                "run only on approved, signed versions"
            )
    if baseline.pk == candidate.pk:
        raise Invalid(
            f"{candidate.label} is already what the alias serves: pick another baseline version"
        )
    with transaction.atomic():
        run = EvaluationRun.objects.create(
            tenant=adapter.tenant,
            set_revision=set_revision,
            candidate=candidate,
            baseline=baseline,
            cases_total=set_revision.case_count,
            **_creator(principal),
        )
        tenant_services.record_event(
            action="evaluation.started",
            obj=run,
            tenant=adapter.tenant,
            after={
                "candidate": candidate.label,
                "baseline": baseline.label,
                "set": f"{adapter.adapter_id}/{set_revision.label}",
            },
            **_actor(principal),
        )
        queueing.enqueue_on_commit(
            RUN_TASK, run.pk, on_unqueued=functools.partial(_unqueued, run.pk)
        )
    return run


def _unqueued(run_id: int) -> None:
    """The broker did not answer: the run fails with a message that says so, rather than
    staying queued for ever."""
    EvaluationRun.objects.filter(pk=run_id).update(
        state=EvaluationRun.State.FAILED,
        error="the task queue did not answer; start the evaluation again",
        finished_at=datetime.now(UTC),
    )


class NodeAnswerError(DomainError):
    status = 503
    code = "node_unavailable"


def _node() -> NodeClient:
    """A serving node whose engine is ready; waits ``NODE_WAIT_S`` for one (a node
    restarting, or one whose heartbeat is due) before the run fails."""
    deadline = time.monotonic() + NODE_WAIT_S
    while True:
        nodes = [n for n in configured_nodes() if n.state in ("", "ready")]
        if nodes:
            return nodes[0]
        if time.monotonic() > deadline:
            raise NodeAnswerError(
                f"no serving node was up for {NODE_WAIT_S:.0f} s to run the evaluation on; "
                "start one and run the evaluation again"
            )
        time.sleep(1.0)


def _ask(
    client: httpx.Client, node: NodeClient, version: AdapterVersion, case: Case
) -> dict[str, Any]:
    """One case's answer from one version: its text, tokens, TTFT, or the node's error."""
    chat = case.messages is not None
    request: dict[str, Any] = dict(case.params)
    if chat:
        request["messages"] = case.messages
    else:
        request["prompt"] = case.prompt
    try:
        response = client.post(
            f"{node.url}/internal/generate",
            json={"version_id": version.pk, "chat": chat, "body": request},
        )
    except httpx.HTTPError as exc:
        raise NodeAnswerError(f"node {node.name} did not answer: {exc}") from None
    outcome = outcomes.classify(response.status_code)
    if outcome in (Outcome.SERVER_FAILURE, Outcome.THROTTLED):
        # the platform's failure, not the version's: the run stops (or is retried), it does
        # not count against either version (apps/telemetry/outcomes.py)
        raise NodeAnswerError(f"node {node.name} answered {response.status_code}")
    body = response.json()
    if outcome is not Outcome.OK:  # a caller error: this case's request was refused
        message = (body.get("error") or {}).get("message") or response.text
        return {"text": "", "tokens": 0, "ttft_ms": None, "error": message[:200]}
    choice = body["choices"][0]
    text = choice["message"]["content"] if chat else choice["text"]
    ttft = response.headers.get("x-lorahub-ttft-ms")
    return {
        "text": text or "",
        "tokens": (body.get("usage") or {}).get("completion_tokens") or 0,
        "ttft_ms": float(ttft) if ttft else None,
        "error": "",
    }


def execute_run(run_id: int) -> EvaluationRun:
    """Answer every case with both versions and judge them; idempotent (a retried run starts
    over). A node that cannot answer fails the run with the reason."""
    run = EvaluationRun.objects.select_related("candidate", "baseline", "set_revision").get(
        pk=run_id
    )
    if run.state in (EvaluationRun.State.SUCCEEDED, EvaluationRun.State.FAILED):
        return run
    run.results.all().delete()
    run.state, run.started_at, run.cases_done = EvaluationRun.State.RUNNING, datetime.now(UTC), 0
    run.save(update_fields=["state", "started_at", "cases_done"])
    cases = [Case.from_json(c) for c in run.set_revision.cases]
    try:
        node = _node()
        run.node = node.name
        run.save(update_fields=["node"])
        headers = {"Authorization": f"Bearer {settings.LORAHUB_INTERNAL_TOKEN}"}
        with httpx.Client(headers=headers, timeout=GENERATE_TIMEOUT_S) as client:
            _warm(client, node, [run.candidate, run.baseline])
            for index, case in enumerate(cases):
                _run_case(client, node, run, index, case)
                run.cases_done = index + 1
                run.save(update_fields=["cases_done"])
    except NodeAnswerError as exc:
        return _fail(run, exc.message)
    except SoftTimeLimitExceeded:
        return _fail(
            run,
            f"stopped after {settings.LORAHUB_EVALUATION_TIME_LIMIT_S} s, the time limit of an "
            f"evaluation run, with {run.cases_done} of {len(cases)} cases answered; use a "
            "smaller set or ask an operator to raise LORAHUB_EVALUATION_TIME_LIMIT_S",
        )
    run.summary = summarize(list(run.results.all()), cases)
    run.state, run.finished_at = EvaluationRun.State.SUCCEEDED, datetime.now(UTC)
    run.save(update_fields=["summary", "state", "finished_at"])
    return run


def _fail(run: EvaluationRun, reason: str) -> EvaluationRun:
    run.state, run.error = EvaluationRun.State.FAILED, reason
    run.finished_at = datetime.now(UTC)
    run.save(update_fields=["state", "error", "finished_at"])
    logger.warning("evaluation run %s failed: %s", run.pk, reason)
    return run


def _warm(client: httpx.Client, node: NodeClient, versions: list[AdapterVersion]) -> None:
    """Load both versions into the node's engine first (``/internal/warm``, L2), so the first
    cases do not measure a cold load. Best effort: a version that cannot load fails its
    cases with the node's reason instead."""
    for version in versions:
        try:
            answer = client.post(
                f"{node.url}/internal/warm", json={"version_id": version.pk, "tier": "L2"}
            )
        except httpx.HTTPError as exc:
            raise NodeAnswerError(f"node {node.name} did not answer: {exc}") from None
        if answer.status_code != 200:
            logger.info("could not warm %s on %s: %s", version.label, node.name, answer.text)


def _run_case(
    client: httpx.Client, node: NodeClient, run: EvaluationRun, index: int, case: Case
) -> None:
    candidate = _ask(client, node, run.candidate, case)
    baseline = _ask(client, node, run.baseline, case)
    candidate_checks = judge(case, candidate["text"]) if not candidate["error"] else {}
    baseline_checks = judge(case, baseline["text"]) if not baseline["error"] else {}
    EvaluationCaseResult.objects.create(
        run=run,
        index=index,
        case_id=case.id,
        candidate_output=candidate["text"],
        baseline_output=baseline["text"],
        candidate_checks=candidate_checks,
        baseline_checks=baseline_checks,
        candidate_passed=not candidate["error"] and all(candidate_checks.values()),
        baseline_passed=not baseline["error"] and all(baseline_checks.values()),
        exact_match=candidate["text"] == baseline["text"] and not candidate["error"],
        similarity=quality.similarity(candidate["text"], baseline["text"]),
        candidate_tokens=candidate["tokens"],
        baseline_tokens=baseline["tokens"],
        candidate_ttft_ms=candidate["ttft_ms"],
        baseline_ttft_ms=baseline["ttft_ms"],
        candidate_error=candidate["error"],
        baseline_error=baseline["error"],
    )


def summarize(results: list[EvaluationCaseResult], cases: list[Case]) -> dict[str, Any]:
    """Pass rate of each version (of the cases that expect something), agreement (share of
    identical answers), mean similarity, answer length and TTFT of each."""
    expecting = {case.id for case in cases if case.expect}
    judged = [r for r in results if r.case_id in expecting]
    n = len(results)

    def ttft(values: list[float | None]) -> float | None:
        seen = [v for v in values if v is not None]
        return round(statistics.median(seen), 2) if seen else None

    def side(prefix: str) -> dict[str, Any]:
        return {
            "passed": sum(getattr(r, f"{prefix}_passed") for r in judged),
            "pass_rate": (
                sum(getattr(r, f"{prefix}_passed") for r in judged) / len(judged)
                if judged
                else None
            ),
            "errors": sum(bool(getattr(r, f"{prefix}_error")) for r in results),
            "mean_tokens": (
                sum(getattr(r, f"{prefix}_tokens") for r in results) / n if n else None
            ),
            "ttft_p50_ms": ttft([getattr(r, f"{prefix}_ttft_ms") for r in results]),
        }

    return {
        "cases": n,
        "judged": len(judged),
        "agreement": sum(r.exact_match for r in results) / n if n else None,
        "mean_similarity": sum(r.similarity for r in results) / n if n else None,
        "changed": sum(not r.exact_match for r in results),
        "candidate": side("candidate"),
        "baseline": side("baseline"),
    }
