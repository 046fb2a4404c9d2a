"""Approved versions signed in the OpenSSF Model Signing format, so that anyone can check them
with the ``model_signing`` tool and the platform's public key, without lorahub.

The bundle (``model.sig``, a Sigstore bundle holding a DSSE envelope over an in-toto statement
of every file's SHA-256) is stored beside the version's files. Its manifest is built from the
digests validation recorded (``AdapterVersion.files``), the same ones the Ed25519 signature
covers, so signing reads no file again. Nodes keep verifying the Ed25519 signature over the
manifest (``signing.py``): one check on the load path, not two.

Key type: ECDSA P-256 with SHA-256. ``model_signing`` signs and verifies with elliptic-curve
keys on the NIST curves only (P-256, P-384, P-521; its ``_check_supported_ec_key``), not with
Ed25519, so the platform holds a second key for bundles (``LORAHUB_BUNDLE_KEY`` or
``LORAHUB_BUNDLE_KEY_FILE``); P-256 is the smallest and fastest of the three it accepts.
"""

from __future__ import annotations

import contextlib
import pathlib
import tempfile

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from apps.registry.storage import ObjectExists, get_store

BUNDLE_NAME = "model.sig"
PUBLIC_KEY_NAME = "lorahub.pub"


class NoBundleKey(ImproperlyConfigured):
    """No model-signing key has been made yet (a fresh install before ``init_signing_key``)."""


def _private_pem() -> bytes:
    if settings.LORAHUB_BUNDLE_KEY:
        return settings.LORAHUB_BUNDLE_KEY.encode()
    path = bundle_key_file()
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise NoBundleKey(
            f"no model-signing key at {path}: set LORAHUB_BUNDLE_KEY or LORAHUB_BUNDLE_KEY_FILE, "
            "or run `python manage.py init_signing_key`"
        ) from None


def bundle_key_file() -> pathlib.Path:
    """The bundle key's file: LORAHUB_BUNDLE_KEY_FILE, or beside the Ed25519 key's."""
    named = settings.LORAHUB_BUNDLE_KEY_FILE
    if named:
        return pathlib.Path(named)
    return pathlib.Path(settings.LORAHUB_SIGNING_KEY_FILE).with_name("model-signing-key.pem")


def _private_key() -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(_private_pem(), password=None)
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(
            f"the model-signing key is not a PEM private key: {exc}"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise ImproperlyConfigured(
            "the model-signing key must be an ECDSA P-256 key: "
            "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256"
        )
    return key


def generate_private_key_pem() -> bytes:
    return ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def write_new_key(path: pathlib.Path) -> None:
    """Create the bundle key file (mode 0600) if none exists."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(generate_private_key_pem())
        path.chmod(0o600)


def public_key_pem() -> bytes:
    """What ``model_signing verify key --public_key`` takes: the public half, PEM."""
    return (
        _private_key()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def bundle_bytes(label: str, files: dict[str, str]) -> bytes:
    """The Sigstore bundle over ``files`` (name -> SHA-256 hex), signed with the platform's
    key; ``label`` names the model (informative only: verifiers compare the files)."""
    from model_signing import manifest
    from model_signing._hashing.hashing import Digest
    from model_signing._signing import sign_ec_key
    from model_signing._signing.signing import Payload

    items = [
        manifest.FileManifestItem(
            path=pathlib.PurePosixPath(name), digest=Digest("sha256", bytes.fromhex(digest))
        )
        for name, digest in sorted(files.items())
    ]
    # the serialization a plain `model_signing sign key <folder>` records: files, SHA-256,
    # no symbolic links; verifiers hash the folder the same way
    statement = manifest.Manifest(label, items, manifest._FileSerialization("sha256"))
    _private_key()  # a key of the wrong type: our clear error, before the package's
    with tempfile.TemporaryDirectory() as work:  # the signer reads its key from a file
        key_path = pathlib.Path(work) / "key.pem"
        key_path.touch(mode=0o600)
        key_path.write_bytes(_private_pem())
        signature = sign_ec_key.Signer(key_path).sign(Payload(statement))
    return signature.bundle.to_json().encode()


def bundle_key(storage_prefix: str) -> str:
    return f"{storage_prefix}/{BUNDLE_NAME}"


def store_bundle(version) -> str:
    """Sign ``version`` (approved, validated) and store its bundle beside its files; keep a
    bundle already there (keys are written once, and the files it covers cannot change)."""
    key = bundle_key(version.storage_prefix)
    files = {name: meta["sha256"] for name, meta in version.files.items()}
    with contextlib.suppress(ObjectExists):
        get_store().put(key, bundle_bytes(version.label, files))
    return key
