"""Who is calling: an API key (acts for one tenant) or a console session (a user with roles).

Both become a ``Principal``; API handlers read ``request.auth`` and never look at sessions or
headers themselves. Every tenant-owned query goes through ``Principal.tenant_ids`` or
``Principal.tenant_for``.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpRequest
from ninja.security import HttpBearer
from ninja.security import SessionAuth as NinjaSessionAuth

from apps.tenants import services, throttle
from apps.tenants.choices import PlatformRole, TenantRole
from apps.tenants.errors import Forbidden, Invalid, NotFound, SecondFactorRequired, Throttled
from apps.tenants.models import ApiKey, Membership, Tenant

# what a console session records at sign-in (apps/tenants/signin.py)
SECOND_FACTOR_SESSION_KEY = "lorahub_second_factor"
METHOD_SESSION_KEY = "lorahub_sign_in"


@dataclass(frozen=True)
class Principal:
    user: User | None
    api_key: ApiKey | None
    tenant_ids: frozenset[int]
    admin_tenant_ids: frozenset[int]
    roles: frozenset[str]
    # how this session passed a second factor ("totp", "recovery code", "provider: amr mfa"),
    # or "" for none; an admin key counts as issued from a session that had one
    second_factor: str = ""
    sign_in_method: str = ""  # "password" or "oidc" for a session; "" for a key

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

    def acting_tenant(self, slug: str | None) -> Tenant:
        """The tenant a call acts on: an operator may name any; others act for their own."""
        if slug and self.is_operator:
            tenant = Tenant.objects.filter(slug=slug).first()
            if tenant is None:
                raise NotFound(f"no tenant '{slug}' that you belong to")
            return tenant
        return self.tenant_for(slug)

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

    def require_second_factor(self, action: str) -> None:
        """Refuse ``action`` (e.g. "approving a version") when the platform requires a second
        factor (``LORAHUB_REQUIRE_SECOND_FACTOR``) and this session has not passed one."""
        if not settings.REQUIRE_SECOND_FACTOR or self.second_factor:
            return
        if self.api_key is not None:
            raise SecondFactorRequired(
                f"{action} needs a second factor: a member key cannot do it; use an admin key "
                "(issued from a session with a second factor) or the console"
            )
        if self.sign_in_method == "oidc":
            raise SecondFactorRequired(
                f"{action} needs a second factor, and your sign-in through "
                f"{settings.OIDC_NAME} did not report one (its amr/acr claim): sign out, then "
                "sign in again with your second factor (ask your identity team to require it "
                "for lorahub)"
            )
        raise SecondFactorRequired(
            f"{action} needs a second factor in this session: set up an authenticator app (or "
            "sign out and in again with your code) at /accounts/second-factor/, then try again"
        )


def principal_for_user(user: User, *, second_factor: str = "", method: str = "") -> Principal:
    memberships = list(Membership.objects.filter(user=user).values_list("tenant_id", "role"))
    return Principal(
        user=user,
        api_key=None,
        tenant_ids=frozenset(t for t, _ in memberships),
        admin_tenant_ids=frozenset(t for t, role in memberships if role == TenantRole.ADMIN),
        roles=frozenset(services.platform_roles(user)),
        second_factor=second_factor,
        sign_in_method=method,
    )


def principal_for_session(request: HttpRequest) -> Principal:
    """The signed-in user of a console session, with how the session signed in."""
    session = request.session
    return principal_for_user(
        request.user,
        second_factor=session.get(SECOND_FACTOR_SESSION_KEY, ""),
        method=session.get(METHOD_SESSION_KEY, ""),
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
        # an admin key counts as a second factor only while it must expire (older admin keys
        # made without an expiry do not)
        second_factor="admin key" if key.admin and key.expires_at is not None else "",
    )


class ApiKeyAuth(HttpBearer):
    """``Authorization: Bearer lh_...`` → the key's tenant. An address past its limit of bad
    keys gets 429 for further bad ones; a valid key always passes (``apps/tenants/throttle.py``)."""

    def authenticate(self, request: HttpRequest, token: str) -> Principal | None:
        client = request.META.get("REMOTE_ADDR", "")
        key = services.authenticate_api_key(token, address=client)
        if key is None:
            wait_s = throttle.bad_keys().failed(client)
            if wait_s:
                raise Throttled(throttle.message(wait_s), retry_after=wait_s)
            return None
        return principal_for_key(key)


class SessionAuth(NinjaSessionAuth):
    """The console's session (CSRF-checked for unsafe methods by django-ninja)."""

    def authenticate(self, request: HttpRequest, key: str | None) -> Principal | None:
        user = super().authenticate(request, key)
        return principal_for_session(request) if user else None


API_AUTH = [ApiKeyAuth(), SessionAuth()]


class _OperatorsOnly:
    """Refuses (403) a caller who is not an operator before anything of the request is read:
    an operator endpoint must not tell a tenant what is wrong with a body it may not send."""

    def authenticate(self, request: HttpRequest, *args) -> Principal | None:
        principal = super().authenticate(request, *args)  # type: ignore[misc]
        if principal is not None:
            principal.require_operator()
        return principal


class OperatorApiKeyAuth(_OperatorsOnly, ApiKeyAuth):
    pass


class OperatorSessionAuth(_OperatorsOnly, SessionAuth):
    pass


OPERATOR_AUTH = [OperatorApiKeyAuth(), OperatorSessionAuth()]
