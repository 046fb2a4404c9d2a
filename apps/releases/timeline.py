"""What a release leaves behind as it moves: the alias moves it makes (as its holder), its
timeline entries, the audit log, and the tenant's webhooks.

Every alias move goes through the registry's alias services with the release as the alias's
holder (``Alias.held_by``), so nodes follow each step as they follow any move, and a move by
hand meanwhile is refused with the release's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apps.registry import aliases
from apps.registry.models import Alias
from apps.releases.machine import AliasMove
from apps.releases.models import Release, ReleaseEvent
from apps.tenants import services as tenant_services
from apps.tenants import webhooks
from apps.tenants.auth import Principal


@dataclass(frozen=True)
class ReleasePrincipal(Principal):
    """The release moving its alias, on behalf of whoever started it."""

    release_label: str = ""

    @property
    def label(self) -> str:
        return self.release_label


def acting(release: Release) -> Principal:
    return ReleasePrincipal(
        user=release.created_by,
        api_key=release.created_by_key,
        tenant_ids=frozenset({release.tenant_id}),
        admin_tenant_ids=frozenset({release.tenant_id}),
        roles=frozenset(),
        release_label=release.holder,
    )


def _alias_args(release: Release) -> dict[str, Any]:
    """The arguments every alias move of the release shares: who, where, and its hold."""
    return {
        "principal": acting(release),
        "tenant": release.tenant,
        "name": release.alias.name,
        "holder": release.holder,
    }


def audit(release: Release, action: str, *, actor: Principal | None, after: dict) -> None:
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


def event(release: Release, kind: str, *, before: str, actor: str, **fields: Any) -> ReleaseEvent:
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


def move_alias(release: Release, moves: tuple[AliasMove, ...], *, reason: str) -> None:
    """Make the alias match ``moves`` (``machine.alias_target``), under its row lock; a part
    that already matches is left alone, so entering a state twice changes nothing."""
    alias = Alias.objects.select_for_update().get(pk=release.alias_id)
    args = {**_alias_args(release), "reason": f"{release.holder}: {reason}"}
    versions = {"candidate": release.candidate_id, "baseline": release.baseline_id, "none": None}
    for move in moves:
        target = versions[move.to]
        if move.part == "shadow" and alias.shadow_version_id != target:
            aliases.set_shadow(**args, version_id=target, percent=move.percent)
        elif move.part == "canary" and (
            alias.canary_version_id != target
            or (target is not None and alias.canary_percent != move.percent)
        ):
            aliases.set_canary(**args, version_id=target, percent=move.percent)
        elif move.part == "promote" and alias.canary_version_id == target:
            aliases.promote_alias(**args)
        elif move.part in ("promote", "stable") and target and alias.version_id != target:
            aliases.set_alias(**args, version_id=target)
        alias.refresh_from_db()


def release_hold(release: Release) -> None:
    """The release is over: the alias may be moved by hand again."""
    aliases.hold(Alias.objects.select_for_update().get(pk=release.alias_id), "")
