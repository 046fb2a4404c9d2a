"""The reviewer's side: approving (and so signing) or rejecting a validated version."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from apps.registry import bundles, keys, signing
from apps.registry.choices import VersionState
from apps.registry.models import AdapterVersion
from apps.tenants import services as tenant_services
from apps.tenants import webhooks
from apps.tenants.auth import Principal
from apps.tenants.errors import Conflict, Forbidden, Invalid

logger = logging.getLogger(__name__)


def _version_for_review(version_id: int, principal: Principal) -> AdapterVersion:
    principal.require_reviewer()
    version = (
        AdapterVersion.objects.select_for_update(of=("self",))
        .select_related("adapter__tenant")
        .get(pk=version_id)
    )
    if version.state != VersionState.PENDING_REVIEW:
        raise Conflict(
            f"version {version.label} is {version.get_state_display().lower()}; only versions "
            "pending review can be approved or rejected"
        )
    own_upload = principal.user is not None and principal.user.pk == version.uploaded_by_id
    if own_upload or version.adapter.tenant_id in principal.tenant_ids:
        raise Forbidden("reviewers cannot review their own tenant's uploads; ask another reviewer")
    return version


@transaction.atomic
def approve_version(*, version_id: int, principal: Principal, note: str = "") -> AdapterVersion:
    """Approve and sign: the signature covers the version's identity and every file's sha256."""
    principal.require_reviewer()
    principal.require_second_factor("approving a version")
    version = _version_for_review(version_id, principal)
    manifest = version.manifest()
    if signing.manifest_digest(manifest) != version.manifest_digest:
        raise Conflict(f"version {version.label}'s manifest changed since validation; refusing")
    private = keys.private_key()
    version.signature = signing.sign_manifest(private, manifest)
    version.signing_key_id = keys.register_current_key()
    _record_review(version, principal, VersionState.APPROVED, note)
    # inside the transaction: a store that fails rolls the approval back
    bundles.store_bundle(version)
    tenant_services.record_event(
        action="version.sign",
        obj=version,
        actor=principal.user,
        tenant=version.adapter.tenant,
        after={
            "signing_key_id": version.signing_key_id,
            "manifest_digest": version.manifest_digest,
        },
    )
    return version


@transaction.atomic
def reject_version(*, version_id: int, principal: Principal, note: str) -> AdapterVersion:
    if not note.strip():
        raise Invalid("say why the version is rejected, so that the tenant can fix it")
    principal.require_reviewer()
    principal.require_second_factor("rejecting a version")
    version = _version_for_review(version_id, principal)
    _record_review(version, principal, VersionState.REJECTED, note)
    return version


def _record_review(version: AdapterVersion, principal: Principal, state: str, note: str) -> None:
    version.state = state
    version.reviewer = principal.user
    version.review_note = note.strip()
    version.reviewed_at = timezone.now()
    version.save()
    tenant_services.record_event(
        action="version.approve" if state == VersionState.APPROVED else "version.reject",
        obj=version,
        actor=principal.user,
        tenant=version.adapter.tenant,
        before={"state": VersionState.PENDING_REVIEW},
        after={"state": version.state},
        note=version.review_note,
    )
    webhooks.notify(
        "version.approved" if state == VersionState.APPROVED else "version.rejected",
        tenant=version.adapter.tenant,
        data={
            "version": version.label,
            "version_id": version.pk,
            "reviewer": principal.label,
            "reason": version.review_note if state == VersionState.REJECTED else "",
            "note": version.review_note,
        },
    )


def verify_version(version: AdapterVersion, public_keys: dict[str, str] | None = None) -> bool:
    """True if the version's signature is valid for its manifest under a published key."""
    if not version.signature:
        return False
    return signing.verify_manifest(
        public_keys if public_keys is not None else keys.published_public_keys(),
        version.signing_key_id,
        version.manifest(),
        version.signature,
    )
