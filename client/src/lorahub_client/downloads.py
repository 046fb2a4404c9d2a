"""Downloads: an approved version's files and its OpenSSF model-signing bundle, each file
checked against the registry's SHA-256, into a new folder; names the server sends are checked
before any byte is written."""

from __future__ import annotations

import shutil
from pathlib import Path

from lorahub_client.errors import LorahubError
from lorahub_client.models import Version
from lorahub_client.transport import Transport

# What the client downloads (not JSON): an approved version's files and its OpenSSF
# model-signing bundle, and the public key that checks bundles. The schema-agreement test
# checks that the server documents each.
DOWNLOADS: dict[str, tuple[str, str]] = {
    "version_file": ("GET", "/api/versions/{version_id}/files/{name}"),
    "public_key": ("GET", "/api/signing-keys/lorahub.pub"),
    "usage_csv": ("GET", "/api/usage.csv"),
}
BUNDLE_NAME = "model.sig"


def check_file_name(name: str, label: str) -> str:
    """``name`` if it is a plain file name that stays inside the folder it is written to; a
    ``LorahubError`` for anything else (a path, ``..``, an absolute or Windows path, a control
    character), which only a broken or hostile server sends."""
    bad = (
        not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or ":" in name
        or any(ord(c) < 32 for c in name)
        or name == BUNDLE_NAME
    )
    if bad:
        raise LorahubError(
            f"the server lists a file {name!r} for {label!r}, which is not a plain file name; "
            "nothing was written (report this to the platform's operators)"
        )
    return name


def pull(transport: Transport, version: Version, folder: Path) -> list[str]:
    """Download ``version``'s files and its bundle (``model.sig``) into ``folder`` (new),
    each file checked against the SHA-256 the registry lists; the names written. A file
    that does not match leaves no folder behind. The names come from the server: one that
    would land outside ``folder`` is refused before any byte is written."""
    if folder.exists() and any(folder.iterdir()):
        raise LorahubError(f"{folder} exists and is not empty; name a new folder with --to")
    for name in version.files:
        check_file_name(name, version.label)
    landing = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(landing, ignore_errors=True)
    landing.mkdir(parents=True)
    try:
        for name in [*sorted(version.files), BUNDLE_NAME]:
            where = {"version_id": version.id, "name": name}
            method, template = DOWNLOADS["version_file"]
            got = transport.download(method, template.format(**where), landing / name)
            wanted = version.files[name].sha256 if name in version.files else got
            if got != wanted:
                raise LorahubError(
                    f"{version.label}'s {name} arrived with SHA-256 {got}, not the "
                    f"registry's {wanted}; nothing was kept, pull again"
                )
        folder.mkdir(parents=True, exist_ok=True)
        for item in landing.iterdir():
            item.rename(folder / item.name)
    finally:
        shutil.rmtree(landing, ignore_errors=True)
    return [*sorted(version.files), BUNDLE_NAME]
