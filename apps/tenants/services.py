"""Tenant workflows. Every write to tenants' models goes through here."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group
from django.db import transaction

from apps.tenants.choices import PlatformRole, Priority, TenantRole
from apps.tenants.models import Membership, Tenant


@transaction.atomic
def create_tenant(*, slug: str, name: str, priority: int = Priority.STANDARD) -> Tenant:
    tenant = Tenant(slug=slug, name=name, priority=priority)
    tenant.full_clean()
    tenant.save()
    return tenant


@transaction.atomic
def add_member(
    *, tenant: Tenant, user: AbstractBaseUser, role: str = TenantRole.MEMBER
) -> Membership:
    membership, _ = Membership.objects.update_or_create(
        user=user, tenant=tenant, defaults={"role": role}
    )
    return membership


@transaction.atomic
def grant_platform_role(*, user: AbstractBaseUser, role: PlatformRole) -> None:
    group, _ = Group.objects.get_or_create(name=role.value)
    user.groups.add(group)


def platform_roles(user: AbstractBaseUser) -> list[str]:
    if not user.is_authenticated:
        return []
    return sorted(user.groups.filter(name__in=PlatformRole.values).values_list("name", flat=True))


@transaction.atomic
def ensure_user(*, username: str, password: str, email: str = "") -> AbstractBaseUser:
    """Create the user, or reset its password if it exists (used by the demo seed)."""
    User = get_user_model()
    user, _ = User.objects.get_or_create(username=username, defaults={"email": email})
    user.set_password(password)
    user.save()
    return user
