"""Evaluations' panel on the version page, which registry owns: registry's views never
import evaluations (evaluations depend on registry); the page's template loads this library."""

from __future__ import annotations

from django import template

from apps.evaluations.models import EvaluationRun, EvaluationSetRevision
from apps.registry.models import AdapterVersion
from apps.registry.snapshots import serving_version

register = template.Library()


@register.inclusion_tag("evaluations/panel.html", takes_context=True)
def evaluation_panel(context, version: AdapterVersion) -> dict:
    """The adapter's sets (latest revision of each), the runs of this version, and the form
    that evaluates it against what the adapter's alias serves now."""
    latest: dict[int, EvaluationSetRevision] = {}
    revisions = EvaluationSetRevision.objects.filter(set__adapter=version.adapter).select_related(
        "set"
    )
    for revision in revisions.order_by("set__name", "revision"):
        latest[revision.set_id] = revision
    runs = (
        EvaluationRun.objects.filter(candidate=version)
        .select_related("baseline", "set_revision__set")
        .order_by("-created_at")[:10]
    )
    return {
        "request": context["request"],
        "csrf_token": context.get("csrf_token"),
        "version": version,
        "sets": list(latest.values()),
        "runs": runs,
        "baseline": serving_version(version.adapter),
    }
