"""Ed25519 signing of adapter-version manifests. The only user of ``cryptography``.

Pure functions, no ORM. A manifest is a JSON object that names the adapter version and every
file's sha256; it is serialised canonically (sorted keys, no spaces, UTF-8) so that signer and
verifier hash the very same bytes. The control plane holds the private key; serving nodes hold
only public keys, by key id (the first 16 hex digits of the sha256 of the raw public key).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey


class SigningError(Exception):
    """A key could not be loaded or a signature could not be made."""


def canonical_json(manifest: Mapping[str, Any]) -> bytes:
    return json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(manifest)).hexdigest()


def generate_private_key_pem() -> bytes:
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_private_key(pem: bytes) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise SigningError(f"the signing key is not a PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError("the signing key must be an Ed25519 key")
    return key


def public_key_b64(private_key: Ed25519PrivateKey) -> str:
    raw = private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return base64.b64encode(raw).decode()


def key_id(public_b64: str) -> str:
    return hashlib.sha256(base64.b64decode(public_b64)).hexdigest()[:16]


def sign_manifest(private_key: Ed25519PrivateKey, manifest: Mapping[str, Any]) -> str:
    """Base64 Ed25519 signature over the canonical JSON of ``manifest``."""
    return base64.b64encode(private_key.sign(canonical_json(manifest))).decode()


def verify_manifest(
    public_keys: Mapping[str, str], signing_key_id: str, manifest: Mapping[str, Any], signature: str
) -> bool:
    """True only if ``signature`` is valid for ``manifest`` under the named public key."""
    public_b64 = public_keys.get(signing_key_id)
    if public_b64 is None:
        return False
    try:
        public = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_b64))
        public.verify(base64.b64decode(signature, validate=True), canonical_json(manifest))
    except (InvalidSignature, ValueError):
        return False
    return True


def sha256_file(path: Path) -> str:
    """A file's SHA-256, as its manifest lists it."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()
