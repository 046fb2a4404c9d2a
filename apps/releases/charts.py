"""The release page's Plotly figures: candidate against baseline per minute (error rate, TTFT
p95, quality markers, shadow agreement), with the release's steps marked."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from apps.releases.models import Release
from apps.serving.console import dashboards

Figure = dict[str, Any]
STEP_KINDS = ("start", "advance", "promote", "rollback", "abort", "pause", "resume")
COLORS = {"baseline": "#3b82c4", "candidate": "#c0392b"}


def _markers(minute: dict) -> float | None:
    n = minute["requests"]
    if not n:
        return None
    cut = (minute["cut_rate"] or 0) * n
    empty = (minute["empty_rate"] or 0) * n
    invalid = (minute["json_invalid_rate"] or 0) * minute["json_requests"]
    return (cut + empty + minute["refused"] + invalid) / n


def figures(release: Release) -> dict[str, Figure]:
    """Keyed by the element each fills."""
    since = release.created_at.replace(second=0, microsecond=0)  # its first minute's row
    until = (release.finished_at or timezone.now()).isoformat()
    minutes = dashboards.version_minutes(
        tenant_id=release.tenant_id,
        alias=release.alias.name,
        versions=[release.baseline.version, release.candidate.version],
        since=since,
    )
    sides = {
        "baseline": (release.baseline.label, minutes[release.baseline.version]),
        "candidate": (release.candidate.label, minutes[release.candidate.version]),
    }
    shapes, notes = [], []
    for event in release.events.filter(kind__in=STEP_KINDS):
        at = event.at.isoformat()
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": at,
                "x1": at,
                "y0": 0,
                "y1": 1,
                "line": {"color": "#888", "width": 1, "dash": "dot"},
            }
        )
        label = event.to_state if event.to_state != "canary" else f"step {event.step + 1}"
        notes.append(
            {
                "x": at,
                "y": 1,
                "xref": "x",
                "yref": "paper",
                "text": label,
                "showarrow": False,
                "font": {"size": 10},
                "yanchor": "bottom",
            }
        )

    def figure(title: str, y_title: str, series: dict[str, tuple[str, list]], **axis: Any):
        return {
            "data": [
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": name,
                    "x": [p[0] for p in points],
                    "y": [p[1] for p in points],
                    "line": {"color": COLORS.get(role, "#555")},
                    "marker": {"size": 6},
                }
                for role, (name, points) in series.items()
            ],
            "layout": {
                "title": {"text": title, "font": {"size": 14}},
                "margin": {"l": 55, "r": 15, "t": 48, "b": 40},
                "height": 260,
                "xaxis": {"type": "date", "range": [since.isoformat(), until]},
                "yaxis": {"title": {"text": y_title}, "rangemode": "tozero", **axis},
                "legend": {"orientation": "h", "y": -0.25},
                "shapes": shapes,
                "annotations": notes,
            },
        }

    def per_side(read) -> dict[str, tuple[str, list]]:
        return {
            role: (label, [(m["t"], read(m)) for m in rows])
            for role, (label, rows) in sides.items()
        }

    shadow = dashboards.shadow_minutes(
        tenant_id=release.tenant_id,
        alias=release.alias.name,
        shadow_version=release.candidate.version,
        since=since,
    )
    found = {
        "chart-release-errors": figure(
            "Error rate", "share", per_side(lambda m: m["error_rate"]), tickformat=".0%"
        ),
        "chart-release-ttft": figure("TTFT p95", "ms", per_side(lambda m: m["ttft_p95"])),
        "chart-release-markers": figure(
            "Quality markers (cut, empty, refused, invalid JSON)",
            "share of requests",
            per_side(_markers),
            tickformat=".0%",
        ),
        "chart-release-agreement": figure(
            "Shadow agreement with the live answers",
            "share identical",
            {"candidate": (release.candidate.label, [(m["t"], m["agreement"]) for m in shadow])},
            tickformat=".0%",
            range=[0, 1.05],
        ),
    }
    if not release.plan.get("shadow_percent"):
        del found["chart-release-agreement"]  # no shadow in this plan: nothing to draw
    return found
