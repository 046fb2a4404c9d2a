"""Registry workflows: upload, validate, review and sign, base models. Aliases: ``aliases.py``.

Every write to the registry's models happens here, inside a transaction, with its audit event.
Callers (API handlers, tasks, commands) authorize, call one function and return.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.registry import archives, signing
from apps.registry.choices import VersionState
from apps.registry.errors import Rejected
from apps.registry.models import Adapter, AdapterVersion, BaseModel
from apps.registry.storage import StorageError, get_store
from apps.registry.validation import (
    BaseModelSpec,
    check_file_names,
    llama_modules,
    validate_adapter,
)
from apps.tenants import services as tenant_services
from apps.tenants import webhooks
from apps.tenants.auth import Principal
from apps.tenants.errors import Conflict, Forbidden, Invalid, QuotaExceeded, TooLarge
from apps.tenants.models import Tenant, slug_validator
from lorahub import queueing

logger = logging.getLogger(__name__)

VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]{0,63}$")
MAX_FILES_PER_UPLOAD = 3


@dataclass(frozen=True)
class UploadFile:
    """One uploaded file. ``name`` is the caller's file name: data, never used as a path."""

    name: str
    stream: BinaryIO
    size: int


# --- base models -----------------------------------------------------------------------------


@transaction.atomic
def register_base_model(
    *, name: str, revision: str, model_config: dict[str, Any], max_lora_rank: int
) -> BaseModel:
    """Record (or update the shapes of) a base model the platform serves."""
    base, _ = BaseModel.objects.update_or_create(
        name=name,
        revision=revision,
        defaults={
            "num_layers": model_config["num_hidden_layers"],
            "modules": llama_modules(model_config),
            "max_lora_rank": max_lora_rank,
        },
    )
    return base


def base_model_specs() -> list[BaseModelSpec]:
    return [
        BaseModelSpec(b.name, b.revision, b.num_layers, b.modules, b.max_lora_rank)
        for b in BaseModel.objects.all()
    ]


# --- upload ----------------------------------------------------------------------------------


def storage_prefix(version: AdapterVersion) -> str:
    adapter = version.adapter
    return f"tenants/{adapter.tenant.slug}/adapters/{adapter.adapter_id}/{version.version}"


def upload_limit_bytes(tenant: Tenant) -> int:
    quota_mb = tenant_services.get_quota(tenant).max_upload_mb
    return min(quota_mb, settings.LORAHUB_MAX_UPLOAD_MB) * 1024 * 1024


def _check_upload_names(files: list[UploadFile]) -> None:
    if not files:
        raise Rejected(
            "the upload has no files; send adapter_config.json and adapter_model.safetensors, "
            "or one .zip/.tar.gz archive of them"
        )
    if len(files) > MAX_FILES_PER_UPLOAD:
        raise Rejected(
            f"the upload has {len(files)} files; send adapter_config.json and "
            "adapter_model.safetensors (and optionally README.md), or one archive"
        )
    for f in files:
        pure = PurePosixPath(f.name.replace("\\", "/"))
        if not f.name or pure.name != f.name or f.name.startswith(".") or f.name in ("..", "."):
            raise Rejected(f"file name '{f.name}' must be a plain name without folders")
    names = [f.name for f in files]
    if any(archives.is_archive(n) for n in names):
        if len(files) > 1:
            raise Rejected("upload either one archive or the adapter's files, not both")
        return
    check_file_names(names)


def _next_version_string(adapter: Adapter) -> str:
    today = timezone.now().strftime("%Y-%m-%d")
    taken = set(
        adapter.versions.filter(version__startswith=today).values_list("version", flat=True)
    )
    n = 1
    while f"{today}.{n}" in taken:
        n += 1
    return f"{today}.{n}"


def _check_upload(
    principal: Principal,
    tenant: Tenant,
    adapter_id: str,
    files: list[UploadFile],
    version: str | None,
) -> None:
    """Refuse what needs no unpacking to judge: who uploads, bad names, too many or duplicate
    files, pickle files, a size over the tenant's limit."""
    if tenant.id not in principal.tenant_ids:
        raise Forbidden("you can upload only to your own tenant")
    try:
        slug_validator(adapter_id)
    except Exception:
        raise Invalid(
            f"adapter id '{adapter_id}' is not valid: use 2-63 lowercase letters, digits and "
            "hyphens, starting with a letter or digit"
        ) from None
    if version is not None and not VERSION_RE.match(version):
        raise Invalid(
            f"version '{version}' is not valid: use up to 64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (e.g. 2026-07-04.3)"
        )
    _check_upload_names(files)
    limit = upload_limit_bytes(tenant)
    total = sum(f.size for f in files)
    if total > limit:
        raise TooLarge(
            f"the upload is {total / 1048576:.1f} MB; tenant '{tenant.slug}' may upload at most "
            f"{limit // 1048576} MB per version (ask an operator to raise max_upload_mb)"
        )


