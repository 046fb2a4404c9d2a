"""Evaluation endpoints: sets attached to adapters, runs of a candidate against a baseline."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from django.http import HttpRequest
from ninja import File, Query, Router, Schema, Status
from ninja.files import UploadedFile

from apps.evaluations import services
from apps.evaluations.cases import MAX_BYTES
from apps.evaluations.models import EvaluationRun, EvaluationSet, EvaluationSetRevision
from apps.registry import queries
from apps.tenants.auth import API_AUTH, Principal
from apps.tenants.errors import NotFound

router = Router(tags=["evaluations"], auth=API_AUTH)


class SetRevisionOut(Schema):
    id: int
    tenant: str
    adapter_id: str
    name: str
    revision: int
    case_count: int
    size_bytes: int
    sha256: str
    created_at: datetime


class SetRevisionDetailOut(SetRevisionOut):
    cases: list[dict[str, Any]]


class SetOut(Schema):
    name: str
    adapter_id: str
    revisions: int
    latest: SetRevisionOut


class RunIn(Schema):
    candidate_version_id: int
    set_revision_id: int
    baseline_version_id: int | None = None
    alias: str | None = None  # compare with what this alias serves (default: the adapter's)


class RunOut(Schema):
    id: int
    tenant: str
    adapter_id: str
    candidate: str
    candidate_version_id: int
    baseline: str
    baseline_version_id: int
    set: str
    set_revision_id: int
    state: str
    cases_done: int
    cases_total: int
    node: str
    summary: dict[str, Any]
    error: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class CaseResultOut(Schema):
    index: int
    case_id: str
    candidate_output: str
    baseline_output: str
    candidate_checks: dict[str, bool]
    baseline_checks: dict[str, bool]
    candidate_passed: bool
    baseline_passed: bool
    exact_match: bool
    similarity: float
    candidate_tokens: int
    baseline_tokens: int
    candidate_ttft_ms: float | None
    baseline_ttft_ms: float | None
    candidate_error: str
    baseline_error: str


def revision_out(revision: EvaluationSetRevision) -> dict[str, Any]:
    evaluation_set = revision.set
    return {
        "id": revision.pk,
        "tenant": evaluation_set.tenant.slug,
        "adapter_id": evaluation_set.adapter.adapter_id,
        "name": evaluation_set.name,
        "revision": revision.revision,
        "case_count": revision.case_count,
        "size_bytes": revision.size_bytes,
        "sha256": revision.sha256,
        "created_at": revision.created_at,
        "cases": revision.cases,
    }


def run_out(run: EvaluationRun) -> dict[str, Any]:
    return {
        "id": run.pk,
        "tenant": run.tenant.slug,
        "adapter_id": run.candidate.adapter.adapter_id,
        "candidate": run.candidate.label,
        "candidate_version_id": run.candidate_id,
        "baseline": run.baseline.label,
        "baseline_version_id": run.baseline_id,
        "set": run.set_revision.label,
        "set_revision_id": run.set_revision_id,
        "state": run.state,
        "cases_done": run.cases_done,
        "cases_total": run.cases_total,
        "node": run.node,
        "summary": run.summary,
        "error": run.error,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
    }


def _principal(request: HttpRequest) -> Principal:
    return request.auth  # type: ignore[attr-defined]  # set by ninja's auth


def visible_runs(principal: Principal):
    qs = EvaluationRun.objects.select_related(
        "tenant", "candidate__adapter", "baseline", "set_revision__set"
    )
    if principal.is_reviewer or principal.is_operator:
        return qs
    return qs.filter(tenant_id__in=principal.tenant_ids)


def get_visible_run(principal: Principal, run_id: int) -> EvaluationRun:
    run = visible_runs(principal).filter(pk=run_id).first()
    if run is None:
        raise NotFound(f"no evaluation run {run_id} that you can see")
    return run


def visible_revisions(principal: Principal):
    qs = EvaluationSetRevision.objects.select_related("set__tenant", "set__adapter")
    if principal.is_reviewer or principal.is_operator:
        return qs
    return qs.filter(set__tenant_id__in=principal.tenant_ids)


@router.post(
    "/adapters/{adapter_id}/evaluation-sets/{name}",
    response={200: SetRevisionOut, 201: SetRevisionOut},
)
def upload_set(
    request: HttpRequest,
    adapter_id: str,
    name: str,
    file: UploadedFile = File(...),  # noqa: B008 (django-ninja's declaration style)
    tenant: str | None = Query(None),
):
    """Attach a JSONL evaluation set to an adapter as its next immutable revision (the same
    bytes as the latest revision add none: 200). A set with any bad line is refused whole
    (400, naming the line and field)."""
    principal = _principal(request)
    target = principal.tenant_for(tenant)
    raw = file.read(MAX_BYTES + 1)
    revision, created = services.upload_set(
        principal=principal, tenant=target, adapter_id=adapter_id, name=name, raw=raw
    )
    return Status(201 if created else 200, revision_out(revision))


@router.get("/adapters/{adapter_id}/evaluation-sets", response=list[SetOut])
def list_sets(request: HttpRequest, adapter_id: str, tenant: str | None = None):
    principal = _principal(request)
    qs = EvaluationSet.objects.filter(adapter__adapter_id=adapter_id).select_related(
        "tenant", "adapter"
    )
    if not (principal.is_reviewer or principal.is_operator):
        qs = qs.filter(tenant_id__in=principal.tenant_ids)
    if tenant:
        qs = qs.filter(tenant__slug=tenant)
    out = []
    for evaluation_set in qs.order_by("name").prefetch_related("revisions"):
        revisions = sorted(evaluation_set.revisions.all(), key=lambda r: r.revision)
        if revisions:
            out.append(
                {
                    "name": evaluation_set.name,
                    "adapter_id": adapter_id,
                    "revisions": len(revisions),
                    "latest": revision_out(revisions[-1]),
                }
            )
    return out


@router.get("/evaluation-sets/{revision_id}", response=SetRevisionDetailOut)
def get_set_revision(request: HttpRequest, revision_id: int):
    revision = visible_revisions(_principal(request)).filter(pk=revision_id).first()
    if revision is None:
        raise NotFound(f"no evaluation set revision {revision_id} that you can see")
    return revision_out(revision)


@router.post("/evaluations", response={202: RunOut})
def start_run(request: HttpRequest, body: RunIn):
    """Queue an evaluation run: every case of the set on the candidate and on the baseline
    (default: the version the adapter's alias serves now), on a serving node. Poll the run
    until it leaves `queued`/`running`."""
    principal = _principal(request)
    candidate = queries.visible_version(principal, body.candidate_version_id)
    revision = visible_revisions(principal).filter(pk=body.set_revision_id).first()
    if revision is None:
        raise NotFound(f"no evaluation set revision {body.set_revision_id} that you can see")
    baseline = (
        queries.visible_version(principal, body.baseline_version_id)
        if body.baseline_version_id is not None
        else None
    )
    run = services.start_run(
        principal=principal,
        candidate=candidate,
        set_revision=revision,
        baseline=baseline,
        alias=body.alias,
    )
    return Status(202, run_out(get_visible_run(principal, run.pk)))


@router.get("/evaluations", response=list[RunOut])
def list_runs(
    request: HttpRequest,
    version_id: int | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
):
    """Runs you can see, newest first; `?version_id=` those whose candidate it is."""
    qs = visible_runs(_principal(request))
    if version_id is not None:
        qs = qs.filter(candidate_id=version_id)
    return [run_out(r) for r in qs.order_by("-created_at")[:limit]]


@router.get("/evaluations/{run_id}", response=RunOut)
def get_run(request: HttpRequest, run_id: int):
    return run_out(get_visible_run(_principal(request), run_id))


@router.get("/evaluations/{run_id}/cases", response=list[CaseResultOut])
def list_case_results(
    request: HttpRequest, run_id: int, failed: bool = False, changed: bool = False
):
    """The run's cases in order; `?failed=true` those the candidate failed, `?changed=true`
    those whose answers differ."""
    qs = get_visible_run(_principal(request), run_id).results.all()
    if failed:
        qs = qs.filter(candidate_passed=False)
    if changed:
        qs = qs.filter(exact_match=False)
    return list(qs)
