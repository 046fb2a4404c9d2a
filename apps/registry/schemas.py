"""The registry API's request and response shapes, and the dicts it answers with."""

from __future__ import annotations

from datetime import datetime

from ninja import Schema

from apps.registry.models import AdapterVersion, Alias


class FileOut(Schema):
    sha256: str
    size: int


class VersionOut(Schema):
    id: int
    tenant: str
    adapter_id: str
    version: str
    state: str
    base_model: str
    base_model_revision: str
    rank: int | None
    lora_alpha: float | None
    target_modules: list[str]
    size_bytes: int | None
    files: dict[str, FileOut]
    report: dict
    manifest_digest: str
    training_data_summary: str
    uploaded_by: str | None
    rejection_reason: str
    reviewer: str | None
    review_note: str
    signed: bool
    signing_key_id: str
    created_at: datetime
    validated_at: datetime | None
    reviewed_at: datetime | None


class AdapterOut(Schema):
    tenant: str
    adapter_id: str
    versions: int
    latest_version: str | None
    created_at: datetime


class NoteIn(Schema):
    note: str = ""


class AliasTargetIn(Schema):
    version_id: int
    reason: str = ""


class CanaryIn(Schema):
    version_id: int | None
    percent: int = 0
    api_keys: list[str] = []
    reason: str = ""


class ShadowIn(Schema):
    version_id: int | None
    percent: int = 0
    keep_examples: bool = False
    reason: str = ""


class ReasonIn(Schema):
    reason: str = ""


class VersionRef(Schema):
    id: int
    label: str


class AliasEventOut(Schema):
    action: str
    from_version: str | None
    to_version: str | None
    canary_version: str | None
    canary_percent: int
    actor: str
    reason: str
    at: datetime


class AliasOut(Schema):
    tenant: str
    name: str
    adapter_id: str
    version: VersionRef
    canary_version: VersionRef | None
    canary_percent: int
    canary_api_keys: list[str]
    shadow_version: VersionRef | None
    shadow_percent: int
    shadow_keep_examples: bool
    held_by: str  # e.g. "release #3" while a release drives the alias ("" otherwise)
    updated_at: datetime
    history: list[AliasEventOut]


class SigningKeyOut(Schema):
    key_id: str
    algorithm: str
    public_key: str
    current: bool


class AuditOut(Schema):
    at: datetime
    action: str
    actor: str | None
    tenant: str | None
    object_type: str
    object_id: str
    before: dict | None
    after: dict | None
    note: str


# --- helpers ---------------------------------------------------------------------------------


def version_out(v: AdapterVersion) -> dict:
    return {
        "id": v.pk,
        "tenant": v.adapter.tenant.slug,
        "adapter_id": v.adapter.adapter_id,
        "version": v.version,
        "state": v.state,
        "base_model": v.base_model,
        "base_model_revision": v.base_model_revision,
        "rank": v.rank,
        "lora_alpha": v.lora_alpha,
        "target_modules": v.target_modules,
        "size_bytes": v.size_bytes,
        "files": v.files,
        "report": v.report,
        "manifest_digest": v.manifest_digest,
        "training_data_summary": v.training_data_summary,
        "uploaded_by": (
            v.uploaded_by.get_username()
            if v.uploaded_by
            else (f"key {v.uploaded_by_key.prefix}" if v.uploaded_by_key else None)
        ),
        "rejection_reason": v.rejection_reason,
        "reviewer": v.reviewer.get_username() if v.reviewer else None,
        "review_note": v.review_note,
        "signed": bool(v.signature),
        "signing_key_id": v.signing_key_id,
        "created_at": v.created_at,
        "validated_at": v.validated_at,
        "reviewed_at": v.reviewed_at,
    }


def _ref(v: AdapterVersion | None) -> dict | None:
    return {"id": v.pk, "label": v.label} if v else None


def alias_out(alias: Alias) -> dict:
    history = alias.history.select_related(
        "from_version__adapter", "to_version__adapter", "canary_version__adapter"
    )[:50]
    return {
        "tenant": alias.tenant.slug,
        "name": alias.name,
        "adapter_id": alias.adapter.adapter_id,
        "version": _ref(alias.version),
        "canary_version": _ref(alias.canary_version),
        "canary_percent": alias.canary_percent,
        "canary_api_keys": alias.canary_api_keys,
        "shadow_version": _ref(alias.shadow_version),
        "shadow_percent": alias.shadow_percent,
        "shadow_keep_examples": alias.shadow_keep_examples,
        "held_by": alias.held_by,
        "updated_at": alias.updated_at,
        "history": [
            {
                "action": e.action,
                "from_version": e.from_version.label if e.from_version else None,
                "to_version": e.to_version.label if e.to_version else None,
                "canary_version": e.canary_version.label if e.canary_version else None,
                "canary_percent": e.canary_percent,
                "actor": e.actor_label,
                "reason": e.reason,
                "at": e.at,
            }
            for e in history
        ],
    }