def _adapter_with_room(tenant: Tenant, adapter_id: str, quota) -> Adapter:
    """The tenant's adapter (made if new), locked, with room for one more version under the
    tenant's quotas."""
    adapter = (
        Adapter.objects.select_for_update().filter(tenant=tenant, adapter_id=adapter_id).first()
    )
    if adapter is None:
        if Adapter.objects.filter(tenant=tenant).count() >= quota.max_adapters:
            raise QuotaExceeded(
                f"tenant '{tenant.slug}' has reached its limit of {quota.max_adapters} "
                "adapters; upload a new version of an existing adapter or ask an operator"
            )
        adapter = Adapter.objects.create(tenant=tenant, adapter_id=adapter_id)
    if adapter.versions.count() >= quota.max_versions_per_adapter:
        raise QuotaExceeded(
            f"adapter '{adapter_id}' has reached its limit of "
            f"{quota.max_versions_per_adapter} versions"
        )
    return adapter


def upload_version(
    *,
    principal: Principal,
    tenant: Tenant,
    adapter_id: str,
    files: list[UploadFile],
    version: str | None = None,
    base_model_revision: str = "",
    training_data_summary: str = "",
) -> AdapterVersion:
    """Stage an upload and queue its validation. Returns the new version (``validating``).

    Refuses at once, storing nothing, what needs no unpacking to judge: bad names, too many
    or duplicate files, pickle files, size over the tenant's limit, quota, a taken version.
    """
    _check_upload(principal, tenant, adapter_id, files, version)
    quota = tenant_services.get_quota(tenant)
    store = get_store()
    staged = f"staging/{uuid.uuid4().hex}"
    try:
        with transaction.atomic():
            adapter = _adapter_with_room(tenant, adapter_id, quota)
            version = version or _next_version_string(adapter)
            if adapter.versions.filter(version=version).exists():
                raise Conflict(
                    f"version '{version}' of '{adapter_id}' already exists; versions are "
                    "immutable and never reused, so choose a new version string"
                )
            row = AdapterVersion.objects.create(
                adapter=adapter,
                version=version,
                uploaded_by=principal.user,
                uploaded_by_key=principal.api_key,
                base_model_revision=base_model_revision.strip(),
                training_data_summary=training_data_summary.strip(),
                staging_prefix=staged,
            )
            index = []
            for n, f in enumerate(files):
                key = f"{staged}/{n}"
                store.put(key, f.stream)
                index.append({"name": f.name, "key": key, "size": f.size})
            store.put(f"{staged}/index.json", json.dumps(index).encode())
            tenant_services.record_event(
                action="version.upload",
                obj=row,
                actor=principal.user,
                actor_key=principal.api_key,
                tenant=tenant,
                after={"adapter": adapter_id, "version": version, "files": [f.name for f in files]},
            )
            transaction.on_commit(lambda: send_validation(row.pk))
    except BaseException:
        try:
            store.delete_prefix(staged)
        except StorageError:
            logger.exception("could not clean up staged upload %s", staged)
        raise
    return row


# --- validation ------------------------------------------------------------------------------


def _gather_files(version: AdapterVersion, work: Path) -> Path:
    """Download the staged upload into ``work`` and return the folder with the adapter files."""
    store = get_store()
    index = json.loads(store.get(f"{version.staging_prefix}/index.json"))
    folder = work / "adapter"
    folder.mkdir()
    limit = upload_limit_bytes(version.adapter.tenant)
    for entry in index:
        name = entry["name"]
        if not archives.is_archive(name):
            store.download(entry["key"], folder / PurePosixPath(name).name)
            continue
        packed = work / "upload.archive"
        store.download(entry["key"], packed)
        unpacked = work / "unpacked"
        unpacked.mkdir()
        names = archives.unpack(packed, name, unpacked, max_bytes=limit)
        tops = {n.split("/")[0] for n in names}
        root = unpacked
        if len(tops) == 1 and all("/" in n for n in names):
            root = unpacked / tops.pop()
        rel = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
        nested = [n for n in rel if "/" in n]
        if nested:
            raise Rejected(
                f"archive '{name}' has files in sub-folders ({nested[0]}); put the adapter "
                "files at the top of the archive or inside one folder"
            )
        check_file_names(rel)
        for n in rel:
            shutil.move(root / n, folder / n)
    return folder


