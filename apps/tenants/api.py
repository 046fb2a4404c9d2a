"""Tenant endpoints: who am I, API keys (tenant admins), quotas (operators)."""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest
from ninja import Router, Schema, Status

from apps.tenants import services
from apps.tenants.auth import API_AUTH, Principal
from apps.tenants.errors import NotFound
from apps.tenants.models import ApiKey, Membership, Tenant

router = Router(tags=["tenants"], auth=API_AUTH)


class MembershipOut(Schema):
    tenant: str
    role: str


class MeOut(Schema):
    username: str | None
    api_key: str | None
    platform_roles: list[str]
    tenants: list[MembershipOut]


class ApiKeyIn(Schema):
    name: str
    admin: bool = False  # acts as a tenant admin; a person must issue it (not another key)
    # when the key stops working (401 key_expired); none: until it is revoked
    expires_at: datetime | None = None


class ApiKeyOut(Schema):
    name: str
    prefix: str
    admin: bool
    created_at: datetime
    last_used_at: datetime | None
    last_used_from: str | None
    revoked_at: datetime | None
    expires_at: datetime | None
    state: str  # active, expired or revoked


class NewApiKeyOut(ApiKeyOut):
    key: str  # shown once, never again


class QuotaSchema(Schema):
    max_hot_adapters: int
    max_warm_adapters: int
    max_hot_memory_mb: int
    max_adapters: int
    max_versions_per_adapter: int
    max_upload_mb: int
    requests_per_minute: int
    engine_weight: int


class QuotaPatch(Schema):
    max_hot_adapters: int | None = None
    max_warm_adapters: int | None = None
    max_hot_memory_mb: int | None = None
    max_adapters: int | None = None
    max_versions_per_adapter: int | None = None
    max_upload_mb: int | None = None
    requests_per_minute: int | None = None
    engine_weight: int | None = None


def visible_tenant(principal: Principal, slug: str) -> Tenant:
    """A tenant the caller belongs to (or any, for an operator); 404 otherwise, never 403."""
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None or (tenant.id not in principal.tenant_ids and not principal.is_operator):
        raise NotFound(f"no tenant '{slug}' that you belong to")
    return tenant


def _key_out(key: ApiKey) -> dict:
    return {
        "name": key.name,
        "prefix": key.prefix,
        "admin": key.admin,
        "created_at": key.created_at,
        "last_used_at": key.last_used_at,
        "last_used_from": key.last_used_from,
        "revoked_at": key.revoked_at,
        "expires_at": key.expires_at,
        "state": "revoked" if key.revoked_at else "expired" if key.is_expired else "active",
    }


@router.get("/me", response=MeOut)
def me(request: HttpRequest):
    principal: Principal = request.auth
    if principal.user is not None:
        memberships = Membership.objects.filter(user=principal.user).select_related("tenant")
        tenants = [MembershipOut(tenant=m.tenant.slug, role=m.role) for m in memberships]
    else:
        role = "admin_api_key" if principal.api_key.admin else "api_key"
        tenants = [MembershipOut(tenant=principal.api_key.tenant.slug, role=role)]
    return {
        "username": principal.user.get_username() if principal.user else None,
        "api_key": principal.api_key.prefix if principal.api_key else None,
        "platform_roles": sorted(principal.roles),
        "tenants": tenants,
    }


@router.get("/tenants/{slug}/keys", response=list[ApiKeyOut])
def list_keys(request: HttpRequest, slug: str):
    tenant = visible_tenant(request.auth, slug)
    request.auth.require_tenant_admin(tenant)
    return [_key_out(k) for k in tenant.api_keys.all()]


@router.post("/tenants/{slug}/keys", response={201: NewApiKeyOut})
def issue_key(request: HttpRequest, slug: str, body: ApiKeyIn):
    tenant = visible_tenant(request.auth, slug)
    request.auth.require_tenant_admin(tenant)
    if body.admin:  # an admin key may promote and abort releases
        request.auth.require_second_factor("issuing an admin key")
    key, plaintext = services.issue_api_key(
        tenant=tenant,
        name=body.name,
        actor=request.auth.user,
        actor_key=request.auth.api_key,
        admin=body.admin,
        expires_at=body.expires_at,
    )
    return Status(201, {**_key_out(key), "key": plaintext})


@router.delete("/tenants/{slug}/keys/{prefix}", response=ApiKeyOut)
def revoke_key(request: HttpRequest, slug: str, prefix: str):
    tenant = visible_tenant(request.auth, slug)
    request.auth.require_tenant_admin(tenant)
    key = tenant.api_keys.filter(prefix=prefix).first()
    if key is None:
        raise NotFound(f"tenant '{slug}' has no API key with prefix '{prefix}'")
    return _key_out(
        services.revoke_api_key(key=key, actor=request.auth.user, actor_key=request.auth.api_key)
    )


@router.get("/tenants/{slug}/quota", response=QuotaSchema)
def get_quota(request: HttpRequest, slug: str):
    tenant = visible_tenant(request.auth, slug)
    request.auth.require_tenant_admin(tenant)
    return services.get_quota(tenant)


@router.put("/tenants/{slug}/quota", response=QuotaSchema)
def put_quota(request: HttpRequest, slug: str, body: QuotaPatch):
    request.auth.require_operator()
    tenant = visible_tenant(request.auth, slug)
    return services.set_quota(
        tenant=tenant, actor=request.auth.user, **body.model_dump(exclude_none=True)
    )
