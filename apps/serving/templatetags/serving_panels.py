"""Serving's panels on pages other apps own: the alias page's canary evidence.

Registry's views never import serving (serving depends on registry, not back); the alias
page's template loads this library instead, so the page shows what the nodes recorded."""

from __future__ import annotations

from django import template

from apps.registry.models import Alias
from apps.serving.console.dashboards import canary_evidence

register = template.Library()


@register.inclusion_tag("serving/canary_evidence.html")
def canary_evidence_panel(alias: Alias) -> dict:
    """Stable against canary since the canary started (nothing without a canary)."""
    return {
        "alias": alias,
        "evidence": canary_evidence(alias) if alias.canary_version_id else None,
    }
