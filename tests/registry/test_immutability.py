"""Versions are immutable: never reused, never modified, their storage never overwritten."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from apps.registry import review
from apps.registry.models import AdapterVersion
from apps.registry.signing import sha256_file
from apps.registry.storage import ObjectExists, get_store
from tests.helpers import files_of, key_client, upload, user_client, wait_validated


@pytest.fixture
def approved(registry, tenant_a, reviewer, adapter_files):
    client = key_client(tenant_a)
    version_id = upload(client, "support", files_of(adapter_files), version="1.0").json()["id"]
    assert wait_validated(client, version_id)["state"] == "pending_review"
    rita = user_client("rita", "rita-pass-123")
    assert (
        rita.post(
            f"/api/versions/{version_id}/approve", {}, content_type="application/json"
        ).status_code
        == 200
    )
    return client, AdapterVersion.objects.get(pk=version_id)


def test_the_same_version_string_twice_is_refused(approved, adapter_files):
    client, _ = approved
    response = upload(client, "support", files_of(adapter_files), version="1.0")
    assert response.status_code == 409
    assert "versions are immutable and never reused" in response.json()["detail"]
    assert AdapterVersion.objects.count() == 1


def test_a_rejected_version_string_stays_taken(registry, tenant_a, adapter_files):
    client = key_client(tenant_a)
    (adapter_files / "adapter_config.json").write_text("{")
    version_id = upload(client, "support", files_of(adapter_files), version="2.0").json()["id"]
    assert wait_validated(client, version_id)["state"] == "rejected"
    assert upload(client, "support", files_of(adapter_files), version="2.0").status_code == 409


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("version", "1.1"),
        ("rank", 16),
        ("files", {}),
        ("base_model_revision", "r2"),
        ("storage_prefix", "tenants/tenant-a/adapters/support/evil"),
        ("signature", "AAAA"),
        ("training_data_summary", "something else"),
    ],
)
def test_changing_stored_content_fields_is_refused(approved, field, value):
    _, version = approved
    setattr(version, field, value)
    with pytest.raises(ValidationError, match=f"refused to change {field}"):
        version.save()
    assert getattr(AdapterVersion.objects.get(pk=version.pk), field) != value


def test_lifecycle_fields_may_still_change(approved):
    _, version = approved
    version.review_note = "re-checked"
    version.save()
    assert AdapterVersion.objects.get(pk=version.pk).review_note == "re-checked"


def test_overwriting_a_published_object_is_refused_and_the_bytes_stay(approved, adapter_files):
    _, version = approved
    key = f"{version.storage_prefix}/adapter_model.safetensors"
    with pytest.raises(ObjectExists):
        get_store().put(key, b"other weights")
    stored = get_store().get(key)
    assert stored == (adapter_files / "adapter_model.safetensors").read_bytes()


def test_one_changed_byte_in_a_stored_file_no_longer_matches_the_signed_manifest(
    approved, tmp_path
):
    _, version = approved
    assert review.verify_version(version)
    key = f"{version.storage_prefix}/adapter_model.safetensors"
    path = tmp_path / "w.safetensors"
    get_store().download(key, path)
    assert sha256_file(path) == version.manifest()["files"]["adapter_model.safetensors"]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    assert sha256_file(path) != version.manifest()["files"]["adapter_model.safetensors"]
    # ...and a manifest that claimed the changed file's hash would not verify
    forged = AdapterVersion.objects.get(pk=version.pk)
    forged.files = {
        **forged.files,
        "adapter_model.safetensors": {"sha256": sha256_file(path), "size": len(data)},
    }
    assert not review.verify_version(forged)
