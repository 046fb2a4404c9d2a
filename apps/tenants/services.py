"""Tenant workflows. Every write to tenants' models goes through here."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group
from django.db import transaction
from django.utils import timezone

from apps.tenants.choices import PlatformRole, Priority, TenantRole
from apps.tenants.errors import Conflict, Forbidden, Invalid, KeyExpired
from apps.tenants.events import publish_change
from apps.tenants.models import ApiKey, AuditEvent, Membership, Quota, Tenant
from apps.tenants.shares import ENGINE_WEIGHT_RANGE

KEY_PREFIX_LEN = 8
LAST_USED_RESOLUTION = timedelta(minutes=1)
QUOTA_FIELDS = (
    "max_hot_adapters",
    "max_warm_adapters",
    "max_hot_memory_mb",
    "max_adapters",
    "max_versions_per_adapter",
    "max_upload_mb",
    "requests_per_minute",
    "engine_weight",
)


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


# --- audit -----------------------------------------------------------------------------------


def record_event(
    *,
    action: str,
    obj: Any,
    actor: AbstractBaseUser | None = None,
    actor_key: ApiKey | None = None,
    tenant: Tenant | None = None,
    before: dict | None = None,
    after: dict | None = None,
    note: str = "",
) -> AuditEvent:
    """Append an audit event. Call inside the transaction of the change it describes."""
    return AuditEvent.objects.create(
        action=action,
        object_type=type(obj).__name__,
        object_id=str(obj.pk),
        actor=actor if actor is not None and actor.is_authenticated else None,
        actor_key=actor_key,
        tenant=tenant,
        before=before,
        after=after,
        note=note,
    )


# --- API keys --------------------------------------------------------------------------------


def _hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


@transaction.atomic
def issue_api_key(
    *,
    tenant: Tenant,
    name: str,
    actor: AbstractBaseUser | None,
    actor_key: ApiKey | None = None,
    admin: bool = False,
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """Create a key and return it with its plaintext, which is never stored or shown again.

    ``admin`` keys act as an admin of the tenant; only a person issues one (``actor_key``, the
    key a request came with, may issue member keys only)."""
    name = name.strip()
    if not name:
        raise Invalid("give the key a name, e.g. the service that will use it")
    if admin and actor_key is not None:
        raise Forbidden(
            "an API key cannot issue an admin key; a tenant admin creates admin keys in the "
            "console (API keys page)"
        )
    if expires_at is not None:
        if timezone.is_naive(expires_at):
            raise Invalid("give the expiry with its time zone, e.g. 2027-01-31T00:00:00Z")
        if expires_at <= timezone.now():
            raise Invalid(
                f"the expiry {expires_at:%Y-%m-%d %H:%M} UTC has passed; give a moment in the "
                "future, or none for a key that lasts until it is revoked"
            )
    if admin:
        # an admin key stands in for a second factor, so it must end, within the operators'
        # maximum (LORAHUB_ADMIN_KEY_MAX_DAYS); none given: the maximum
        longest = timezone.now() + timedelta(days=settings.LORAHUB_ADMIN_KEY_MAX_DAYS)
        if expires_at is None:
            expires_at = longest
        elif expires_at > longest:
            raise Invalid(
                f"an admin key expires within {settings.LORAHUB_ADMIN_KEY_MAX_DAYS} days on this "
                f"platform (at the latest {longest:%Y-%m-%d}); give an earlier expiry"
            )
    unexpired = ApiKey.objects.active().exclude(expires_at__lte=timezone.now())
    if unexpired.filter(tenant=tenant, name=name).exists():
        raise Conflict(f"tenant '{tenant.slug}' already has an active key named '{name}'")
    prefix = secrets.token_hex(KEY_PREFIX_LEN // 2)
    plaintext = f"lh_{prefix}_{secrets.token_urlsafe(32)}"
    key = ApiKey.objects.create(
        tenant=tenant,
        name=name,
        prefix=prefix,
        key_hash=_hash_key(plaintext),
        created_by=actor if actor is not None and actor.is_authenticated else None,
        admin=admin,
        expires_at=expires_at,
    )
    record_event(
        action="api_key.issue",
        obj=key,
        actor=actor,
        actor_key=actor_key,
        tenant=tenant,
        after={
            "name": name,
            "prefix": prefix,
            "admin": admin,
            "expires_at": expires_at.isoformat() if expires_at else None,
        },
    )
    return key, plaintext


@transaction.atomic
def revoke_api_key(
    *, key: ApiKey, actor: AbstractBaseUser | None, actor_key: ApiKey | None = None
) -> ApiKey:
    key = ApiKey.objects.select_for_update().get(pk=key.pk)
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        publish_change("api_key", prefix=key.prefix)
        record_event(
            action="api_key.revoke",
            obj=key,
            actor=actor,
            actor_key=actor_key,
            tenant=key.tenant,
            before={"active": True},
            after={"active": False},
        )
    return key


def authenticate_api_key(plaintext: str, *, address: str | None = None) -> ApiKey | None:
    """The active key matching ``plaintext``, or None. Constant-time hash comparison.

    A key past its expiry raises ``KeyExpired`` (401 ``key_expired``): its owner learns why.
    ``address`` is where the call came from, kept as the key's last address."""
    if not plaintext.isascii() or not plaintext.isprintable():
        return None  # a key is lh_ + letters and digits: anything else is simply wrong
    parts = plaintext.split("_", 2)
    if len(parts) != 3 or parts[0] != "lh" or len(parts[1]) != KEY_PREFIX_LEN:
        return None
    key = ApiKey.objects.active().select_related("tenant").filter(prefix=parts[1]).first()
    if key is None or not hmac.compare_digest(key.key_hash, _hash_key(plaintext)):
        return None
    if key.is_expired:
        raise KeyExpired(
            f"the API key lh_{key.prefix}_… expired at {key.expires_at:%Y-%m-%d %H:%M} UTC; "
            "ask an admin of the tenant for a new key"
        )
    now = timezone.now()
    address = address or None
    stale = key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION
    if stale or (address and address != key.last_used_from):
        ApiKey.objects.filter(pk=key.pk).update(
            last_used_at=now, last_used_from=address or key.last_used_from
        )
        key.last_used_at, key.last_used_from = now, address or key.last_used_from
    return key


