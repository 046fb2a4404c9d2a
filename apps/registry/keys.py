"""The platform's signing key and the public keys it publishes, read from settings."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from apps.registry import signing


def _private_pem() -> bytes:
    if settings.LORAHUB_SIGNING_KEY:
        return settings.LORAHUB_SIGNING_KEY.encode()
    path = settings.LORAHUB_SIGNING_KEY_FILE
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ImproperlyConfigured(
            f"no signing key at {path}: set LORAHUB_SIGNING_KEY or LORAHUB_SIGNING_KEY_FILE, "
            "or run `python manage.py init_signing_key`"
        ) from None


def private_key():
    return signing.load_private_key(_private_pem())


def current_key_id() -> str:
    return signing.key_id(signing.public_key_b64(private_key()))


def published_public_keys() -> dict[str, str]:
    """key id -> base64 raw Ed25519 public key, the current key first."""
    current = signing.public_key_b64(private_key())
    keys = {signing.key_id(current): current}
    for retired in settings.LORAHUB_RETIRED_PUBLIC_KEYS:
        keys.setdefault(signing.key_id(retired), retired)
    return keys


def write_new_private_key(path) -> str:
    """Create a private key file (mode 0600) if none exists; return its key id."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(signing.generate_private_key_pem())
        path.chmod(0o600)
    key = signing.load_private_key(path.read_bytes())
    return signing.key_id(signing.public_key_b64(key))
