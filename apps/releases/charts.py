"""The release page's Plotly figures, over the release's window only (its start to its end):
the canary error gate's own value at each judgement beside the server-failure rate per minute
(apps/telemetry/outcomes.py: the one definition), the callers' errors and throttling apart (never
judged), TTFT p95, quality markers and shadow agreement, with the release's steps marked."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from apps.releases.models import Release
from apps.telemetry import dashboards

Figure = dict[str, Any]
STEP_KINDS = ("start", "advance", "promote", "rollback", "abort", "pause", "resume")
COLORS = {"baseline": "#3b82c4", "candidate": "#c0392b"}


def _markers(minute: dict) -> float | None:
    """The quality markers' share of the answered requests, as the judge counts them
    (``apps/telemetry/evidence.py``): callers' errors and throttled requests are no answers."""
    n = minute["requests"]
    if not n or minute["errors"] is None:  # nothing, or outcomes unknown for the minute
        return None
    cancelled = round((minute["cancelled_rate"] or 0) * n)
    answered = n - minute["errors"] - minute["caller_errors"] - minute["throttled"] - cancelled
    if answered <= 0:
        return None
    cut = (minute["cut_rate"] or 0) * n
    empty = (minute["empty_rate"] or 0) * n
    invalid = (minute["json_invalid_rate"] or 0) * minute["json_requests"]
    return min(1.0, (cut + empty + invalid) / answered)


def _step_marks(release: Release) -> tuple[list[dict], list[dict]]:
    """A dotted line and a label at each of the release's steps. Steps seconds apart would
    print their labels over each other: three rows of labels, taken in turn, each short."""
    shapes, notes = [], []
    for n, event in enumerate(release.events.filter(kind__in=STEP_KINDS).order_by("at", "id")):
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
                "y": 1 + 0.08 * (n % 3),
                "xref": "x",
                "yref": "paper",
                "text": label,
                "showarrow": False,
                "font": {"size": 10},
                "yanchor": "bottom",
            }
        )
    return shapes, notes


def _gate_traces(release: Release, judged: list[dict]) -> list[dict]:
    """The canary error gate's value at each judgement, and its limit."""
    return [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "line": {"shape": "hv", "color": "#7b241c", "width": 3},
            "marker": {"size": 7, "symbol": "diamond"},
            "name": f"{release.candidate.label}: the canary gate's value (its step so far)",
            "x": [p["t"] for p in judged],
            "y": [p["value"] for p in judged],
        },
        {
            "type": "scatter",
            "mode": "lines",
            "line": {"shape": "hv", "color": "#7b241c", "dash": "dash", "width": 1},
            "name": "the gate's limit",
            "x": [p["t"] for p in judged],
            "y": [p["max"] for p in judged],
        },
    ]


@dataclass(frozen=True)
class _Frame:
    """What every figure of a release shares: its window and its step marks."""

    start: str
    until: str
    shapes: list[dict]
    notes: list[dict]

    def figure(
        self,
        title: str,
        y_title: str,
        series: dict[str, tuple[str, list]],
        extra: list | None = None,
        **axis: Any,
    ) -> Figure:
        return {
            "data": [
                *(extra or []),
                *(
                    {
                        "type": "scatter",
                        "mode": "lines+markers",
                        "name": name,
                        "x": [p[0] for p in points],
                        "y": [p[1] for p in points],
                        "line": {"color": COLORS.get(role.split(":")[0], "#555")}
                        | ({"dash": "dot"} if ":" in role else {}),
                        "marker": {"size": 6},
                    }
                    for role, (name, points) in series.items()
                ),
            ],
            "layout": {
                "title": {"text": title, "font": {"size": 14}, "y": 0.97, "yref": "container"},
                "margin": {"l": 55, "r": 25, "t": 96, "b": 40},
                "height": 310,
                "xaxis": {"type": "date", "range": [self.start, self.until]},
                "yaxis": {"title": {"text": y_title}, "rangemode": "tozero", **axis},
                "legend": {"orientation": "h", "y": -0.25},
                "shapes": self.shapes,
                "annotations": self.notes,
            },
        }


def _minutes(release: Release, since, end) -> dict[str, list[dict]]:
    """Both versions' minutes through the alias over the release's window: a minute's row is
    drawn at its start, or at the release's start for the minute the release began in (never
    before the release); the minutes after it ended are another story."""
    minutes = dashboards.version_minutes(
        tenant_id=release.tenant_id,
        alias=release.alias.name,
        versions=[release.baseline.version, release.candidate.version],
        since=since,
        until=end,
    )
    for rows in minutes.values():
        for row in rows:
            row["t"] = max(row["t"], release.created_at.isoformat())
    return minutes


def figures(release: Release) -> dict[str, Figure]:
    """Keyed by the element each fills."""
    since = release.created_at.replace(second=0, microsecond=0)  # its first minute's row
    end = release.finished_at or timezone.now()
    minutes = _minutes(release, since, end)
    start = release.created_at
    # the data ends with the release; the axis a little after, so that the last step's
    # marker and label (recorded a moment after the end) stay inside it
    pad = max(timedelta(seconds=1), (end - start) * 0.03)
    shown_until = (end + pad).isoformat()
    sides = {
        "baseline": (release.baseline.label, minutes[release.baseline.version]),
        "candidate": (release.candidate.label, minutes[release.candidate.version]),
    }
    shapes, notes = _step_marks(release)

    frame = _Frame(start.isoformat(), shown_until, shapes, notes)
    figure = frame.figure

    def per_side(read, suffix: str = "") -> dict[str, tuple[str, list]]:
        return {
            role: (f"{label}{suffix}", [(m["t"], read(m)) for m in rows])
            for role, (label, rows) in sides.items()
        }

    judged = release.evidence.get("judged", [])
    gate = _gate_traces(release, judged)

    shadow = dashboards.shadow_minutes(
        tenant_id=release.tenant_id,
        alias=release.alias.name,
        shadow_version=release.candidate.version,
        since=since,
    )
    found = {
        "chart-release-errors": figure(
            "Server failures: the canary gate's value, and per minute",
            "share of requests",
            per_side(lambda m: m["error_rate"], " per minute"),
            extra=gate if judged else [],
            tickformat=".1%",
        ),
        "chart-release-callers": figure(
            "Caller errors (4xx) and throttling (429): not judged",
            "share of requests",
            {
                **per_side(lambda m: m["caller_error_rate"], " caller errors"),
                **{
                    f"{role}:throttled": (f"{label} throttled", points)
                    for role, (label, points) in per_side(lambda m: m["throttled_rate"]).items()
                },
            },
            tickformat=".0%",
        ),
        "chart-release-ttft": figure("TTFT p95", "ms", per_side(lambda m: m["ttft_p95"])),
        "chart-release-markers": figure(
            "Quality markers (cut, empty, invalid JSON)",
            "share of answered requests",
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