# --- quotas ----------------------------------------------------------------------------------


def get_quota(tenant: Tenant) -> Quota:
    quota, _ = Quota.objects.get_or_create(tenant=tenant)
    return quota


@transaction.atomic
def set_quota(*, tenant: Tenant, actor: AbstractBaseUser | None, **limits: int) -> Quota:
    unknown = set(limits) - set(QUOTA_FIELDS)
    if unknown:
        raise Invalid(f"unknown quota field(s): {', '.join(sorted(unknown))}")
    quota, _ = Quota.objects.select_for_update().get_or_create(tenant=tenant)
    before = {f: getattr(quota, f) for f in QUOTA_FIELDS}
    for field, value in limits.items():
        if value is None:
            continue
        if not isinstance(value, int) or value < 0:
            raise Invalid(f"{field} must be a whole number of 0 or more, got {value!r}")
        low, high = ENGINE_WEIGHT_RANGE
        if field == "engine_weight" and not low <= value <= high:
            raise Invalid(
                f"engine_weight must be {low} to {high} (percent of the tier's share of the "
                f"engine; 100 is the tier's own share), got {value}"
            )
        if field == "max_warm_adapters" and value < 1:
            raise Invalid(
                "max_warm_adapters must be at least 1: an adapter answers only while it is "
                "loaded in the engine"
            )
        setattr(quota, field, value)
    quota.save()
    after = {f: getattr(quota, f) for f in QUOTA_FIELDS}
    publish_change("quota", tenant_id=tenant.id)
    record_event(
        action="quota.set", obj=quota, actor=actor, tenant=tenant, before=before, after=after
    )
    return quota


@transaction.atomic
def set_priority(*, tenant: Tenant, priority: int, actor: AbstractBaseUser | None) -> Tenant:
    """Change a tenant's SLA tier (its cache share and load deadline on every node)."""
    if priority not in Priority.values:
        choices = ", ".join(f"{p.value} ({p.label})" for p in Priority)
        raise Invalid(f"priority must be one of {choices}, got {priority!r}")
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    before = tenant.priority
    if before != priority:
        tenant.priority = priority
        tenant.save(update_fields=["priority"])
        publish_change("tenant", tenant_id=tenant.id)
        record_event(
            action="tenant.priority",
            obj=tenant,
            actor=actor,
            tenant=tenant,
            before={"priority": Priority(before).label},
            after={"priority": Priority(priority).label},
        )
    return tenant


def memberships_of(user) -> list[Membership]:
    """The user's memberships, with their tenants, in the order of the tenants' slugs."""
    return list(
        Membership.objects.filter(user=user).select_related("tenant").order_by("tenant__slug")
    )
