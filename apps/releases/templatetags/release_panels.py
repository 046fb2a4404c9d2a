"""The alias page's releases panel (registry owns the page and never imports releases, which
build on it): the active release, past ones, and the form that starts one."""

from __future__ import annotations

from django import template

from apps.evaluations.models import EvaluationSet
from apps.registry.choices import VersionState
from apps.registry.models import Alias
from apps.releases import defaults
from apps.releases.models import Release

register = template.Library()


@register.inclusion_tag("releases/panel.html", takes_context=True)
def release_panel(context, alias: Alias) -> dict:
    request = context["request"]
    releases = list(
        Release.objects.filter(alias=alias).select_related("candidate", "baseline")[:10]
    )
    active = next((r for r in releases if r.is_active), None)
    form = request.session.pop("release_form", None) or {}
    plan = defaults.effective_plan(alias.tenant).model_dump(mode="json")
    steps = plan["canary_steps"]
    values = {
        **{k: v for k, v in plan.items() if not isinstance(v, list | dict)},
        "canary_steps": ", ".join(str(s["percent"]) for s in steps),
        "dwell_s": steps[0]["dwell_s"],
        "min_requests": steps[0]["min_requests"],
        **form.get("values", {}),
    }
    candidates = alias.adapter.versions.filter(
        state=VersionState.APPROVED, signature__gt=""
    ).exclude(pk=alias.version_id)
    return {
        "request": request,
        "csrf_token": context.get("csrf_token"),
        "alias": alias,
        "active": active,
        "past": [r for r in releases if not r.is_active],
        "candidates": candidates.order_by("-created_at"),
        "sets": EvaluationSet.objects.filter(adapter=alias.adapter, revisions__isnull=False)
        .distinct()
        .order_by("name"),
        "values": values,
        "errors": form.get("errors", {}),
        "chosen_sets": form.get("values", {}).get("evaluation_sets", plan["evaluation_sets"]),
    }
