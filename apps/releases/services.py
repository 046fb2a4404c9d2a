"""Releases: start one, judge it, move it on, roll it back, and the controls people press.

Every alias move goes through the registry's alias services with the release as the alias's
holder (``Alias.held_by``), so nodes follow each step as they follow any move, and a move by
hand meanwhile is refused with the release's name. Every transition is an audit event with
the gate values that decided it, and an entry of the release's timeline.

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
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.evaluations import services as evaluations
from apps.evaluations.models import EvaluationSet
from apps.registry import aliases
from apps.registry.models import AdapterVersion, Alias
from apps.releases import gates, nodes
from apps.releases.models import Release, ReleaseDefaults, ReleaseEvent
from apps.releases.plan import Plan, PlanError, build
from apps.tenants import services as tenant_services
from apps.tenants import webhooks
from apps.tenants.auth import Principal
from apps.tenants.errors import Conflict, Forbidden, Invalid, NotFound
from apps.tenants.models import Tenant

logger = logging.getLogger(__name__)
S = Release.State


# --- who acts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReleasePrincipal(Principal):
    """The release moving its alias, on behalf of whoever started it."""

    release_label: str = ""

    @property
    def label(self) -> str:
        return self.release_label


def _principal(release: Release) -> Principal:
    return ReleasePrincipal(
        user=release.created_by,
        api_key=release.created_by_key,
        tenant_ids=frozenset({release.tenant_id}),
        admin_tenant_ids=frozenset({release.tenant_id}),
        roles=frozenset(),
        release_label=release.holder,
    )


def _moves(release: Release) -> dict[str, Any]:
    """The arguments every alias move of the release shares: who, where, and its hold."""
    return {
        "principal": _principal(release),
        "tenant": release.tenant,
        "name": release.alias.name,
        "holder": release.holder,
    }


def may_control(principal: Principal, release: Release) -> None:
    """Tenant admins (people or admin keys) for their aliases, operators for all."""
    if release.tenant_id not in principal.tenant_ids and not principal.is_operator:
        raise NotFound(f"no release {release.pk} that you can see")
    if release.tenant_id not in principal.admin_tenant_ids and not principal.is_operator:
        raise Forbidden(
            f"only an admin of tenant '{release.tenant.slug}' or an operator may control releases"
        )


def _audit(release: Release, action: str, *, actor: Principal | None, after: dict) -> None:
    tenant_services.record_event(
        action=f"release.{action}",
        obj=release,
        actor=actor.user if actor else None,
        actor_key=actor.api_key if actor else None,
        tenant=release.tenant,
        after={"release": release.pk, "alias": release.alias.name, **after},
    )


# release events that the tenant's webhooks hear (apps/tenants/webhooks.py)
NOTIFIED = {
    "start": "release.started",
    "advance": "release.step",
    "promote": "release.promoted",
    "rollback": "release.rolled_back",
    "abort": "release.aborted",
}


def _event(release: Release, kind: str, *, before: str, actor: str, **fields: Any) -> ReleaseEvent:
    event = ReleaseEvent.objects.create(
        release=release,
        kind=kind,
        from_state=before,
        to_state=release.state,
        step=release.step,
        actor=actor,
        **fields,
    )
    if kind in NOTIFIED:
        gates = fields.get("gates") or []
        failed = [g for g in gates if g.get("verdict") == "fail"]
        webhooks.notify(
            NOTIFIED[kind],
            tenant=release.tenant,
            data={
                "release": release.pk,
                "alias": release.alias.name,
                "baseline": release.baseline.label,
                "candidate": release.candidate.label,
                "version": release.candidate.label,
                "state": release.state,
                "step": release.step + 1,
                "steps": len(release.plan.get("canary_steps") or []),
                "actor": actor,
                "reason": fields.get("note", "") if kind in ("rollback", "abort") else "",
                # the failing gate, its value and what it needed (a rollback's cause)
                "failed_gates": [
                    {k: g.get(k) for k in ("gate", "value", "op", "threshold", "detail")}
                    for g in failed
                ],
            },
        )
    return event


# --- the plan -------------------------------------------------------------------------------


def tenant_defaults(tenant: Tenant) -> dict[str, Any]:
    row = ReleaseDefaults.objects.filter(tenant=tenant).first()
    return dict(row.plan) if row else {}


def effective_plan(tenant: Tenant, overrides: dict[str, Any] | None = None) -> Plan:
    return build(tenant_defaults(tenant), overrides)


@transaction.atomic
def set_tenant_defaults(
    *, principal: Principal, tenant: Tenant, plan: dict[str, Any]
) -> dict[str, Any]:
    if tenant.id not in principal.admin_tenant_ids and not principal.is_operator:
        raise Forbidden(f"only an admin of tenant '{tenant.slug}' or an operator may do this")
    build(plan)  # refuse what could not run, field by field
    row, _ = ReleaseDefaults.objects.get_or_create(tenant=tenant)
    before, row.plan = row.plan, plan
    row.save()
    tenant_services.record_event(
        action="release.defaults",
        obj=row,
        actor=principal.user,
        actor_key=principal.api_key,
        tenant=tenant,
        before=before,
        after=plan,
    )
    return row.plan


# --- start, and each step's entry -------------------------------------------------------------


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
    chosen = effective_plan(alias.tenant, plan)
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
        first = _next_phase(chosen, None)
        release.state = first
        _enter(release, chosen, first, 0)
        release.save()
        _event(release, "start", before="", actor=principal.label, note=f"plan: {release.plan}")
        _audit(
            release,
            "start",
            actor=principal,
            after={
                "candidate": candidate.label,
                "baseline": release.baseline.label,
                "plan": release.plan,
            },
        )
        transaction.on_commit(lambda: queue_judgement(release.pk))
    return release


PHASE_ORDER = (S.PREWARMING, S.EVALUATING, S.SHADOWING, S.CANARY)


def _runs(plan: Plan, phase: str) -> bool:
    runs: dict[str, bool] = {
        S.PREWARMING: plan.prewarm,
        S.EVALUATING: bool(plan.evaluation_sets),
        S.SHADOWING: plan.shadow_percent > 0,
        S.CANARY: True,
    }
    return runs[phase]


def _next_phase(plan: Plan, current: str | None) -> str:
    start = 0 if current is None else PHASE_ORDER.index(current) + 1
    return next(phase for phase in PHASE_ORDER[start:] if _runs(plan, phase))


def _enter(release: Release, plan: Plan, phase: str, step: int) -> None:
    """Make the alias match ``phase``/``step`` (idempotent: entering twice changes nothing)."""
    release.state, release.step = phase, step
    release.step_started_at = timezone.now()
    release.consecutive_failures = 0
    alias, acting = release.alias, _principal(release)
    moves: dict[str, Any] = {
        "principal": acting,
        "tenant": release.tenant,
        "name": alias.name,
        "holder": release.holder,
    }
    if phase == S.EVALUATING and not release.evidence.get("runs"):
        runs = []
        for name in plan.evaluation_sets:
            revision = (
                EvaluationSet.objects.get(adapter=alias.adapter, name=name)
                .revisions.order_by("-revision")
                .first()
            )
            if revision is None:
                raise PlanError({"evaluation_sets": f"set '{name}' has no revision"})
            run = evaluations.start_run(
                principal=acting,
                candidate=release.candidate,
                set_revision=revision,
                baseline=release.baseline,
            )
            runs.append(run.pk)
        release.evidence = {**release.evidence, "runs": runs}
    elif phase == S.SHADOWING:
        alias.refresh_from_db()
        if alias.shadow_version_id != release.candidate_id:
            aliases.set_shadow(
                **moves,
                version_id=release.candidate_id,
                percent=plan.shadow_percent,
                reason=f"{release.holder}: shadow {plan.shadow_percent} %",
            )
    elif phase == S.CANARY:
        percent = plan.canary_steps[step].percent
        alias.refresh_from_db()
        if alias.shadow_version_id is not None:
            aliases.set_shadow(**moves, version_id=None, reason=f"{release.holder}: shadow done")
        if alias.canary_version_id != release.candidate_id or alias.canary_percent != percent:
            aliases.set_canary(
                **moves,
                version_id=release.candidate_id,
                percent=percent,
                reason=f"{release.holder}: step {step + 1} of {len(plan.canary_steps)}",
            )


# --- judging ---------------------------------------------------------------------------------


def queue_judgement(release_id: int) -> None:
    """Ask a worker to judge now (the start, a resume), rather than at the next beat."""
    from lorahub.celery import app

    try:
        app.send_task("apps.releases.tasks.judge_release", args=(release_id,), ignore_result=True)
    except Exception:  # the broker is down: the beat's next round judges it
        logger.warning("could not queue a judgement of release %s; the beat will", release_id)


def due(now: datetime | None = None) -> list[int]:
    """Active, unpaused releases whose interval has passed since their last judgement."""
    now = now or timezone.now()
    found = []
    for release in Release.objects.filter(state__in=PHASE_ORDER).only(
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
        if release.state not in PHASE_ORDER:
            return release.state
        plan = Plan.model_validate(release.plan)
        now = timezone.now()
        found, outcome = gates.CHECKS[release.state](release, plan, now)
        values = [g.as_dict() for g in found]
        _keep_judged(release, now, values)
        release.last_judged_at = now
        release.last_check = {
            "at": now.isoformat(),
            "outcome": outcome,
            "gates": values,
            "state": release.state,
            "step": release.step,
        }
        if outcome == gates.FAIL:
            release.consecutive_failures += 1
            failed = [g for g in found if g.verdict == gates.FAIL]
            note = "; ".join(f"{g.gate} {g.value} (needs {g.op} {g.threshold})" for g in failed)
            if release.consecutive_failures >= plan.failure_threshold:
                after.append(
                    _roll_back(
                        release,
                        state=S.ROLLED_BACK,
                        reason=f"{failed[0].gate if failed else 'a gate'} failed "
                        f"{release.consecutive_failures} checks in a row: {note}",
                        values=values,
                        actor=None,
                        started=started,
                    )
                )
            else:
                _event(
                    release,
                    "check",
                    before=release.state,
                    actor="judge",
                    gates=values,
                    note=f"failed check {release.consecutive_failures} of "
                    f"{plan.failure_threshold}: {note}",
                )
        elif outcome in (gates.ADVANCE, gates.HOLD):
            release.consecutive_failures = 0
            if outcome == gates.ADVANCE:
                _advance(release, plan, values)
        release.save()
    for action in after:
        action()
    return outcome


def _advance(release: Release, plan: Plan, values: list[dict]) -> None:
    before, step = release.state, release.step
    if release.state == S.CANARY and step + 1 < len(plan.canary_steps):
        _enter(release, plan, S.CANARY, step + 1)
    elif release.state == S.CANARY:
        _promote(release, values=values, actor=None)
        return
    else:
        _enter(release, plan, _next_phase(plan, release.state), 0)
    where = (
        f"canary step {release.step + 1} of {len(plan.canary_steps)} "
        f"({plan.canary_steps[release.step].percent} %)"
        if release.state == S.CANARY
        else release.state
    )
    _event(release, "advance", before=before, actor="judge", gates=values, note=f"→ {where}")
    _audit(release, "advance", actor=None, after={"from": before, "to": where, "gates": values})


def _promote(release: Release, *, values: list[dict], actor: Principal | None) -> None:
    before = release.state
    alias = Alias.objects.select_for_update().get(pk=release.alias_id)
    moves = _moves(release)
    if alias.shadow_version_id is not None:
        aliases.set_shadow(**moves, version_id=None, reason=f"{release.holder}: promoted")
    if alias.canary_version_id == release.candidate_id:
        aliases.promote_alias(**moves, reason=f"{release.holder}: promoted")
    elif alias.version_id != release.candidate_id:
        aliases.set_alias(
            **moves, version_id=release.candidate_id, reason=f"{release.holder}: promoted"
        )
    alias.refresh_from_db()
    aliases.hold(alias, "")
    release.state, release.finished_at = S.PROMOTED, timezone.now()
    release.outcome = "promoted" + (f" now by {actor.label}" if actor else " by the judge")
    _event(
        release,
        "promote",
        before=before,
        actor=actor.label if actor else "judge",
        gates=values,
        note=release.outcome,
    )
    _audit(
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
    alias = Alias.objects.select_for_update().get(pk=release.alias_id)
    moves = _moves(release)
    why = f"{release.holder}: {reason}"
    if alias.canary_version_id is not None:
        aliases.set_canary(**moves, version_id=None, reason=why)
    if alias.shadow_version_id is not None:
        aliases.set_shadow(**moves, version_id=None, reason=why)
    if alias.version_id != release.baseline_id:
        aliases.set_alias(**moves, version_id=release.baseline_id, reason=why)
    alias.refresh_from_db()
    aliases.hold(alias, "")
    release.state, release.finished_at, release.outcome = state, timezone.now(), reason
    kind = "abort" if state == S.ABORTED else "rollback"
    _event(
        release,
        kind,
        before=before,
        actor=actor.label if actor else "judge",
        gates=values,
        note=reason,
    )
    _audit(
        release,
        kind,
        actor=actor,
        after={"reason": reason, "gates": values, "baseline": release.baseline.label},
    )
    release_id, actor_label = release.pk, actor.label if actor else "judge"
    return lambda: cool_down(release_id, started=started, actor=actor_label)


def cool_down(release_id: int, *, started: float, actor: str) -> None:
    """After a rollback is committed: wait for every node to serve the baseline alone, then
    take the candidate out of every node's engine (kept on disk); recorded with how long the
    nodes took from ``started`` (``time.time()`` of the judgement or the abort)."""
    fresh = Release.objects.select_related("alias__tenant", "candidate", "baseline").get(
        pk=release_id
    )
    followed = nodes.serving_only(fresh.alias, fresh.baseline)
    to_baseline = time.time() - started
    cooled = nodes.cool(fresh.candidate)
    timings = {
        "judgement_to_last_node_baseline_only_ms": round(to_baseline * 1000, 1)
        if followed and None not in followed.values()
        else None,
        "nodes_baseline_only_s": followed,
        "cooled": cooled,
    }
    ReleaseEvent.objects.create(
        release=fresh,
        kind="cooled",
        from_state=fresh.state,
        to_state=fresh.state,
        step=fresh.step,
        actor=actor,
        note=f"{fresh.candidate.label} left the engine of every node (kept on disk)",
        timings=timings,
    )
    logger.info("release %s rolled back; %s", release_id, timings)


# --- controls ---------------------------------------------------------------------------------


def _locked(release: Release) -> Release:
    return Release.objects.select_for_update().get(pk=release.pk)


def pause(*, principal: Principal, release: Release) -> Release:
    may_control(principal, release)
    with transaction.atomic():
        release = _locked(release)
        if release.state not in PHASE_ORDER:
            raise Conflict(f"{release.holder} is {release.state}; only a running release pauses")
        before = release.state
        release.paused_from, release.state = release.state, S.PAUSED
        release.save()
        _event(
            release,
            "pause",
            before=before,
            actor=principal.label,
            note="the split holds; no judgement moves it until resumed",
        )
        _audit(release, "pause", actor=principal, after={"from": before})
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
        _event(
            release,
            "resume",
            before=S.PAUSED,
            actor=principal.label,
            note="the step's evidence window starts again",
        )
        _audit(release, "resume", actor=principal, after={"to": release.state})
        transaction.on_commit(lambda: queue_judgement(release.pk))
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
        release_id, label = release.pk, principal.label
        transaction.on_commit(lambda: _queue_cool_down(release_id, started, label))
    return release


def _queue_cool_down(release_id: int, started: float, actor: str) -> None:
    from lorahub.celery import app

    try:
        app.send_task(
            "apps.releases.tasks.cool_release",
            args=(release_id, started, actor),
            ignore_result=True,
        )
    except Exception:  # the nodes still take an unused version out of the engine themselves
        logger.warning("could not queue the cool-down of release %s", release_id)