VALIDATE_TASK = "apps.registry.tasks.validate_version"


def send_validation(version_id: int) -> None:
    """Queue ``validate_version`` for the worker (by name: ``tasks.py`` calls this module). A
    broker that does not answer must not fail the upload, which is stored: the
    stale-validation sweep queues it once the broker is back (Celery beat, and every worker
    as it starts)."""
    queueing.send(VALIDATE_TASK, version_id)


def requeue_stale_validations(*, older_than_s: float) -> list[int]:
    """Queue validation again for versions still ``validating`` ``older_than_s`` after their
    upload: the worker died mid-task or the broker lost the message. Safe to repeat:
    ``validate_version`` judges a version once (row lock + state check), so a duplicate
    task finds it judged and does nothing."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    stale = list(
        AdapterVersion.objects.filter(state=VersionState.VALIDATING, created_at__lt=cutoff)
        .order_by("created_at")
        .values_list("pk", flat=True)
    )
    for version_id in stale:
        logger.warning("version %s is still validating; queueing its validation again", version_id)
        send_validation(version_id)
    return stale


def validate_version(*, version_id: int) -> AdapterVersion:
    """Validate a staged upload; publish it for review or reject it. Idempotent.

    The version row stays locked for the whole validation, so a redelivered task (or any
    second caller) waits, then finds the version judged and does nothing. On rejection
    nothing of the upload stays in storage and the version can never be approved; its
    version string stays taken.
    """
    with transaction.atomic():
        version = (
            AdapterVersion.objects.select_for_update(of=("self",))
            .select_related("adapter__tenant")
            .get(pk=version_id)
        )
        if version.state != VersionState.VALIDATING:
            return version
        store = get_store()
        prefix = storage_prefix(version)
        # Objects left by an attempt that died half-way: nobody can have used them (the
        # version was never published), and we hold the lock, so clear them.
        store.delete_prefix(prefix)
        try:
            with tempfile.TemporaryDirectory(prefix="lorahub-validate-") as tmp:
                folder = _gather_files(version, Path(tmp))
                result = validate_adapter(
                    folder,
                    base_models=base_model_specs(),
                    revision_hint=version.base_model_revision or None,
                )
                for name in sorted(result.files):
                    with (folder / name).open("rb") as fh:
                        store.put(f"{prefix}/{name}", fh)
        except Rejected as exc:
            store.delete_prefix(prefix)
            return _finish_validation(version, rejected=exc.message)
        except StorageError:
            store.delete_prefix(prefix)
            raise  # the task retries
        return _finish_validation(version, result=result, prefix=prefix)


def _finish_validation(
    version: AdapterVersion, *, rejected: str | None = None, result=None, prefix: str = ""
) -> AdapterVersion:
    """Record the verdict; the caller holds the row lock inside its transaction."""
    staged = version.staging_prefix
    version.validated_at = timezone.now()
    version.staging_prefix = ""
    if rejected is not None:
        version.state = VersionState.REJECTED
        version.rejection_reason = rejected
        action, after = "version.validation_failed", {"reason": rejected}
    else:
        version.state = VersionState.PENDING_REVIEW
        version.base_model = result.base_model
        version.base_model_revision = result.base_model_revision
        version.rank = result.rank
        version.lora_alpha = result.lora_alpha
        version.target_modules = list(result.target_modules)
        version.files = result.files
        version.size_bytes = result.size_bytes
        version.report = result.report
        version.storage_prefix = prefix
        version.manifest_digest = signing.manifest_digest(version.manifest())
        action, after = "version.validated", {"manifest_digest": version.manifest_digest}
    version.save()
    tenant_services.record_event(
        action=action,
        obj=version,
        tenant=version.adapter.tenant,
        before={"state": VersionState.VALIDATING},
        after={"state": version.state, **after},
    )
    if rejected is not None:
        webhooks.notify(
            "version.rejected",
            tenant=version.adapter.tenant,
            data={"version": version.label, "version_id": version.pk, "reason": rejected},
        )
    transaction.on_commit(lambda: get_store().delete_prefix(staged))
    return version
