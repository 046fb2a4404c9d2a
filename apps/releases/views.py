"""Console pages of releases: start one from the alias page, follow it on its page (timeline,
gates against thresholds, charts, the split now, the controls), and the lists."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.registry.models import AdapterVersion, Alias
from apps.releases import charts, services
from apps.releases.api import visible_releases
from apps.releases.models import Release
from apps.releases.plan import PlanError, parse_steps
from apps.tenants.console import (
    act,
    operators,
    principal_of,
    require,
    signed_in,
    table,
    tenant_or_404,
)
from apps.tenants.errors import DomainError

NUMBER_FIELDS = (
    ("interval_s", int),
    ("failure_threshold", int),
    ("evaluation_max_drop", float),
    ("shadow_percent", int),
    ("shadow_duration_s", int),
    ("shadow_min_comparisons", int),
    ("shadow_min_agreement", float),
    ("canary_max_error_increase", float),
    ("canary_max_ttft_ratio", float),
    ("canary_max_marker_increase", float),
)
# gates that "off" turns off
OPTIONAL_FIELDS = {"canary_max_ttft_ratio"}


def plan_from_form(post: Any) -> dict[str, Any]:
    """The start form's fields as plan overrides; a field that is not a number is named."""
    plan: dict[str, Any] = {"prewarm": post.get("prewarm") == "on"}
    errors = {}
    for name, kind in NUMBER_FIELDS:
        raw = (post.get(name) or "").strip()
        if raw.lower() == "off" and name in OPTIONAL_FIELDS:
            plan[name] = None
        elif raw:
            try:
                plan[name] = kind(raw)
            except ValueError:
                errors[name] = f"'{raw}' is not a {'whole ' if kind is int else ''}number" + (
                    ", or off" if name in OPTIONAL_FIELDS else ""
                )
    plan["evaluation_sets"] = post.getlist("evaluation_sets")
    try:
        dwell = int(post.get("dwell_s") or 300)
        minimum = int(post.get("min_requests") or 50)
    except ValueError:
        errors["canary_steps"] = "dwell and minimum requests are whole numbers"
        dwell, minimum = 300, 50
    try:
        steps = parse_steps(post.get("canary_steps") or "", dwell_s=dwell, min_requests=minimum)
        if steps:
            plan["canary_steps"] = steps
    except PlanError as exc:
        errors.update(exc.fields)
    if errors:
        raise PlanError(errors)
    return plan


@require(signed_in, "signed-in users")
@require_POST
def start(request: HttpRequest, slug: str, name: str) -> HttpResponse:
    """The alias page's "Start a release"; its errors are shown beside their fields."""
    principal = principal_of(request)
    tenant = tenant_or_404(principal, slug)
    alias = Alias.objects.filter(tenant=tenant, name=name).select_related("adapter").first()
    if alias is None:
        raise Http404(f"tenant '{slug}' has no alias '{name}'")
    back = reverse("registry:alias", args=[slug, name])
    candidate = (
        AdapterVersion.objects.visible_to(principal)
        .filter(pk=request.POST.get("version_id") or 0, adapter=alias.adapter)
        .first()
    )
    try:
        if candidate is None:
            raise PlanError({"version_id": "pick an approved version of this alias's adapter"})
        plan = plan_from_form(request.POST)
        release = services.start(principal=principal, alias=alias, candidate=candidate, plan=plan)
    except PlanError as exc:
        request.session["release_form"] = {"errors": exc.fields, "values": request.POST.dict()}
        messages.error(request, exc.message)
        return redirect(f"{back}#release")
    except DomainError as exc:
        messages.error(request, exc.message)
        return redirect(f"{back}#release")
    messages.success(request, f"Release #{release.pk} of {alias.name} to {candidate.label} started")
    return redirect("releases:release", release.pk)


@require(signed_in, "signed-in users")
def release_detail(request: HttpRequest, release_id: int) -> HttpResponse:
    principal = principal_of(request)
    release = visible_releases(principal).filter(pk=release_id).first()
    if release is None:
        raise Http404(f"no release {release_id} that you can see")
    plan = release.plan
    steps = plan.get("canary_steps", [])
    split = None
    if release.is_active:
        alias = release.alias
        alias.refresh_from_db()
        canary = alias.canary_percent if alias.canary_version_id == release.candidate_id else 0
        split = {
            "baseline": 100 - canary,
            "candidate": canary,
            "shadow": alias.shadow_percent
            if alias.shadow_version_id == release.candidate_id
            else 0,
        }
    can_control = release.tenant_id in principal.admin_tenant_ids or principal.is_operator
    return render(
        request,
        "releases/release.html",
        {
            "release": release,
            "tenant": release.tenant,
            "events": release.events.all(),
            "steps": steps,
            "split": split,
            "figures": charts.figures(release),
            "last_check": release.last_check,
            "can_control": can_control and release.is_active,
            "section": "aliases",
        },
    )


@require(signed_in, "signed-in users")
@require_POST
def control(request: HttpRequest, release_id: int, verb: str) -> HttpResponse:
    principal = principal_of(request)
    release = visible_releases(principal).filter(pk=release_id).first()
    if release is None or verb not in ("pause", "resume", "promote", "abort"):
        raise Http404(f"no release {release_id} that you can see")
    back = reverse("releases:release", args=[release_id])
    done = {
        "pause": "Paused: the split holds until you resume.",
        "resume": "Resumed: the step's evidence window starts again.",
        "promote": f"{release.candidate.label} is now the stable version of {release.alias.name}.",
        "abort": f"Aborted: {release.alias.name} serves {release.baseline.label} alone; "
        f"{release.candidate.label} is being cooled on every node.",
    }[verb]

    def apply() -> None:
        if verb == "abort":
            services.abort(principal=principal, release=release, reason="aborted from the console")
        elif verb == "promote":
            services.promote_now(principal=principal, release=release)
        else:
            getattr(services, verb)(principal=principal, release=release)

    return act(request, apply, done, back)


def _listing(request: HttpRequest, qs, **context: Any) -> HttpResponse:
    listing = table(
        request,
        qs,
        sorts={"started": "created_at", "state": "state", "alias": "alias__name"},
        default="-started",
    )
    return render(request, "releases/list.html", {"table": listing, **context})


@require(signed_in, "signed-in users")
def tenant_releases(request: HttpRequest, slug: str) -> HttpResponse:
    principal = principal_of(request)
    tenant = tenant_or_404(principal, slug)
    qs = visible_releases(principal).filter(tenant=tenant)
    return _listing(request, qs, tenant=tenant, section="aliases")


@require(operators, "operators")
def operator_releases(request: HttpRequest) -> HttpResponse:
    qs = visible_releases(principal_of(request)).all()
    active = request.GET.get("active") == "1"
    if active:
        qs = qs.filter(state__in=Release.ACTIVE)
    return _listing(request, qs, tenant=None, active=active, section="releases")
