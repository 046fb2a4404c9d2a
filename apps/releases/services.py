"""Releases: start one, judge it, move it on, roll it back, and the controls people press.

What a judgement's verdict does is ``machine.py``'s table; this module applies one transition
at a time under the release's row lock, with the alias moves, timeline entries, audit events
and webhooks (``timeline.py``) that record it.

The judge (``judge``) runs in a Celery task: it locks the release row (``SKIP LOCKED``: a
second judge at the same moment does nothing), reads the evidence of the window since the
step began, and records the outcome in one transaction with the alias moves it makes. A
worker killed mid-judgement leaves the release as it was last recorded; the next judgement
continues from there, and re-entering a step is idempotent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.evaluations import services as evaluations
from apps.evaluations.models import EvaluationSet
from apps.registry import aliases
from apps.registry.models import AdapterVersion, Alias
from apps.releases import defaults, gates, machine, nodes, timeline
from apps.releases.models import Release
from apps.releases.plan import Plan, PlanError
from apps.tenants.auth import Principal
from apps.tenants.errors import Conflict, Forbidden, Invalid, NotFound
from lorahub.queueing import enqueue_on_commit

logger = logging.getLogger(__name__)
S = Release.State
# by name: tasks.py imports this module
JUDGE_TASK = "apps.releases.tasks.judge_release"
COOL_TASK = "apps.releases.tasks.cool_release"


def may_control(principal: Principal, release: Release) -> None:
    """Tenant admins (people or admin keys) for their aliases, operators for all."""
    if release.tenant_id not in principal.tenant_ids and not principal.is_operator:
        raise NotFound(f"no release {release.pk} that you can see")
    if release.tenant_id not in principal.admin_tenant_ids and not principal.is_operator:
        raise Forbidden(
            f"only an admin of tenant '{release.tenant.slug}' or an operator may control releases"
        )


# --- start, and each state's entry -----------------------------------------------------------


def start(
    *,
    principal: Principal,
    alias: Alias,
    candidate: AdapterVersion,
    plan: dict[str, Any] | None = None,
) -> Release:
    """Start a release of ``alias`` to ``candidate`` with the tenant's plan and ``plan``'s
    overrides; the baseline is the alias's stable version now."""
    if alias.tenant_id not in principal.admin_tenant_ids and not principal.is_operator:
        raise Forbidden(
            f"only an admin of tenant '{alias.tenant.slug}' or an operator may start releases"
        )
    chosen = defaults.effective_plan(alias.tenant, plan)
    known = set(
        EvaluationSet.objects.filter(adapter=alias.adapter, revisions__isnull=False).values_list(
            "name", flat=True
        )
    )
    missing = [name for name in chosen.evaluation_sets if name not in known]
    if missing:
        raise PlanError(
            {
                "evaluation_sets": f"adapter '{alias.adapter.adapter_id}' has no set "
                f"{', '.join(missing)} (it has: {', '.join(sorted(known)) or 'none'})"
            }
        )
    with transaction.atomic():
        locked = Alias.objects.select_for_update().get(pk=alias.pk)
        if candidate.adapter_id != locked.adapter_id:
            raise Invalid(
                f"{candidate.label} is not a version of '{locked.adapter.adapter_id}', which "
                f"alias '{locked.name}' serves"
            )
        if not candidate.is_servable:
            raise Invalid(
                f"{candidate.label} is {candidate.state.replace('_', ' ')}: only approved, "
                "signed versions are released"
            )
        if candidate.pk == locked.version_id:
            raise Invalid(f"{candidate.label} is already what '{locked.name}' serves")
        active = Release.objects.filter(alias=locked, state__in=Release.ACTIVE).first()
        if active is not None or locked.held_by:
            raise Conflict(
                f"alias '{locked.name}' is already being moved by "
                f"{active.holder if active else locked.held_by}; wait for it to end, or abort it"
            )
        now = timezone.now()
        release = Release.objects.create(
            tenant=locked.tenant,
            alias=locked,
            candidate=candidate,
            baseline=locked.version,
            plan=chosen.model_dump(mode="json"),
            state=S.PREWARMING,
            step_started_at=now,
            created_by=principal.user,
            created_by_key=principal.api_key,
        )
        aliases.hold(locked, release.holder)
        _enter(release, chosen, machine.next_phase(chosen, None), 0)
        release.save()
        timeline.event(
            release, "start", before="", actor=principal.label, note=f"plan: {release.plan}"
        )
        timeline.audit(
            release,
            "start",
            actor=principal,
            after={
                "candidate": candidate.label,
                "baseline": release.baseline.label,
                "plan": release.plan,
            },
        )
        queue_judgement(release.pk)
    return release


