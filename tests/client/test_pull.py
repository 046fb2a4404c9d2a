"""``lorahub pull`` and the OpenSSF model-signing bundle, as a user outside the platform checks
a version: pull it with its ``model.sig``, fetch the public key from its documented URL (no
key needed), and run the ``model_signing`` tool itself. A changed byte fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from lorahub_client.models import Version

from apps.registry import bundles
from apps.registry.models import AdapterVersion
from apps.registry.storage import get_store
from apps.tenants import services as tenant_services
from tests.helpers import key_client, pending_version


def model_signing_verify(folder: Path, public_key: Path) -> subprocess.CompletedProcess:
    """The tool's own command line, as docs/security.md gives it."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "model_signing", "verify", "key"),
            *("--signature", str(folder / "model.sig")),
            *("--public_key", str(public_key), str(folder)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_pulled_version_verifies_with_the_openssf_tool_and_a_changed_byte_fails(
    published, lorahub, tenant_key, tenant_a, live_server, tmp_path
):
    v2 = AdapterVersion.objects.get(pk=published["v2"])
    # approving stored the bundle beside the files
    assert get_store().exists(bundles.bundle_key(v2.storage_prefix))

    pulled = lorahub(
        "pull", "tenant-a/support@v2", "--to", str(tmp_path / "v2"), "--json", key=tenant_key
    )
    assert pulled.exit_code == 0, pulled.stderr
    assert Version.model_validate(pulled.json()["version"]).id == v2.id
    folder = tmp_path / "v2"
    assert sorted(p.name for p in folder.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "model.sig",
    ]
    # the public key at its documented URL, without any credential
    answer = httpx.get(f"{live_server.url}/api/signing-keys/lorahub.pub")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/x-pem-file"
    public_key = tmp_path / "lorahub.pub"
    public_key.write_bytes(answer.content)

    checked = model_signing_verify(folder, public_key)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Verification succeeded" in checked.stdout

    weights = folder / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    tampered = model_signing_verify(folder, public_key)
    assert tampered.returncode != 0
    assert "adapter_model.safetensors" in tampered.stdout + tampered.stderr


def test_pull_takes_what_the_alias_serves_and_refuses_what_it_must_not_write(
    published, lorahub, tenant_key, tenant_a, tenant_b, tmp_path
):
    key_client(tenant_a).put(
        "/api/aliases/support", {"version_id": published["v1"]}, content_type="application/json"
    )
    served = lorahub("pull", "tenant-a/support", "--to", str(tmp_path / "live"), key=tenant_key)
    assert served.exit_code == 0, served.stderr
    assert "pulled support@v1" in served.stderr
    v1 = AdapterVersion.objects.get(pk=published["v1"])
    assert (tmp_path / "live" / "adapter_model.safetensors").stat().st_size == (
        v1.files["adapter_model.safetensors"]["size"]
    )

    # a folder in use is left as it was
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    refused = lorahub("pull", "tenant-a/support@v2", "--to", str(busy), key=tenant_key)
    assert refused.exit_code == 2
    assert "is not empty" in refused.stderr
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]

    # another tenant's key sees no such version; a version under review cannot be pulled
    _, b_key = tenant_services.issue_api_key(tenant=tenant_b, name="b", actor=None)
    other = lorahub("pull", "tenant-a/support@v2", "--to", str(tmp_path / "b"), key=b_key)
    assert other.exit_code == 4
    assert not (tmp_path / "b").exists()
    pending_version(tenant_a, "support", "v9")
    waiting = lorahub("pull", "support@v9", "--to", str(tmp_path / "v9"), key=tenant_key)
    assert waiting.exit_code == 3
    assert "only approved, signed versions can be pulled" in waiting.stderr
    assert not (tmp_path / "v9").exists()


def test_a_file_name_the_version_does_not_list_never_reaches_the_store(
    published, tenant_a, monkeypatch
):
    asked: list[str] = []
    store = get_store()
    original = store.download
    monkeypatch.setattr(
        store, "download", lambda key, dest: asked.append(key) or original(key, dest)
    )
    control = key_client(tenant_a)
    for name in ("..%2F..%2Fv1%2Fadapter_model.safetensors", "%2e%2e", "index.json", "README.md"):
        answer = control.get(f"/api/versions/{published['v2']}/files/{name}")
        assert answer.status_code == 404, (name, answer.content)
    listed = control.get(f"/api/versions/{published['v2']}/files/index.json").json()["detail"]
    assert listed == (
        "version support@v2 has no file 'index.json'; it has adapter_config.json, "
        "adapter_model.safetensors, model.sig"
    )
    assert asked == []
