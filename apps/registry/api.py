"""Registry endpoints: uploads, versions, review, aliases, signing keys, audit."""

from __future__ import annotations

import logging
from typing import Annotated

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from ninja import File, Form, Query, Router, Status
from ninja.files import UploadedFile

from apps.registry import aliases, downloads, keys, queries, review, services
from apps.registry.choices import VersionState
from apps.registry.models import Adapter, AdapterVersion, Alias
from apps.registry.schemas import (
    AdapterOut,
    AliasOut,
    AliasTargetIn,
    AuditOut,
    CanaryIn,
    NoteIn,
    ReasonIn,
    ShadowIn,
    SigningKeyOut,
    VersionOut,
    alias_out,
    version_out,
)
from apps.tenants.api import visible_tenant
from apps.tenants.auth import API_AUTH, Principal
from apps.tenants.errors import Forbidden, Invalid, NotFound
from apps.tenants.models import AuditEvent

logger = logging.getLogger(__name__)
router = Router(tags=["registry"], auth=API_AUTH)


# --- schemas ---------------------------------------------------------------------------------


# --- uploads and versions --------------------------------------------------------------------


@router.post("/adapters/{adapter_id}/versions", response={202: VersionOut})
def upload_version(
    request: HttpRequest,
    adapter_id: str,
    files: list[UploadedFile] = File(...),  # noqa: B008 (django-ninja's declaration style)
    version: str | None = Form(None),
    base_model_revision: str = Form(""),
    training_data_summary: str = Form(""),
    tenant: str | None = Query(None),
):
    """Upload one PEFT adapter (its files, or one .zip/.tar.gz) as a new immutable version.

    Validation runs in the background: poll the version until it leaves `validating`.
    """
    principal: Principal = request.auth
    target = principal.tenant_for(tenant)
    row = services.upload_version(
        principal=principal,
        tenant=target,
        adapter_id=adapter_id,
        files=[services.UploadFile(f.name or "", f.file, f.size) for f in files],
        version=version or None,
        base_model_revision=base_model_revision,
        training_data_summary=training_data_summary,
    )
    return Status(202, version_out(queries.visible_version(principal, row.pk)))


@router.get("/adapters", response=list[AdapterOut])
def list_adapters(request: HttpRequest, tenant: str | None = None):
    principal: Principal = request.auth
    qs = Adapter.objects.visible_to(principal).select_related("tenant").prefetch_related("versions")
    if tenant:
        qs = qs.filter(tenant__slug=tenant)
    out = []
    for adapter in qs:
        versions = sorted(adapter.versions.all(), key=lambda v: v.created_at)
        out.append(
            {
                "tenant": adapter.tenant.slug,
                "adapter_id": adapter.adapter_id,
                "versions": len(versions),
                "latest_version": versions[-1].version if versions else None,
                "created_at": adapter.created_at,
            }
        )
    return out


@router.get("/adapters/{adapter_id}/versions", response=list[VersionOut])
def list_adapter_versions(request: HttpRequest, adapter_id: str, tenant: str | None = None):
    qs = AdapterVersion.objects.visible_to(request.auth).filter(adapter__adapter_id=adapter_id)
    if tenant:
        qs = qs.filter(adapter__tenant__slug=tenant)
    versions = list(qs)
    principal: Principal = request.auth
    adapters = Adapter.objects.visible_to(principal).filter(adapter_id=adapter_id)
    if not versions and not adapters.exists():
        raise NotFound(f"no adapter '{adapter_id}' that you can see")
    if len({v.adapter.tenant_id for v in versions}) > 1:
        raise Invalid(f"several tenants have an adapter '{adapter_id}': add ?tenant=<slug>")
    return [version_out(v) for v in versions]


@router.get("/versions", response=list[VersionOut])
def list_versions(
    request: HttpRequest,
    state: VersionState | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
):
    """Versions you can see, newest first; reviewers use `?state=pending_review` as a queue."""
    qs = AdapterVersion.objects.visible_to(request.auth)
    if state:
        qs = qs.filter(state=state)
    return [version_out(v) for v in qs.order_by("created_at" if state else "-created_at")[:limit]]


@router.get("/versions/{version_id}", response=VersionOut)
def get_version(request: HttpRequest, version_id: int):
    return version_out(queries.visible_version(request.auth, version_id))


# A file answer (not JSON) in the OpenAPI document: what it is, and its media type.
def _file_answer(media_type: str, what: str) -> dict:
    return {
        "responses": {
            200: {
                "description": what,
                "content": {media_type: {"schema": {"type": "string", "format": "binary"}}},
            }
        }
    }


@router.get(
    "/versions/{version_id}/files/{name}",
    openapi_extra=_file_answer("application/octet-stream", "the file's bytes"),
)
def version_file(request: HttpRequest, version_id: int, name: str):
    """One file of an approved version you can read (`lorahub pull`): a name its `files`
    lists, or `model.sig`, its OpenSSF model-signing bundle (docs/security.md)."""
    version = queries.visible_version(request.auth, version_id)
    return downloads.version_file(version, name)


@router.get(
    "/signing-keys/lorahub.pub",
    auth=None,
    openapi_extra=_file_answer("application/x-pem-file", "the public key, PEM"),
)
def model_signing_public_key(request: HttpRequest):
    """The public key that checks every version's `model.sig` with the OpenSSF tool:
    `model_signing verify key --signature model.sig --public_key lorahub.pub <folder>`."""
    return downloads.public_key()


@router.post("/versions/{version_id}/approve", response=VersionOut)
def approve_version(request: HttpRequest, version_id: int, body: NoteIn):
    queries.visible_version(request.auth, version_id)
    review.approve_version(version_id=version_id, principal=request.auth, note=body.note)
    return version_out(queries.visible_version(request.auth, version_id))


