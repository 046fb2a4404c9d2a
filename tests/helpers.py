"""Helpers for tests: API clients, uploads, adapter edits, streamed completions."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import httpx
from django.test import Client

from apps.registry import review, services
from apps.registry.validation import CONFIG_NAME, WEIGHTS_NAME
from apps.tenants import services as tenant_services
from tests.harness.waiting import wait_until


def key_client(tenant, name: str = "test") -> Client:
    _, plaintext = tenant_services.issue_api_key(tenant=tenant, name=name, actor=None)
    return Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}")


def user_client(username: str, password: str) -> Client:
    client = Client()
    assert client.login(username=username, password=password)
    return client


def files_of(folder: Path) -> list:
    """The folder's files as uploads for the Django test client."""
    uploads = []
    for path in sorted(folder.iterdir()):
        handle = io.BytesIO(path.read_bytes())
        handle.name = path.name
        uploads.append(handle)
    return uploads


def upload(client: Client, adapter_id: str, files: list, **fields):
    return client.post(f"/api/adapters/{adapter_id}/versions", {"files": files, **fields})


def wait_validated(client: Client, version_id: int, timeout: float = 60) -> dict:
    def validated() -> dict | None:
        body = client.get(f"/api/versions/{version_id}").json()
        return body if body["state"] != "validating" else None

    return wait_until(validated, f"version {version_id} to leave 'validating'", timeout)


def edit_config(folder: Path, **changes) -> None:
    path = folder / CONFIG_NAME
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def edit_tensors(folder: Path, edit) -> None:
    """Load the adapter's tensors as numpy arrays, let ``edit`` change the dict, save again."""
    from safetensors.numpy import load_file, save_file

    path = folder / WEIGHTS_NAME
    tensors = load_file(path)
    edit(tensors)
    path.unlink()
    save_file(tensors, path)


def publish(tenant, adapter_id: str, version: str, folder: Path, reviewer_user) -> int:
    """Upload, validate (in this process) and approve a version through the services."""
    from apps.tenants.auth import principal_for_key, principal_for_user

    key, _ = tenant_services.issue_api_key(
        tenant=tenant, name=f"pub-{adapter_id}-{version}", actor=None
    )
    paths = sorted(folder.iterdir())
    row = services.upload_version(
        principal=principal_for_key(key),
        tenant=tenant,
        adapter_id=adapter_id,
        version=version,
        files=[
            services.UploadFile(p.name, io.BytesIO(p.read_bytes()), p.stat().st_size) for p in paths
        ],
    )
    validated = services.validate_version(version_id=row.pk)
    assert validated.state == "pending_review", validated.rejection_reason
    review.approve_version(version_id=row.pk, principal=principal_for_user(reviewer_user))
    return row.pk


def write_platform_keys(signing_key_file: Path) -> str:
    """The Ed25519 key at ``signing_key_file`` and the model-signing key beside it (where
    ``bundles.bundle_key_file`` looks without LORAHUB_BUNDLE_KEY_FILE); returns the Ed25519
    key's id."""
    from apps.registry import bundles, keys

    bundles.write_new_key(signing_key_file.with_name("model-signing-key.pem"))
    return keys.write_new_private_key(signing_key_file)


def approved_version(tenant, adapter_id: str, version: str, reviewer_user, *, rank: int = 8) -> int:
    """An approved, signed version row made without the upload pipeline: no object store, no
    validation, no worker, so a test of rules over versions (aliases, canaries) can run under
    ``db``. Its files are named and hashed but never stored; the reviewer's approval and the
    signature are the real services'. Full-pipeline publishing is ``publish``."""
    from apps.tenants.auth import principal_for_user

    pk = pending_version(tenant, adapter_id, version, rank=rank)
    review.approve_version(
        version_id=pk, principal=principal_for_user(reviewer_user, second_factor="test")
    )
    return pk


def pending_version(tenant, adapter_id: str, version: str, *, rank: int = 8) -> int:
    """A version row waiting for review, as validation leaves it (files named, not stored)."""
    import hashlib

    from apps.demo import corpus
    from apps.registry import signing
    from apps.registry.models import Adapter, AdapterVersion

    adapter, _ = Adapter.objects.get_or_create(tenant=tenant, adapter_id=adapter_id)
    files = {
        name: {
            "sha256": hashlib.sha256(f"{adapter_id}@{version}/{name}".encode()).hexdigest(),
            "size": size,
        }
        for name, size in (("adapter_config.json", 600), ("adapter_model.safetensors", 1 << 20))
    }
    row = AdapterVersion.objects.create(
        adapter=adapter,
        version=version,
        state="pending_review",
        base_model=corpus.BASE_MODEL_NAME,
        base_model_revision=corpus.BASE_MODEL_REVISION,
        rank=rank,
        lora_alpha=2.0 * rank,
        target_modules=["q_proj", "v_proj"],
        files=files,
        size_bytes=sum(meta["size"] for meta in files.values()),
        storage_prefix=f"tenants/{tenant.slug}/adapters/{adapter_id}/{version}",
    )
    row.manifest_digest = signing.manifest_digest(row.manifest())
    row.save(update_fields=["manifest_digest"])
    return row.pk