def _enter(release: Release, plan: Plan, state: str, step: int) -> None:
    """Make the release and its alias match ``state``/``step`` (idempotent: entering twice
    changes nothing)."""
    release.state, release.step = state, step
    release.step_started_at = timezone.now()
    release.consecutive_failures = 0
    if state == S.EVALUATING and not release.evidence.get("runs"):
        release.evidence = {**release.evidence, "runs": _start_evaluations(release, plan)}
    reasons: dict[str, str] = {
        S.SHADOWING: f"shadow {plan.shadow_percent} %",
        S.CANARY: f"step {step + 1} of {len(plan.canary_steps)}",
    }
    moves = machine.alias_target(state, step, plan)
    if moves:
        timeline.move_alias(release, moves, reason=reasons.get(state, state))


def _start_evaluations(release: Release, plan: Plan) -> list[int]:
    runs = []
    for name in plan.evaluation_sets:
        revision = (
            EvaluationSet.objects.get(adapter=release.alias.adapter, name=name)
            .revisions.order_by("-revision")
            .first()
        )
        if revision is None:
            raise PlanError({"evaluation_sets": f"set '{name}' has no revision"})
        run = evaluations.start_run(
            principal=timeline.acting(release),
            candidate=release.candidate,
            set_revision=revision,
            baseline=release.baseline,
        )
        runs.append(run.pk)
    return runs


# --- judging ---------------------------------------------------------------------------------


def queue_judgement(release_id: int) -> None:
    """Ask a worker to judge once this transaction commits (a start, a resume), rather than
    at the next beat; if the broker is down, the beat's next round judges it."""
    enqueue_on_commit(JUDGE_TASK, release_id)


def due(now: datetime | None = None) -> list[int]:
    """Active, unpaused releases whose interval has passed since their last judgement."""
    now = now or timezone.now()
    found = []
    for release in Release.objects.filter(state__in=machine.PHASES).only(
        "pk", "plan", "last_judged_at"
    ):
        interval = int(release.plan.get("interval_s", 30))
        if release.last_judged_at is None or (now - release.last_judged_at).total_seconds() >= (
            interval - 0.05
        ):
            found.append(release.pk)
    return found


JUDGED_POINTS = 2000  # per release: the chart of the gate's values keeps the newest


def _keep_judged(release: Release, now, values: list[dict]) -> None:
    """The canary error gate's value at each judgement: the release chart plots exactly this
    (the server-failure rate of the step so far, apps/telemetry/outcomes.py)."""
    gate = next((g for g in values if g["gate"] == "canary error rate"), None)
    if gate is None or gate["value"] is None:
        return
    judged = list(release.evidence.get("judged", []))[-(JUDGED_POINTS - 1) :]
    judged.append(
        {
            "t": now.isoformat(),
            "step": release.step,
            "value": gate["value"],
            "max": gate["threshold"],
        }
    )
    release.evidence = {**release.evidence, "judged": judged}


def judge(release_id: int) -> str:
    """One judgement: what it concluded (``busy`` when another judge holds the release)."""
    started = time.time()
    after: list[Callable[[], None]] = []
    with transaction.atomic():
        release = Release.objects.select_for_update(skip_locked=True).filter(pk=release_id).first()
        if release is None:
            return "busy"
        if release.state not in machine.PHASES:
            return release.state
        plan = Plan.model_validate(release.plan)
        now = timezone.now()
        found, verdict = gates.CHECKS[release.state](release, plan, now)
        values = [g.as_dict() for g in found]
        _keep_judged(release, now, values)
        release.last_judged_at = now
        release.last_check = {
            "at": now.isoformat(),
            "outcome": verdict,
            "gates": values,
            "state": release.state,
            "step": release.step,
        }
        move = machine.after_judgement(
            release.state, release.step, release.consecutive_failures, verdict, plan
        )
        release.consecutive_failures = move.failures
        failed = [g for g in found if g.verdict == gates.FAIL]
        note = "; ".join(f"{g.gate} {g.value} (needs {g.op} {g.threshold})" for g in failed)
        if move.event == "rollback":
            reason = (
                f"{failed[0].gate if failed else 'a gate'} failed "
                f"{move.failures} checks in a row: {note}"
            )
            after.append(
                _roll_back(
                    release,
                    state=S.ROLLED_BACK,
                    reason=reason,
                    values=values,
                    actor=None,
                    started=started,
                )
            )
        elif move.event == "check":
            timeline.event(
                release,
                "check",
                before=release.state,
                actor="judge",
                gates=values,
                note=f"failed check {move.failures} of {plan.failure_threshold}: {note}",
            )
        elif move.event == "promote":
            _promote(release, values=values, actor=None)
        elif move.event == "advance":
            _advance(release, plan, move, values)
        release.save()
    for action in after:
        action()
    return verdict


