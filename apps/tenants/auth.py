"""Who is calling: an API key (acts for one tenant) or a console session (a user with roles).

Both become a ``Principal``; API handlers read ``request.auth`` and never look at sessions or
headers themselves. Every tenant-owned query goes through ``Principal.tenant_ids`` or
``Principal.tenant_for``.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import User
from django.http import HttpRequest
from ninja.security import HttpBearer
from ninja.security import SessionAuth as NinjaSessionAuth

from apps.tenants import services, throttle
from apps.tenants.choices import PlatformRole, TenantRole
from apps.tenants.errors import Forbidden, Invalid, NotFound, Throttled
from apps.tenants.models import ApiKey, Membership, Tenant


@dataclass(frozen=True)
class Principal:
    user: User | None
    api_key: ApiKey | None
    tenant_ids: frozenset[int]
    admin_tenant_ids: frozenset[int]
    roles: frozenset[str]

    @property
    def is_reviewer(self) -> bool:
        return PlatformRole.REVIEWER in self.roles

    @property
    def is_operator(self) -> bool:
        return PlatformRole.OPERATOR in self.roles

    @property
    def label(self) -> str:
        if self.api_key is not None:
            return f"key {self.api_key.prefix}"
        return self.user.get_username() if self.user else "anonymous"

    def tenant_for(self, slug: str | None = None) -> Tenant:
        """The tenant this call acts for: the key's tenant, or the user's (named if several)."""
        if slug:
            tenant = Tenant.objects.filter(slug=slug, id__in=self.tenant_ids).first()
            if tenant is None:
                raise NotFound(f"no tenant '{slug}' that you belong to")
            return tenant
        if len(self.tenant_ids) == 1:
            return Tenant.objects.get(id=next(iter(self.tenant_ids)))
        if not self.tenant_ids:
            raise Forbidden("you are not a member of any tenant; ask a tenant admin to add you")
        raise Invalid("you belong to several tenants: name one with ?tenant=<slug>")

    def require_tenant_admin(self, tenant: Tenant) -> None:
        if tenant.id not in self.admin_tenant_ids and not self.is_operator:
            raise Forbidden(f"only an admin of tenant '{tenant.slug}' or an operator may do this")

    def require_operator(self) -> None:
        if not self.is_operator:
            raise Forbidden("only an operator may do this")

    def require_reviewer(self) -> None:
        if not self.is_reviewer:
            raise Forbidden("only a reviewer may do this")


def principal_for_user(user: User) -> Principal:
    memberships = list(Membership.objects.filter(user=user).values_list("tenant_id", "role"))
    return Principal(
        user=user,
        api_key=None,
        tenant_ids=frozenset(t for t, _ in memberships),
        admin_tenant_ids=frozenset(t for t, role in memberships if role == TenantRole.ADMIN),
        roles=frozenset(services.platform_roles(user)),
    )


def principal_for_key(key: ApiKey) -> Principal:
    # A key acts for its tenant as a member, or as an admin when it was issued as an admin key
    # (by a person who administers the tenant; see ApiKey.admin).
    return Principal(
        user=None,
        api_key=key,
        tenant_ids=frozenset({key.tenant_id}),
        admin_tenant_ids=frozenset({key.tenant_id}) if key.admin else frozenset(),
        roles=frozenset(),
    )


class ApiKeyAuth(HttpBearer):
    """``Authorization: Bearer lh_...`` → the key's tenant. An address that sent too many bad
    keys gets 429 for any key until its window has room (``apps/tenants/throttle.py``)."""

    def authenticate(self, request: HttpRequest, token: str) -> Principal | None:
        client = request.META.get("REMOTE_ADDR", "")
        wait_s = throttle.bad_keys().wait_s(client)
        if wait_s:
            raise Throttled(throttle.message(wait_s), retry_after=wait_s)
        key = services.authenticate_api_key(token)
        if key is None:
            throttle.bad_keys().failed(client)
            return None
        return principal_for_key(key)


class SessionAuth(NinjaSessionAuth):
    """The console's session (CSRF-checked for unsafe methods by django-ninja)."""

    def authenticate(self, request: HttpRequest, key: str | None) -> Principal | None:
        user = super().authenticate(request, key)
        return principal_for_user(user) if user else None


API_AUTH = [ApiKeyAuth(), SessionAuth()]
