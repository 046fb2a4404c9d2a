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


def register_current_key() -> str:
    """Publish the current key's public half (idempotent); return its key id."""
    from apps.registry.models import SigningKey

    public = signing.public_key_b64(private_key())
    key_id = signing.key_id(public)
    SigningKey.objects.get_or_create(key_id=key_id, defaults={"public_key": public})
    return key_id


def published_public_keys() -> dict[str, str]:
    """key id -> base64 raw Ed25519 public key: every key the platform has signed with, plus
    retired keys named in settings. Needs no private key, so serving nodes can call it."""
    from apps.registry.models import SigningKey

    keys = dict(SigningKey.objects.order_by("-created_at").values_list("key_id", "public_key"))
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
