"""Helpers for tests that drive the registry: API clients, uploads, adapter edits."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

from django.test import Client

from apps.registry import services
from apps.registry.validation import CONFIG_NAME, WEIGHTS_NAME
from apps.tenants import services as tenant_services


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
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(f"/api/versions/{version_id}").json()
        if body["state"] != "validating":
            return body
        time.sleep(0.1)
    raise AssertionError(f"version {version_id} still validating after {timeout}s")


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
    services.approve_version(version_id=row.pk, principal=principal_for_user(reviewer_user))
    return row.pk
