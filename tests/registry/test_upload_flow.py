"""The happy path end to end: upload → validate (Celery worker) → approve + sign → alias →
resolve, on PostgreSQL, Redis and the S3 server."""

from __future__ import annotations

import io
import tarfile
import zipfile

from apps.registry import review, snapshots
from apps.registry.models import AdapterVersion
from apps.registry.signing import sha256_file
from apps.registry.storage import get_store
from tests.helpers import files_of, key_client, upload, user_client, wait_validated


def test_upload_validate_approve_alias_resolve(registry, tenant_a, reviewer, adapter_files):
    tenant = key_client(tenant_a)
    response = upload(
        tenant,
        "support",
        files_of(adapter_files),
        version="2026-07-04.3",
        training_data_summary="10k support tickets, 2026-Q2",
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["state"] == "validating"
    version_id = body["id"]

    validated = wait_validated(tenant, version_id)
    assert validated["state"] == "pending_review", validated["rejection_reason"]
    assert validated["rank"] == 8
    assert validated["base_model"] == "lorahub-demo-tiny"
    assert validated["base_model_revision"] == "r1"
    assert validated["files"]["adapter_model.safetensors"]["sha256"] == sha256_file(
        adapter_files / "adapter_model.safetensors"
    )
    assert validated["signed"] is False

    store = get_store()
    prefix = "tenants/tenant-a/adapters/support/2026-07-04.3"
    assert sorted(i.key for i in store.list(prefix + "/")) == [
        f"{prefix}/adapter_config.json",
        f"{prefix}/adapter_model.safetensors",
    ]
    assert (
        store.get(f"{prefix}/adapter_model.safetensors")
        == (adapter_files / "adapter_model.safetensors").read_bytes()
    )
    assert list(store.list("staging/")) == []  # the raw upload is gone

    # the tenant cannot approve its own upload; a reviewer can
    assert (
        tenant.post(
            f"/api/versions/{version_id}/approve", {}, content_type="application/json"
        ).status_code
        == 403
    )
    rita = user_client("rita", "rita-pass-123")
    queue = rita.get("/api/versions?state=pending_review").json()
    assert [v["id"] for v in queue] == [version_id]
    approved = rita.post(
        f"/api/versions/{version_id}/approve",
        {"note": "looks good"},
        content_type="application/json",
    ).json()
    assert approved["state"] == "approved"
    assert approved["signed"] is True
    assert approved["reviewer"] == "rita"
    assert review.verify_version(AdapterVersion.objects.get(pk=version_id))

    alias = tenant.put(
        "/api/aliases/support",
        {"version_id": version_id, "reason": "launch"},
        content_type="application/json",
    )
    assert alias.status_code == 200, alias.content
    assert alias.json()["version"]["label"] == "support@2026-07-04.3"

    resolved = snapshots.resolve_alias(tenant=tenant_a, name="support", request_key="req-1")
    assert resolved.version == "2026-07-04.3"
    assert resolved.cache_key == (tenant_a.id, "support", "2026-07-04.3", "r1")
    assert resolved.storage_prefix == prefix
    assert resolved.signing_key_id == approved["signing_key_id"]
    keys = {k["key_id"]: k["public_key"] for k in tenant.get("/api/signing-keys").json()}
    from apps.registry import signing

    assert signing.verify_manifest(
        keys, resolved.signing_key_id, resolved.manifest, resolved.signature
    )

    actions = [e["action"] for e in user_client("alice", "alice-pass-123").get("/api/audit").json()]
    for expected in (
        "version.upload",
        "version.validated",
        "version.approve",
        "version.sign",
        "alias.set",
        "api_key.issue",
    ):
        assert expected in actions


def _zip(folder, top: str = "") -> io.BytesIO:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path in sorted(folder.iterdir()):
            zf.write(path, f"{top}{path.name}")
    buf.seek(0)
    buf.name = "adapter.zip"
    return buf


def _tgz(folder, top: str = "") -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for path in sorted(folder.iterdir()):
            tf.add(path, f"{top}{path.name}")
    buf.seek(0)
    buf.name = "adapter.tar.gz"
    return buf


def test_archives_with_or_without_one_top_folder_are_accepted(registry, tenant_a, adapter_files):
    tenant = key_client(tenant_a)
    ids = []
    for n, archive in enumerate([_zip(adapter_files), _tgz(adapter_files, "support-v1/")]):
        response = upload(tenant, "support", [archive], version=f"a.{n}")
        assert response.status_code == 202, response.content
        ids.append(response.json()["id"])
    for version_id in ids:
        body = wait_validated(tenant, version_id)
        assert body["state"] == "pending_review", body["rejection_reason"]
        assert sorted(body["files"]) == ["adapter_config.json", "adapter_model.safetensors"]


def test_version_strings_are_generated_when_omitted(registry, tenant_a, adapter_files):
    tenant = key_client(tenant_a)
    first = upload(tenant, "support", files_of(adapter_files)).json()["version"]
    second = upload(tenant, "support", files_of(adapter_files)).json()["version"]
    assert first.endswith(".1") and second.endswith(".2")
    assert first[:10] == second[:10]
