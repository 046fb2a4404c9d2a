"""Alias workflows: point, canary, promote, roll back, and resolve for the serving node.

Every move locks the alias row (``select_for_update``) for its whole transaction, so two
racing moves are applied one after the other, each with its own history entry, never half of
one and half of the other. Targets are always approved, signed versions of the alias's own
adapter on the same base-model revision.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from apps.registry.choices import AliasAction, VersionState
from apps.registry.models import AdapterVersion, Alias, AliasEvent
from apps.tenants import services as tenant_services
from apps.tenants.auth import Principal
from apps.tenants.errors import Conflict, Invalid, NotFound
from apps.tenants.events import publish_change
from apps.tenants.models import ApiKey, Tenant, slug_validator


def _snapshot(alias: Alias) -> dict[str, Any]:
    return {
        "version": alias.version.label,
        "canary_version": alias.canary_version.label if alias.canary_version else None,
        "canary_percent": alias.canary_percent,
        "canary_api_keys": list(alias.canary_api_keys),
        "shadow_version": alias.shadow_version.label if alias.shadow_version else None,
        "shadow_percent": alias.shadow_percent,
        "shadow_keep_examples": alias.shadow_keep_examples,
    }


def _locked_alias_or_none(tenant: Tenant, name: str) -> Alias | None:
    # No joins in the locking query: when a racing move changes version_id, PostgreSQL
    # re-checks a joined row against the old join partner and would return nothing.
    # Related rows are loaded after the lock is held, so they are current.
    return Alias.objects.select_for_update().filter(tenant=tenant, name=name).first()


def _locked_alias(tenant: Tenant, name: str) -> Alias:
    alias = _locked_alias_or_none(tenant, name)
    if alias is None:
        raise NotFound(f"tenant '{tenant.slug}' has no alias '{name}'")
    return alias


def _tenant_version(tenant: Tenant, version_id: int) -> AdapterVersion:
    version = (
        AdapterVersion.objects.select_related("adapter__tenant")
        .filter(pk=version_id, adapter__tenant=tenant)
        .first()
    )
    if version is None:
        raise NotFound(f"tenant '{tenant.slug}' has no adapter version {version_id}")
    return version


def _check_target(alias: Alias | None, version: AdapterVersion) -> None:
    if version.state != VersionState.APPROVED or not version.signature:
        raise Conflict(
            f"version {version.label} is {version.get_state_display().lower()}; only approved, "
            "signed versions can be alias targets"
        )
    if alias is None:
        return
    if version.adapter_id != alias.adapter_id:
        raise Invalid(
            f"alias '{alias.name}' serves adapter '{alias.adapter.adapter_id}'; version "
            f"{version.label} belongs to another adapter"
        )
    if version.base_model_revision != alias.version.base_model_revision:
        raise Invalid(
            f"version {version.label} is for base revision {version.base_model_revision}, but "
            f"alias '{alias.name}' serves revision {alias.version.base_model_revision}"
        )


def hold(alias: Alias, holder: str) -> None:
    """Mark ``alias`` (locked by the caller) as driven by ``holder`` ("" releases it)."""
    alias.held_by = holder
    alias.save(update_fields=["held_by", "updated_at"])


def _record(alias: Alias, action: str, principal: Principal, reason: str, before, **fields):
    AliasEvent.objects.create(
        alias=alias,
        action=action,
        actor=principal.user,
        actor_label=principal.label,
        reason=reason,
        canary_version=alias.canary_version,
        canary_percent=alias.canary_percent,
        **fields,
    )
    publish_change("alias", tenant_id=alias.tenant_id, name=alias.name)
    tenant_services.record_event(
        action=f"alias.{action}",
        obj=alias,
        actor=principal.user,
        actor_key=principal.api_key,
        tenant=alias.tenant,
        before=before,
        after=_snapshot(alias),
        note=reason,
    )


def _authorize(principal: Principal, tenant: Tenant) -> None:
    if tenant.id not in principal.tenant_ids and not principal.is_operator:
        raise NotFound(f"no tenant '{tenant.slug}' that you belong to")


def _check_hold(alias: Alias | None, holder: str) -> None:
    """A held alias (a release drives it) moves only by its holder: a move by hand would
    fight the release's next step, so it is refused, naming the release and what to do."""
    if alias is not None and alias.held_by and alias.held_by != holder:
        raise Conflict(
            f"alias '{alias.name}' is being moved by {alias.held_by}; pause it to hold the "
            f"split, or promote or abort it from its page before moving the alias by hand"
        )