def _advance(release: Release, plan: Plan, move: machine.Transition, values: list[dict]) -> None:
    before = release.state
    _enter(release, plan, move.state, move.step)
    where = (
        f"canary step {release.step + 1} of {len(plan.canary_steps)} "
        f"({plan.canary_steps[release.step].percent} %)"
        if release.state == S.CANARY
        else release.state
    )
    timeline.event(
        release, "advance", before=before, actor="judge", gates=values, note=f"→ {where}"
    )
    timeline.audit(
        release, "advance", actor=None, after={"from": before, "to": where, "gates": values}
    )


def _promote(release: Release, *, values: list[dict], actor: Principal | None) -> None:
    before = release.state
    plan = Plan.model_validate(release.plan)
    timeline.move_alias(
        release, machine.alias_target(S.PROMOTED, release.step, plan), reason="promoted"
    )
    timeline.release_hold(release)
    release.state, release.finished_at = S.PROMOTED, timezone.now()
    release.outcome = "promoted" + (f" now by {actor.label}" if actor else " by the judge")
    timeline.event(
        release,
        "promote",
        before=before,
        actor=actor.label if actor else "judge",
        gates=values,
        note=release.outcome,
    )
    timeline.audit(
        release, "promote", actor=actor, after={"version": release.candidate.label, "gates": values}
    )


def _roll_back(
    release: Release,
    *,
    state: str,
    reason: str,
    values: list[dict],
    actor: Principal | None,
    started: float,
) -> Callable[[], None]:
    """The alias back to the baseline alone (canary and shadow cleared), the hold released;
    returns the cool-down, to run once this is committed (the nodes must see the move)."""
    before = release.state
    plan = Plan.model_validate(release.plan)
    timeline.move_alias(release, machine.alias_target(state, release.step, plan), reason=reason)
    timeline.release_hold(release)
    release.state, release.finished_at, release.outcome = state, timezone.now(), reason
    kind = "abort" if state == S.ABORTED else "rollback"
    timeline.event(
        release,
        kind,
        before=before,
        actor=actor.label if actor else "judge",
        gates=values,
        note=reason,
    )
    timeline.audit(
        release,
        kind,
        actor=actor,
        after={"reason": reason, "gates": values, "baseline": release.baseline.label},
    )
    release_id, actor_label = release.pk, actor.label if actor else "judge"
    return lambda: nodes.cool_down(release_id, started=started, actor=actor_label)


# --- controls ---------------------------------------------------------------------------------


def _locked(release: Release) -> Release:
    return Release.objects.select_for_update().get(pk=release.pk)


def pause(*, principal: Principal, release: Release) -> Release:
    may_control(principal, release)
    with transaction.atomic():
        release = _locked(release)
        if release.state not in machine.PHASES:
            raise Conflict(f"{release.holder} is {release.state}; only a running release pauses")
        before = release.state
        release.paused_from, release.state = release.state, S.PAUSED
        release.save()
        timeline.event(
            release,
            "pause",
            before=before,
            actor=principal.label,
            note="the split holds; no judgement moves it until resumed",
        )
        timeline.audit(release, "pause", actor=principal, after={"from": before})
    return release


def resume(*, principal: Principal, release: Release) -> Release:
    may_control(principal, release)
    with transaction.atomic():
        release = _locked(release)
        if release.state != S.PAUSED:
            raise Conflict(f"{release.holder} is {release.state}, not paused")
        release.state, release.paused_from = release.paused_from, ""
        # the step's window starts again: evidence from before the pause is not judged
        release.step_started_at = timezone.now()
        release.consecutive_failures = 0
        release.save()
        timeline.event(
            release,
            "resume",
            before=S.PAUSED,
            actor=principal.label,
            note="the step's evidence window starts again",
        )
        timeline.audit(release, "resume", actor=principal, after={"to": release.state})
        queue_judgement(release.pk)
    return release


def promote_now(*, principal: Principal, release: Release) -> Release:
    may_control(principal, release)
    principal.require_second_factor("promoting a release")
    with transaction.atomic():
        release = _locked(release)
        if not release.is_active:
            raise Conflict(f"{release.holder} is {release.state}; it cannot be promoted")
        _promote(release, values=[], actor=principal)
        release.save()
    return release


def abort(*, principal: Principal, release: Release, reason: str = "") -> Release:
    """Roll back by hand: the alias to the baseline alone; the worker then cools the candidate
    (``tasks.cool_release``), so the person pressing the button does not wait for the nodes."""
    may_control(principal, release)
    principal.require_second_factor("aborting a release")
    started = time.time()
    with transaction.atomic():
        release = _locked(release)
        if not release.is_active:
            raise Conflict(f"{release.holder} is {release.state}; there is nothing to abort")
        _roll_back(
            release,
            state=S.ABORTED,
            reason=f"aborted by {principal.label}" + (f": {reason}" if reason else ""),
            values=[],
            actor=principal,
            started=started,
        )
        release.save()
        enqueue_on_commit(COOL_TASK, release.pk, started, principal.label)
    return release
