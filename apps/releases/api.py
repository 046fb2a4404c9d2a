"""Release endpoints: start a release of an alias, read releases, and the controls."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema, Status

from apps.registry import queries
from apps.registry.models import Alias
from apps.releases import defaults, services
from apps.releases.models import Release
from apps.tenants.api import visible_tenant
from apps.tenants.auth import API_AUTH, Principal
from apps.tenants.errors import Invalid, NotFound

router = Router(tags=["releases"], auth=API_AUTH)


class ReleaseIn(Schema):
    version_id: int
    plan: dict[str, Any] = {}  # overrides of the tenant's default plan (docs/releases.md)


class ReasonIn(Schema):
    reason: str = ""


class ReleaseEventOut(Schema):
    at: datetime
    kind: str
    from_state: str
    to_state: str
    step: int
    gates: list[dict[str, Any]]
    note: str
    actor: str
    timings: dict[str, Any]


class ReleaseOut(Schema):
    id: int
    tenant: str
    alias: str
    candidate: str
    candidate_version_id: int
    baseline: str
    baseline_version_id: int
    state: str
    paused_from: str
    step: int
    steps: int
    canary_percent: int
    plan: dict[str, Any]
    consecutive_failures: int
    last_check: dict[str, Any]
    outcome: str
    created_at: datetime
    finished_at: datetime | None
    events: list[ReleaseEventOut]


def _principal(request: HttpRequest) -> Principal:
    return request.auth  # type: ignore[attr-defined]  # set by ninja's auth


def release_out(release: Release) -> dict[str, Any]:
    steps = release.plan.get("canary_steps", [])
    on_canary = release.state == Release.State.CANARY or (
        release.state == Release.State.PAUSED and release.paused_from == Release.State.CANARY
    )
    return {
        "id": release.pk,
        "tenant": release.tenant.slug,
        "alias": release.alias.name,
        "candidate": release.candidate.label,
        "candidate_version_id": release.candidate_id,
        "baseline": release.baseline.label,
        "baseline_version_id": release.baseline_id,
        "state": release.state,
        "paused_from": release.paused_from,
        "step": release.step,
        "steps": len(steps),
        "canary_percent": steps[release.step]["percent"] if on_canary and steps else 0,
        "plan": release.plan,
        "consecutive_failures": release.consecutive_failures,
        "last_check": release.last_check,
        "outcome": release.outcome,
        "created_at": release.created_at,
        "finished_at": release.finished_at,
        "events": list(release.events.all()),
    }


def visible_releases(principal: Principal):
    qs = Release.objects.select_related(
        "tenant", "alias", "candidate__adapter", "baseline__adapter"
    )
    if principal.is_operator or principal.is_reviewer:
        return qs
    return qs.filter(tenant_id__in=principal.tenant_ids)


def get_visible_release(principal: Principal, release_id: int) -> Release:
    release = visible_releases(principal).filter(pk=release_id).first()
    if release is None:
        raise NotFound(f"no release {release_id} that you can see")
    return release


@router.post("/aliases/{name}/releases", response={201: ReleaseOut})
def start_release(request: HttpRequest, name: str, body: ReleaseIn, tenant: str | None = None):
    """Start a progressive release of the alias to an approved version: the tenant's plan with
    ``plan``'s overrides; 422 naming each bad field; 409 while another release drives it."""
    principal = _principal(request)
    target = principal.acting_tenant(tenant)
    alias = (
        Alias.objects.select_related("tenant", "adapter").filter(tenant=target, name=name).first()
    )
    if alias is None:
        raise NotFound(f"tenant '{target.slug}' has no alias '{name}'")
    candidate = queries.visible_version(principal, body.version_id)
    release = services.start(principal=principal, alias=alias, candidate=candidate, plan=body.plan)
    return Status(201, release_out(get_visible_release(principal, release.pk)))


@router.get("/releases", response=list[ReleaseOut])
def list_releases(
    request: HttpRequest, alias: str | None = None, active: bool = False, limit: int = 50
):
    qs = visible_releases(_principal(request))
    if alias:
        qs = qs.filter(alias__name=alias)
    if active:
        qs = qs.filter(state__in=Release.ACTIVE)
    return [release_out(r) for r in qs[: max(1, min(limit, 500))]]


@router.get("/releases/{release_id}", response=ReleaseOut)
def get_release(request: HttpRequest, release_id: int):
    return release_out(get_visible_release(_principal(request), release_id))


def _control(request: HttpRequest, release_id: int, verb: str, **kw: Any) -> dict[str, Any]:
    principal = _principal(request)
    release = get_visible_release(principal, release_id)
    getattr(services, verb)(principal=principal, release=release, **kw)
    return release_out(get_visible_release(principal, release_id))


@router.post("/releases/{release_id}/pause", response=ReleaseOut)
def pause_release(request: HttpRequest, release_id: int):
    """Hold the split: no judgement moves the release until it is resumed."""
    return _control(request, release_id, "pause")


@router.post("/releases/{release_id}/resume", response=ReleaseOut)
def resume_release(request: HttpRequest, release_id: int):
    """Continue from the step it was paused at; the step's evidence window starts again."""
    return _control(request, release_id, "resume")


@router.post("/releases/{release_id}/promote", response=ReleaseOut)
def promote_release(request: HttpRequest, release_id: int):
    """Make the candidate the stable version now, skipping the remaining gates."""
    return _control(request, release_id, "promote_now")


@router.post("/releases/{release_id}/abort", response=ReleaseOut)
def abort_release(request: HttpRequest, release_id: int, body: ReasonIn):
    """Roll back now: the alias to the baseline alone, the candidate cooled on every node."""
    return _control(request, release_id, "abort", reason=body.reason)


@router.get("/tenants/{slug}/release-defaults", response=dict[str, Any])
def get_release_defaults(request: HttpRequest, slug: str):
    """The plan a release of this tenant starts from (platform defaults + the tenant's)."""
    tenant = visible_tenant(_principal(request), slug)
    return defaults.effective_plan(tenant).model_dump(mode="json")


@router.put("/tenants/{slug}/release-defaults", response=dict[str, Any])
def put_release_defaults(request: HttpRequest, slug: str):
    """Set the tenant's overrides of the platform's plan: a JSON object of plan fields
    (docs/releases.md), each checked by the plan itself (422 naming each bad field)."""
    tenant = visible_tenant(_principal(request), slug)
    try:
        plan = json.loads(request.body or b"{}")
    except ValueError:
        plan = None
    if not isinstance(plan, dict):
        raise Invalid('send the plan\'s fields as one JSON object, e.g. {"interval_s": 10}')
    defaults.set_tenant_defaults(principal=_principal(request), tenant=tenant, plan=plan)
    return defaults.effective_plan(tenant).model_dump(mode="json")
