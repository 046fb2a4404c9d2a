"""Roles from the identity provider's groups (single sign-on, docs/security.md).

The mapping is group → role, where a role is ``operator``, ``reviewer``, ``admin:<tenant>`` or
``member:<tenant>``:

- ``LORAHUB_OIDC_ROLES="lorahub-operators=operator, acme-admins=admin:acme"``, or
- ``LORAHUB_OIDC_ROLES_FILE=roles.yaml`` holding ``groups: {lorahub-operators: operator,
  acme-admins: [admin:acme], ...}`` (a group may give several roles).

For a user who signs in through the provider, the provider is the truth: at every sign-in the
user's platform roles and tenant memberships become exactly what their groups map to, so a
group removed in the provider takes the role away at the next sign-in. Each change is audited.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml
from django.conf import settings
from django.contrib.auth.models import Group
from django.core.checks import Error, register
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from apps.tenants.choices import PlatformRole, TenantRole
from apps.tenants.models import AuditEvent, Membership, Tenant

TENANT_ROLES = {TenantRole.ADMIN.value, TenantRole.MEMBER.value}


@dataclass(frozen=True)
class Roles:
    platform: frozenset[str] = frozenset()
    tenants: dict[str, str] = field(default_factory=dict)  # slug → admin or member

    def as_dict(self) -> dict:
        return {"platform": sorted(self.platform), "tenants": dict(sorted(self.tenants.items()))}


def parse_role(text: str, where: str) -> tuple[str, str | None]:
    """``operator`` → ("operator", None); ``admin:acme`` → ("admin", "acme")."""
    role, _, tenant = text.strip().partition(":")
    if not tenant and role in PlatformRole.values:
        return role, None
    if tenant and role in TENANT_ROLES:
        return role, tenant.strip()
    raise ImproperlyConfigured(
        f"{where}: {text!r} is not a role; use operator, reviewer, admin:<tenant> or "
        "member:<tenant>"
    )


def parse_mapping(text: str, source: str = "LORAHUB_OIDC_ROLES") -> dict[str, list[str]]:
    """``group=role, group=role`` → {group: [role, ...]}."""
    mapping: dict[str, list[str]] = {}
    for item in text.replace(";", ",").split(","):
        if not item.strip():
            continue
        group, sep, role = item.partition("=")
        if not sep or not group.strip():
            raise ImproperlyConfigured(
                f"{source}: {item.strip()!r} is not group=role, e.g. lorahub-operators=operator"
            )
        parse_role(role, f"{source} ({group.strip()})")
        mapping.setdefault(group.strip(), []).append(role.strip())
    return mapping


def load_file(path: str) -> dict[str, list[str]]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ImproperlyConfigured(f"LORAHUB_OIDC_ROLES_FILE={path}: {exc}") from None
    groups = (data or {}).get("groups") if isinstance(data, dict) else None
    if not isinstance(groups, dict):
        raise ImproperlyConfigured(
            f"LORAHUB_OIDC_ROLES_FILE={path}: expected a 'groups:' mapping of group → role(s)"
        )
    mapping: dict[str, list[str]] = {}
    for group, value in groups.items():
        for role in [value] if isinstance(value, str) else list(value or []):
            parse_role(str(role), f"LORAHUB_OIDC_ROLES_FILE ({group})")
            mapping.setdefault(str(group), []).append(str(role).strip())
    return mapping


@lru_cache(maxsize=4)
def _mapping(text: str, path: str) -> dict[str, list[str]]:
    mapping = load_file(path) if path else {}
    for group, found in parse_mapping(text).items():
        mapping.setdefault(group, []).extend(found)
    return mapping


def mapping() -> dict[str, list[str]]:
    return _mapping(settings.OIDC_ROLES, settings.OIDC_ROLES_FILE)


def roles_for(groups: list[str]) -> Roles:
    """The roles that ``groups`` give; admin wins over member for the same tenant."""
    table = mapping()
    platform: set[str] = set()
    tenants: dict[str, str] = {}
    for group in groups:
        for text in table.get(group, []):
            role, tenant = parse_role(text, group)
            if tenant is None:
                platform.add(role)
            elif tenants.get(tenant) != TenantRole.ADMIN:
                tenants[tenant] = role
    return Roles(frozenset(platform), tenants)


def current(user) -> Roles:
    platform = frozenset(
        user.groups.filter(name__in=PlatformRole.values).values_list("name", flat=True)
    )
    tenants = dict(Membership.objects.filter(user=user).values_list("tenant__slug", "role"))
    return Roles(platform, tenants)


@transaction.atomic
def apply(user, groups: list[str], *, created: bool = False) -> Roles:
    """Make ``user``'s roles exactly what ``groups`` give; audit the change."""
    before = current(user)
    wanted = roles_for(groups)
    known = dict(Tenant.objects.filter(slug__in=wanted.tenants).values_list("slug", "id"))
    missing = sorted(set(wanted.tenants) - set(known))
    wanted = Roles(wanted.platform, {s: r for s, r in wanted.tenants.items() if s in known})
    for role in PlatformRole.values:
        group, _ = Group.objects.get_or_create(name=role)
        if role in wanted.platform:
            user.groups.add(group)
        else:
            user.groups.remove(group)
    Membership.objects.filter(user=user).exclude(tenant__slug__in=list(wanted.tenants)).delete()
    for slug, role in wanted.tenants.items():
        Membership.objects.update_or_create(
            user=user, tenant_id=known[slug], defaults={"role": role}
        )
    if before != wanted or created:
        AuditEvent.objects.create(
            action="user.roles_from_groups",
            object_type="User",
            object_id=str(user.pk),
            actor=None,
            before=None if created else before.as_dict(),
            after={**wanted.as_dict(), "groups": sorted(groups)},
            note=(f"no tenant {', '.join(missing)}: those roles are skipped" if missing else ""),
        )
    return wanted


@register()
def check_mapping(app_configs, **kwargs) -> list[Error]:
    """``manage.py check`` (and every start) names a bad mapping."""
    if not settings.OIDC_ISSUER:
        return []
    try:
        found = mapping()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="lorahub.E101")]
    if not found:
        return [
            Error(
                "LORAHUB_OIDC_ISSUER is set but no group maps to a role: set "
                "LORAHUB_OIDC_ROLES or LORAHUB_OIDC_ROLES_FILE",
                id="lorahub.E102",
            )
        ]
    return []