@transaction.atomic
def set_alias(
    *,
    principal: Principal,
    tenant: Tenant,
    name: str,
    version_id: int,
    reason: str = "",
    holder: str = "",
) -> Alias:
    """Point ``name`` at an approved version (creating the alias on first use)."""
    _authorize(principal, tenant)
    version = _tenant_version(tenant, version_id)
    alias = _locked_alias_or_none(tenant, name)
    _check_hold(alias, holder)
    if alias is None:
        try:
            slug_validator(name)
        except Exception:
            raise Invalid(
                f"alias name '{name}' is not valid: use 2-63 lowercase letters, digits and hyphens"
            ) from None
        _check_target(None, version)
        try:
            with transaction.atomic():
                alias = Alias.objects.create(
                    tenant=tenant, name=name, adapter=version.adapter, version=version
                )
        except IntegrityError:
            # Another request created it a moment ago: treat this call as a move of it.
            alias = _locked_alias(tenant, name)
        else:
            _record(alias, AliasAction.SET, principal, reason, None, to_version=version)
            return alias
    _check_target(alias, version)
    if alias.version_id == version.pk:
        return alias
    before, previous = _snapshot(alias), alias.version
    alias.version = version
    if alias.canary_version_id == version.pk:
        _clear_canary_fields(alias)
    _drop_shadow_if_stable(alias)
    alias.save()
    _record(
        alias, AliasAction.SET, principal, reason, before, from_version=previous, to_version=version
    )
    return alias


def _drop_shadow_if_stable(alias: Alias) -> None:
    """A shadow that became the stable version has nothing left to shadow."""
    if alias.shadow_version_id is not None and alias.shadow_version_id == alias.version_id:
        alias.shadow_version, alias.shadow_percent = None, 0
        alias.shadow_keep_examples = False


def _clear_canary_fields(alias: Alias) -> None:
    alias.canary_version = None
    alias.canary_percent = 0
    alias.canary_api_keys = []


@transaction.atomic
def set_canary(
    *,
    principal: Principal,
    tenant: Tenant,
    name: str,
    version_id: int | None,
    percent: int = 0,
    api_keys: list[str] | None = None,
    reason: str = "",
    holder: str = "",
) -> Alias:
    """Send ``percent`` of request keys (and always the listed API keys) to a second version.

    ``version_id=None`` clears the canary.
    """
    _authorize(principal, tenant)
    alias = _locked_alias(tenant, name)
    _check_hold(alias, holder)
    before = _snapshot(alias)
    if version_id is None:
        if alias.canary_version_id is None:
            return alias
        _clear_canary_fields(alias)
        alias.save()
        _record(alias, AliasAction.CLEAR_CANARY, principal, reason, before)
        return alias
    if not 0 <= percent <= 100:
        raise Invalid(f"canary percent must be between 0 and 100, got {percent}")
    version = _tenant_version(tenant, version_id)
    _check_target(alias, version)
    if version.pk == alias.version_id:
        raise Invalid(f"{version.label} is already the stable version of '{name}'")
    prefixes = sorted(set(api_keys or []))
    known = set(
        ApiKey.objects.active()
        .filter(tenant=tenant, prefix__in=prefixes)
        .values_list("prefix", flat=True)
    )
    unknown = [p for p in prefixes if p not in known]
    if unknown:
        raise Invalid(
            f"no active API key of tenant '{tenant.slug}' with prefix {', '.join(unknown)}"
        )
    alias.canary_version = version
    alias.canary_percent = percent
    alias.canary_api_keys = prefixes
    alias.save()
    _record(alias, AliasAction.CANARY, principal, reason, before)
    return alias