@router.post("/versions/{version_id}/reject", response=VersionOut)
def reject_version(request: HttpRequest, version_id: int, body: NoteIn):
    queries.visible_version(request.auth, version_id)
    review.reject_version(version_id=version_id, principal=request.auth, note=body.note)
    return version_out(queries.visible_version(request.auth, version_id))


# --- aliases ---------------------------------------------------------------------------------


def _alias(principal: Principal, name: str, tenant: str | None) -> Alias:
    target = principal.acting_tenant(tenant)
    alias = (
        Alias.objects.select_related(
            "tenant",
            "adapter",
            "version__adapter",
            "canary_version__adapter",
            "shadow_version__adapter",
        )
        .filter(tenant=target, name=name)
        .first()
    )
    if alias is None:
        raise NotFound(f"tenant '{target.slug}' has no alias '{name}'")
    return alias


@router.get("/aliases", response=list[AliasOut])
def list_aliases(request: HttpRequest, tenant: str | None = None):
    principal: Principal = request.auth
    qs = Alias.objects.select_related(
        "tenant",
        "adapter",
        "version__adapter",
        "canary_version__adapter",
        "shadow_version__adapter",
    )
    if not principal.is_operator:
        qs = qs.filter(tenant_id__in=principal.tenant_ids)
    if tenant:
        qs = qs.filter(tenant__slug=tenant)
    return [alias_out(a) for a in qs]


@router.get("/aliases/{name}", response=AliasOut)
def get_alias(request: HttpRequest, name: str, tenant: str | None = None):
    return alias_out(_alias(request.auth, name, tenant))


@router.put("/aliases/{name}", response=AliasOut)
def put_alias(request: HttpRequest, name: str, body: AliasTargetIn, tenant: str | None = None):
    target = request.auth.acting_tenant(tenant)
    aliases.set_alias(
        principal=request.auth,
        tenant=target,
        name=name,
        version_id=body.version_id,
        reason=body.reason,
    )
    return alias_out(_alias(request.auth, name, tenant))


@router.post("/aliases/{name}/canary", response=AliasOut)
def canary_alias(request: HttpRequest, name: str, body: CanaryIn, tenant: str | None = None):
    target = request.auth.acting_tenant(tenant)
    aliases.set_canary(
        principal=request.auth,
        tenant=target,
        name=name,
        version_id=body.version_id,
        percent=body.percent,
        api_keys=body.api_keys,
        reason=body.reason,
    )
    return alias_out(_alias(request.auth, name, tenant))


@router.post("/aliases/{name}/shadow", response=AliasOut)
def shadow_alias(request: HttpRequest, name: str, body: ShadowIn, tenant: str | None = None):
    """Mirror `percent` (1-100) of the alias's requests to a version off the response path
    (callers never wait for it nor see its answer); `version_id: null` clears the shadow."""
    target = request.auth.acting_tenant(tenant)
    aliases.set_shadow(
        principal=request.auth,
        tenant=target,
        name=name,
        version_id=body.version_id,
        percent=body.percent,
        keep_examples=body.keep_examples,
        reason=body.reason,
    )
    return alias_out(_alias(request.auth, name, tenant))


@router.post("/aliases/{name}/promote", response=AliasOut)
def promote_alias(request: HttpRequest, name: str, body: ReasonIn, tenant: str | None = None):
    target = request.auth.acting_tenant(tenant)
    aliases.promote_alias(principal=request.auth, tenant=target, name=name, reason=body.reason)
    return alias_out(_alias(request.auth, name, tenant))


@router.post("/aliases/{name}/rollback", response=AliasOut)
def rollback_alias(request: HttpRequest, name: str, body: ReasonIn, tenant: str | None = None):
    target = request.auth.acting_tenant(tenant)
    aliases.rollback_alias(principal=request.auth, tenant=target, name=name, reason=body.reason)
    return alias_out(_alias(request.auth, name, tenant))


# --- keys and audit --------------------------------------------------------------------------


@router.get("/signing-keys", response=list[SigningKeyOut])
def signing_keys(request: HttpRequest):
    """The public keys serving nodes verify signatures with (id → raw Ed25519, base64).

    Answers from what was published even where this process has no private key (a
    control plane that does not sign, a fresh install before `init_signing_key`): no key is
    then marked current."""
    try:
        current = keys.register_current_key()
    except ImproperlyConfigured as exc:
        logger.warning("no signing key here (%s); listing the published keys only", exc)
        current = None
    return [
        {"key_id": kid, "algorithm": "ed25519", "public_key": pub, "current": kid == current}
        for kid, pub in keys.published_public_keys().items()
    ]


@router.get("/audit", response=list[AuditOut])
def audit(
    request: HttpRequest,
    tenant: str | None = None,
    action: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
):
    """Operators see every event; a tenant admin sees their own tenant's."""
    principal: Principal = request.auth
    qs = AuditEvent.objects.select_related("actor", "actor_key", "tenant")
    if not principal.is_operator:
        if not principal.admin_tenant_ids:
            raise Forbidden("the audit log is for operators and tenant admins")
        qs = qs.filter(tenant_id__in=principal.admin_tenant_ids)
    if tenant:
        qs = qs.filter(tenant=visible_tenant(principal, tenant))
    if action:
        qs = qs.filter(action__startswith=action)
    return [
        {
            "at": e.at,
            "action": e.action,
            "actor": e.actor.get_username()
            if e.actor
            else (f"key {e.actor_key.prefix}" if e.actor_key else None),
            "tenant": e.tenant.slug if e.tenant else None,
            "object_type": e.object_type,
            "object_id": e.object_id,
            "before": e.before,
            "after": e.after,
            "note": e.note,
        }
        for e in qs[: min(limit, 1000)]
    ]