def signed_version(store, folder: Path, prefix: str, key, **fields):
    """Put ``folder``'s files in ``store`` under ``prefix`` and describe them as the registry
    would to a node: a ``ResolvedVersion`` whose manifest is signed with ``key``.

    Returns it and the public keys a node checks it with. ``fields`` override the defaults
    (tenant 1 ``t``, adapter ``support``, version ``v1``, id 7, rank 8, the demo base model).
    """
    from apps.demo import corpus
    from apps.registry import signing
    from apps.registry.contracts import ResolvedVersion
    from apps.registry.signing import sha256_file

    files = []
    for path in sorted(folder.iterdir()):
        store.put(f"{prefix}/{path.name}", path.read_bytes())
        files.append((path.name, sha256_file(path), path.stat().st_size))
    values = {
        "tenant_id": 1,
        "tenant_slug": "t",
        "alias": "support",
        "adapter_id": "support",
        "version_id": 7,
        "version": "v1",
        "base_model": corpus.BASE_MODEL_NAME,
        "base_model_revision": corpus.BASE_MODEL_REVISION,
        "rank": 8,
        **fields,
    }
    manifest = {
        "tenant": values["tenant_slug"],
        "adapter_id": values["adapter_id"],
        "version": values["version"],
        "base_model": values["base_model"],
        "base_model_revision": values["base_model_revision"],
        "rank": values["rank"],
        "files": {name: sha for name, sha, _ in files},
    }
    public = signing.public_key_b64(key)
    resolved = ResolvedVersion(
        **values,
        storage_prefix=prefix,
        files=tuple(files),
        manifest=manifest,
        signature=signing.sign_manifest(key, manifest),
        signing_key_id=signing.key_id(public),
        is_canary=False,
    )
    return resolved, {signing.key_id(public): public}


def resolved_version(**fields):
    """A ``ResolvedVersion`` as a node holds one, unsigned (for rules that never check the
    signature); ``fields`` override the defaults."""
    from apps.registry.contracts import ResolvedVersion

    values = {
        "tenant_id": 1,
        "tenant_slug": "tenant-a",
        "alias": "support",
        "adapter_id": "support",
        "version_id": 2,
        "version": "v2",
        "base_model": "m",
        "base_model_revision": "r",
        "rank": 8,
        "storage_prefix": "",
        "files": (),
        "manifest": {},
        "signature": "",
        "signing_key_id": "",
        "is_canary": False,
    }
    return ResolvedVersion(**{**values, **fields})


@contextmanager
def count_queries():
    """The SQL statements run inside the block, as a list (also across Django's request
    signals, which reset ``connection.queries``)."""
    from django.db import connection

    statements: list[str] = []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield statements


def stream_completion(
    url: str,
    key: str,
    *,
    prompt: str,
    max_tokens: int,
    seed: int = 3,
    on_first_chunk: Callable[[str | None], None] | None = None,
) -> dict:
    """A sampled streamed completion from a node (sampled: long answers, not an early end).

    ``on_first_chunk`` gets the answering node's name once the first chunk has arrived.
    Returns the status, the adapter and node headers, the text, whether it ended with
    ``[DONE]``, and the transport error's name if the connection broke.
    """
    body = {"model": "support", "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    body.update(temperature=1.0, seed=seed)
    out: dict = {"status": None, "node": None, "adapter": None, "text": "", "error": None}
    try:
        with httpx.stream(
            "POST",
            f"{url}/v1/completions",
            headers={"Authorization": f"Bearer {key}"},
            json=body,
            timeout=httpx.Timeout(120, read=60),
        ) as response:
            out["status"] = response.status_code
            out["node"] = response.headers.get("x-lorahub-node")
            out["adapter"] = response.headers.get("x-lorahub-adapter")
            for chunk in response.iter_text():
                if on_first_chunk is not None and not out["text"]:
                    on_first_chunk(out["node"])
                out["text"] += chunk
    except httpx.HTTPError as exc:
        out["error"] = type(exc).__name__
    out["done"] = "data: [DONE]" in out["text"]
    return out


def node_metric(url: str, name: str, **labels: str) -> float:
    """The sum of a node's samples called ``name`` whose labels include ``labels`` (read with
    the internal token, parsed by prometheus_client's own parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.harness.processes import NODE_INTERNAL_TOKEN

    text = httpx.get(
        f"{url}/metrics", headers={"Authorization": f"Bearer {NODE_INTERNAL_TOKEN}"}
    ).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def record_requests(tenant, version: str, n: int, *, status: int = 200, at=None) -> None:
    """``n`` requests of alias ``support`` as a node records them (request log and rollups)."""
    from django.utils import timezone

    from apps.telemetry import records, writers

    moment = at or timezone.now()
    writers.write_records(
        "n1",
        [
            records.RequestRecord(
                tenant_id=tenant.pk,
                alias="support",
                adapter_id="support",
                version=version,
                tier="L1" if status == 200 else "",
                status=status,
                ttft_ms=40.0 if status == 200 else None,
                finish_reason="stop" if status == 200 else "",
                at=moment,
            )
            for _ in range(n)
        ],
    )
