"""The gates of each phase: what the judge measures, against which threshold, and whether
the phase may move on. A gate with too little data *waits* (and says how much it has); it
never passes for lack of data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from apps.evaluations.models import EvaluationRun
from apps.releases import nodes
from apps.releases.machine import ADVANCE, FAIL, HOLD, WAIT
from apps.releases.models import Release
from apps.releases.plan import Plan
from apps.telemetry import evidence

PASS = "pass"  # noqa: S105 (a verdict: PASS, FAIL or WAIT; a judgement's are machine.py's)


@dataclass
class Gate:
    gate: str
    verdict: str
    value: float | None = None
    threshold: float | None = None
    op: str = ""  # how value compares with threshold to pass: ">=" or "<="
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(name: str, value: float | None, op: str, threshold: float, detail: str = "") -> Gate:
    if value is None:
        return Gate(name, WAIT, None, threshold, op, detail or "no data yet")
    ok = value >= threshold if op == ">=" else value <= threshold
    return Gate(name, PASS if ok else FAIL, round(value, 4), round(threshold, 4), op, detail)


def conclude(gates: list[Gate], *, dwell_over: bool) -> str:
    verdicts = {g.verdict for g in gates}
    if FAIL in verdicts:
        return FAIL
    if WAIT in verdicts:
        return WAIT
    return ADVANCE if dwell_over else HOLD


def prewarming(release: Release, plan: Plan, now: datetime) -> tuple[list[Gate], str]:
    warmed, errors = nodes.prewarm(release.candidate)
    detail = "; ".join(f"{n}: {e}" for n, e in errors.items())
    if warmed:
        gate = Gate("prewarm", PASS, len(warmed), 1, ">=", f"in the engine of {', '.join(warmed)}")
        return [gate], ADVANCE
    if any("quarantined" in e or "refused" in e for e in errors.values()):
        return [Gate("prewarm", FAIL, 0, 1, ">=", detail)], FAIL
    return [Gate("prewarm", WAIT, 0, 1, ">=", detail or "no ready serving node yet")], WAIT


def evaluating(release: Release, plan: Plan, now: datetime) -> tuple[list[Gate], str]:
    runs = {r.pk: r for r in EvaluationRun.objects.filter(pk__in=release.evidence.get("runs", []))}
    gates = []
    for run_id in release.evidence.get("runs", []):
        run = runs.get(run_id)
        name = f"evaluation {run.set_revision.label}" if run else f"evaluation run {run_id}"
        if run is None:
            gates.append(Gate(name, FAIL, detail="the run is gone"))
        elif run.state in (EvaluationRun.State.QUEUED, EvaluationRun.State.RUNNING):
            gates.append(
                Gate(name, WAIT, detail=f"run {run.pk}: {run.cases_done}/{run.cases_total} cases")
            )
        elif run.state == EvaluationRun.State.FAILED:
            gates.append(Gate(name, FAIL, detail=f"run {run.pk} failed: {run.error}"))
        else:
            candidate = (run.summary.get("candidate") or {}).get("pass_rate")
            baseline = (run.summary.get("baseline") or {}).get("pass_rate")
            if candidate is None or baseline is None:
                gates.append(Gate(name, PASS, detail=f"run {run.pk}: no case expects anything"))
            else:
                gates.append(
                    compare(
                        f"{name}: candidate pass rate",
                        candidate,
                        ">=",
                        baseline - plan.evaluation_max_drop,
                        f"run {run.pk}: baseline {baseline:.2f} - δ {plan.evaluation_max_drop}",
                    )
                )
    return gates, conclude(gates, dwell_over=True)


def shadowing(release: Release, plan: Plan, now: datetime) -> tuple[list[Gate], str]:
    since = release.step_started_at
    shadow = evidence.shadowed(release.alias, release.candidate, since)
    live = evidence.traffic(release.alias, release.baseline, since)
    enough = shadow.compared >= plan.shadow_min_comparisons
    waiting = f"{shadow.compared} of {plan.shadow_min_comparisons} comparisons"
    gates = [
        compare(
            "shadow agreement",
            shadow.agreement if enough else None,
            ">=",
            plan.shadow_min_agreement,
            f"{shadow.exact} identical of {shadow.compared}" if enough else waiting,
        ),
        compare(
            "shadow error rate",
            shadow.error_rate if enough else None,
            "<=",
            (live.error_rate or 0.0) + plan.shadow_max_error_increase,
            f"live {live.error_rate or 0:.3f} + δ" if enough else waiting,
        ),
    ]
    if plan.shadow_max_ttft_ratio is not None:
        gates.append(
            compare(
                "shadow TTFT ratio (means)",
                shadow.ttft_ms / shadow.live_ttft_ms
                if enough and shadow.ttft_ms and shadow.live_ttft_ms
                else None,
                "<=",
                plan.shadow_max_ttft_ratio,
                f"{shadow.ttft_ms or 0:.0f} ms against live {shadow.live_ttft_ms or 0:.0f} ms"
                if enough
                else waiting,
            )
        )
    dwell_over = (now - since).total_seconds() >= plan.shadow_duration_s
    return gates, conclude(gates, dwell_over=dwell_over)


def canary(release: Release, plan: Plan, now: datetime) -> tuple[list[Gate], str]:
    step = plan.canary_steps[release.step]
    candidate = evidence.traffic(release.alias, release.candidate, release.step_started_at)
    baseline = evidence.traffic(release.alias, release.baseline, release.created_at)
    enough = candidate.requests >= step.min_requests
    waiting = f"{candidate.requests} of {step.min_requests} requests"
    gates = [
        Gate(
            "canary requests",
            PASS if enough else WAIT,
            candidate.requests,
            step.min_requests,
            ">=",
            "" if enough else waiting,
        ),
        compare(
            "canary error rate",
            candidate.error_rate if enough else None,
            "<=",
            (baseline.error_rate or 0.0) + plan.canary_max_error_increase,
            f"server failures {candidate.errors} of {candidate.requests}; baseline "
            f"{baseline.error_rate or 0:.3f} + δ (not judged: {candidate.caller_errors} caller "
            f"errors, {candidate.throttled} throttled)"
            if enough
            else waiting,
        ),
        compare(
            "canary quality markers",
            candidate.marker_rate if enough else None,
            "<=",
            (baseline.marker_rate or 0.0) + plan.canary_max_marker_increase,
            "answers cut, empty or invalid JSON, of the answered requests; baseline "
            f"{baseline.marker_rate or 0:.3f} + δ"
            if enough
            else waiting,
        ),
    ]
    if plan.canary_max_ttft_ratio is not None:
        gates.insert(
            2,
            compare(
                "canary TTFT p95 ratio",
                candidate.ttft_p95_ms / baseline.ttft_p95_ms
                if enough and candidate.ttft_p95_ms and baseline.ttft_p95_ms
                else None,
                "<=",
                plan.canary_max_ttft_ratio,
                f"{candidate.ttft_p95_ms or 0:.0f} ms against {baseline.ttft_p95_ms or 0:.0f} ms"
                if enough
                else waiting,
            ),
        )
    dwell_over = (now - release.step_started_at).total_seconds() >= step.dwell_s
    return gates, conclude(gates, dwell_over=dwell_over)


CHECKS: dict[str, Callable[[Release, Plan, datetime], tuple[list[Gate], str]]] = {
    Release.State.PREWARMING: prewarming,
    Release.State.EVALUATING: evaluating,
    Release.State.SHADOWING: shadowing,
    Release.State.CANARY: canary,
}