@transaction.atomic
def set_shadow(
    *,
    principal: Principal,
    tenant: Tenant,
    name: str,
    version_id: int | None,
    percent: int = 0,
    keep_examples: bool = False,
    reason: str = "",
    holder: str = "",
) -> Alias:
    """Mirror ``percent`` of the alias's requests (stable and canary alike) to a version, off
    the response path: callers get the live answer; the shadow's is only compared. With
    ``keep_examples`` the nodes keep a bounded sample of prompts with both answers for the
    alias page (``SHADOW_EXAMPLES`` per shadow version, for a week); without, none is stored.
    ``version_id=None`` clears the shadow."""
    _authorize(principal, tenant)
    alias = _locked_alias(tenant, name)
    _check_hold(alias, holder)
    before = _snapshot(alias)
    if version_id is None:
        if alias.shadow_version_id is None:
            return alias
        alias.shadow_version, alias.shadow_percent = None, 0
        alias.shadow_keep_examples = False
        alias.save()
        _record(alias, AliasAction.CLEAR_SHADOW, principal, reason, before)
        return alias
    if not 0 < percent <= 100:
        raise Invalid(f"shadow percent must be between 1 and 100, got {percent}")
    version = _tenant_version(tenant, version_id)
    _check_target(alias, version)
    if version.pk == alias.version_id:
        raise Invalid(f"{version.label} is already the stable version of '{name}'")
    alias.shadow_version, alias.shadow_percent = version, percent
    alias.shadow_keep_examples = keep_examples
    alias.save()
    _record(alias, AliasAction.SHADOW, principal, reason, before)
    return alias


@transaction.atomic
def promote_alias(
    *, principal: Principal, tenant: Tenant, name: str, reason: str = "", holder: str = ""
) -> Alias:
    """Make the canary the stable version and clear the canary."""
    _authorize(principal, tenant)
    alias = _locked_alias(tenant, name)
    _check_hold(alias, holder)
    if alias.canary_version is None:
        raise Conflict(f"alias '{name}' has no canary to promote")
    _check_target(alias, alias.canary_version)
    before, previous, promoted = _snapshot(alias), alias.version, alias.canary_version
    alias.version = promoted
    _clear_canary_fields(alias)
    _drop_shadow_if_stable(alias)
    alias.save()
    _record(
        alias,
        AliasAction.PROMOTE,
        principal,
        reason,
        before,
        from_version=previous,
        to_version=promoted,
    )
    return alias


def previous_stable_version(alias: Alias) -> AdapterVersion | None:
    """The version the current stable one replaced, skipping versions left by rollbacks.

    Walks the set/promote history backwards: rolling back v3 → v2 → v1 steps down the
    versions in the order they were put in place, and never bounces back to a version that
    was rolled away from.
    """
    moves = alias.history.filter(action__in=[AliasAction.SET, AliasAction.PROMOTE]).order_by(
        "-at", "-id"
    )
    for event in moves.select_related("from_version"):
        if event.to_version_id == alias.version_id:
            return event.from_version
    return None


@transaction.atomic
def rollback_alias(
    *, principal: Principal, tenant: Tenant, name: str, reason: str = "", holder: str = ""
) -> Alias:
    """One call: point the alias back at the previous stable version and clear the canary."""
    _authorize(principal, tenant)
    alias = _locked_alias(tenant, name)
    _check_hold(alias, holder)
    target = previous_stable_version(alias)
    if target is None:
        raise Conflict(f"alias '{name}' has no earlier version to roll back to")
    if target.state != VersionState.APPROVED or not target.signature:
        raise Conflict(
            f"the previous version {target.label} is {target.get_state_display().lower()}; "
            "point the alias at a version explicitly instead"
        )
    before, rolled_back = _snapshot(alias), alias.version
    alias.version = target
    _clear_canary_fields(alias)
    _drop_shadow_if_stable(alias)
    alias.save()
    _record(
        alias,
        AliasAction.ROLLBACK,
        principal,
        reason,
        before,
        from_version=rolled_back,
        to_version=target,
    )
    return alias


# --- resolution --------------------------------------------------------------------------------
