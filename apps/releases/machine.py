"""The release state machine, as a table: pure, no database.

A release runs through its phases in ``PHASES`` order, skipping those its plan leaves out
(``runs``), then ends promoted, rolled back or aborted. ``after_judgement`` is the whole rule
for what a judgement's verdict does; ``alias_target`` says what the alias must look like in a
state, as moves that ``services.py`` applies idempotently under the release's row lock (a
worker killed half-way leaves a state that entering again completes).
"""

from __future__ import annotations

from dataclasses import dataclass

from apps.releases.plan import Plan

# what a judgement concludes (``gates.conclude``): move on, stay (the gates pass, the dwell is
# not over), wait for data, or fail
ADVANCE, HOLD, WAIT, FAIL = "advance", "hold", "wait", "fail"

PREWARMING, EVALUATING, SHADOWING, CANARY = "prewarming", "evaluating", "shadowing", "canary"
PAUSED = "paused"
PROMOTED, ROLLED_BACK, ABORTED = "promoted", "rolled_back", "aborted"
PHASES = (PREWARMING, EVALUATING, SHADOWING, CANARY)  # the order a release runs them in
FINAL = (PROMOTED, ROLLED_BACK, ABORTED)


@dataclass(frozen=True)
class AliasMove:
    """One part of the alias: ``stable``, ``canary`` or ``shadow``, set to ``candidate``,
    ``baseline`` or ``none`` (cleared); ``promote`` makes the canary the stable version."""

    part: str
    to: str = "none"
    percent: int = 0


@dataclass(frozen=True)
class Transition:
    """Where a judgement leaves a release, and the timeline entry that records it."""

    state: str
    step: int
    failures: int  # consecutive failed checks
    event: str  # advance, promote, rollback, check (a failed check), hold, wait
    moves: tuple[AliasMove, ...] = ()


def runs(plan: Plan, phase: str) -> bool:
    return {
        PREWARMING: plan.prewarm,
        EVALUATING: bool(plan.evaluation_sets),
        SHADOWING: plan.shadow_percent > 0,
        CANARY: True,
    }[phase]


def next_phase(plan: Plan, current: str | None) -> str:
    """The first phase the plan runs after ``current`` (None: the release's first)."""
    start = 0 if current is None else PHASES.index(current) + 1
    return next(phase for phase in PHASES[start:] if runs(plan, phase))


def alias_target(state: str, step: int, plan: Plan) -> tuple[AliasMove, ...]:
    """What the alias must look like while the release is in ``state`` (at ``step``)."""
    if state == SHADOWING:
        return (AliasMove("shadow", "candidate", plan.shadow_percent),)
    if state == CANARY:
        return (
            AliasMove("shadow"),
            AliasMove("canary", "candidate", plan.canary_steps[step].percent),
        )
    if state == PROMOTED:
        return (AliasMove("shadow"), AliasMove("promote", "candidate"))
    if state in (ROLLED_BACK, ABORTED):
        return (AliasMove("canary"), AliasMove("shadow"), AliasMove("stable", "baseline"))
    return ()


def after_judgement(state: str, step: int, failures: int, verdict: str, plan: Plan) -> Transition:
    """The rule: ``failure_threshold`` failed checks in a row roll back; a passing check resets
    the count, a check still waiting for data leaves it; an advance enters the next canary
    step, the next phase, or, after the last step, promotes."""
    if verdict == FAIL:
        failures += 1
        if failures >= plan.failure_threshold:
            moves = alias_target(ROLLED_BACK, step, plan)
            return Transition(ROLLED_BACK, step, failures, "rollback", moves)
        return Transition(state, step, failures, "check")
    if verdict == WAIT:
        return Transition(state, step, failures, WAIT)
    if verdict == HOLD:
        return Transition(state, step, 0, HOLD)
    if verdict != ADVANCE:
        raise ValueError(f"unknown verdict {verdict!r}")
    if state == CANARY and step + 1 < len(plan.canary_steps):
        return Transition(CANARY, step + 1, 0, "advance", alias_target(CANARY, step + 1, plan))
    if state == CANARY:
        return Transition(PROMOTED, step, 0, "promote", alias_target(PROMOTED, step, plan))
    phase = next_phase(plan, state)
    return Transition(phase, 0, 0, "advance", alias_target(phase, 0, plan))
