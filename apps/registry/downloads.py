"""What ``lorahub pull`` downloads: an approved version's files and its model-signing bundle,
and the public key that checks the bundle. A caller names a file; only names the version's
own file list holds (or the bundle's) reach the store."""

from __future__ import annotations

import tempfile
from pathlib import Path

from django.http import FileResponse, HttpResponse

from apps.registry import bundles
from apps.registry.models import AdapterVersion
from apps.registry.storage import ObjectMissing, get_store
from apps.tenants.errors import Conflict, NotFound


def version_file(version: AdapterVersion, name: str) -> FileResponse:
    if not version.is_servable:
        raise Conflict(
            f"version {version.label} is {version.state.replace('_', ' ')}; only approved, "
            "signed versions can be pulled"
        )
    if name != bundles.BUNDLE_NAME and name not in version.files:
        listed = ", ".join(sorted([*version.files, bundles.BUNDLE_NAME]))
        raise NotFound(f"version {version.label} has no file '{name}'; it has {listed}")
    key = f"{version.storage_prefix}/{name}"
    store = get_store()
    if name == bundles.BUNDLE_NAME and not store.exists(key):
        bundles.store_bundle(version)  # approved before bundles existed: sign it now
    # land it on disk (a large file never sits in memory), open it, and unlink it: the open
    # handle keeps the bytes until the answer is sent
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "file"
        try:
            store.download(key, path)
        except ObjectMissing:
            raise NotFound(
                f"version {version.label}'s file '{name}' is missing from the object store; "
                "tell an operator"
            ) from None
        handle = path.open("rb")
    return FileResponse(
        handle,
        as_attachment=True,
        filename=name,
        content_type="application/octet-stream",
    )


def public_key() -> HttpResponse:
    try:
        pem = bundles.public_key_pem()
    except bundles.NoBundleKey:  # a key that is there but wrong stays a server error
        raise NotFound(
            "this control plane has no model-signing key yet; an operator creates it with "
            "`python manage.py init_signing_key`"
        ) from None
    response = HttpResponse(pem, content_type="application/x-pem-file")
    response["Content-Disposition"] = f'inline; filename="{bundles.PUBLIC_KEY_NAME}"'
    return response
