"""The release state machine's table (``apps/releases/machine.py``), without a database."""

from __future__ import annotations

import pytest

from apps.releases import machine
from apps.releases.machine import AliasMove, Transition
from apps.releases.plan import build

TWO_STEPS = {
    "failure_threshold": 2,
    "canary_steps": [
        {"percent": 10, "dwell_s": 1, "min_requests": 5},
        {"percent": 100, "dwell_s": 1, "min_requests": 5},
    ],
}


@pytest.mark.parametrize(
    ("overrides", "phases"),
    [
        ({"prewarm": True}, ["prewarming", "canary"]),
        ({"prewarm": False}, ["canary"]),
        ({"prewarm": False, "shadow_percent": 20}, ["shadowing", "canary"]),
        ({"prewarm": True, "shadow_percent": 5}, ["prewarming", "shadowing", "canary"]),
    ],
)
def test_a_release_runs_the_phases_its_plan_asks_for_in_order(overrides, phases):
    plan = build(TWO_STEPS, overrides)
    seen, state = [], machine.next_phase(plan, None)
    while state != "promoted":
        seen.append(state)
        step = 0
        move = machine.after_judgement(state, step, 0, machine.ADVANCE, plan)
        while move.state == "canary" and move.step > step:  # through every canary step
            step = move.step
            move = machine.after_judgement("canary", step, 0, machine.ADVANCE, plan)
        state = move.state
    assert list(dict.fromkeys(seen)) == phases


@pytest.mark.parametrize(
    ("state", "step", "failures", "verdict", "expected"),
    [
        # a failed check counts; the threshold's rolls back to the baseline alone
        ("canary", 0, 0, "fail", Transition("canary", 0, 1, "check")),
        (
            "canary",
            1,
            1,
            "fail",
            Transition(
                "rolled_back",
                1,
                2,
                "rollback",
                (AliasMove("canary"), AliasMove("shadow"), AliasMove("stable", "baseline")),
            ),
        ),
        # a passing check resets the count; one still waiting for data leaves it
        ("canary", 0, 1, "hold", Transition("canary", 0, 0, "hold")),
        ("canary", 0, 1, "wait", Transition("canary", 0, 1, "wait")),
        # an advance enters the next step, then promotes
        (
            "canary",
            0,
            1,
            "advance",
            Transition(
                "canary",
                1,
                0,
                "advance",
                (AliasMove("shadow"), AliasMove("canary", "candidate", 100)),
            ),
        ),
        (
            "canary",
            1,
            0,
            "advance",
            Transition(
                "promoted",
                1,
                0,
                "promote",
                (AliasMove("shadow"), AliasMove("promote", "candidate")),
            ),
        ),
        # a phase before the canary moves on to the next the plan runs
        (
            "prewarming",
            0,
            0,
            "advance",
            Transition(
                "canary",
                0,
                0,
                "advance",
                (AliasMove("shadow"), AliasMove("canary", "candidate", 10)),
            ),
        ),
    ],
)
def test_each_verdict_s_transition(state, step, failures, verdict, expected):
    plan = build(TWO_STEPS, {"prewarm": True})
    assert machine.after_judgement(state, step, failures, verdict, plan) == expected


def test_an_unknown_verdict_is_refused_not_taken_for_an_advance():
    with pytest.raises(ValueError, match="unknown verdict"):
        machine.after_judgement("canary", 0, 0, "pass", build(TWO_STEPS))


def test_a_shadow_phase_mirrors_the_candidate_and_the_canary_ends_the_mirror():
    plan = build(TWO_STEPS, {"shadow_percent": 20})
    assert machine.alias_target("shadowing", 0, plan) == (AliasMove("shadow", "candidate", 20),)
    assert AliasMove("shadow") in machine.alias_target("canary", 0, plan)
    assert machine.alias_target("prewarming", 0, plan) == ()  # the alias stays as it is
