"""Serving's panels on pages other apps own: the alias page's canary and shadow evidence.

Registry's views never import serving (serving depends on registry, not back); the alias
page's template loads this library instead, so the page shows what the nodes recorded."""

from __future__ import annotations

from datetime import timedelta

from django import template
from django.utils import timezone

from apps.registry.models import Alias
from apps.telemetry import charts
from apps.telemetry.dashboards import shadow_evidence
from apps.telemetry.evidence import canary_evidence

register = template.Library()


@register.inclusion_tag("serving/canary_evidence.html")
def canary_evidence_panel(alias: Alias) -> dict:
    """Stable against canary since the canary started (nothing without a canary)."""
    return {
        "alias": alias,
        "evidence": canary_evidence(alias) if alias.canary_version_id else None,
    }


@register.inclusion_tag("serving/shadow_evidence.html")
def shadow_panel(alias: Alias) -> dict:
    """The shadow's copies and their agreement with the live answers (nothing without one)."""
    evidence = shadow_evidence(alias) if alias.shadow_version_id else None
    return {
        "alias": alias,
        "evidence": evidence,
        "figure": (
            charts.shadow(
                evidence["minutes"],
                evidence["since"].isoformat(),
                (timezone.now() + timedelta(minutes=1)).isoformat(),
            )
            if evidence
            else None
        ),
    }
