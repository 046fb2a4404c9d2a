"""Secrets the platform must keep and use again, sealed at rest: TOTP keys and webhook signing
secrets (encrypted with ``cryptography``'s MultiFernet), and recovery codes (kept as keyed
digests only). The keys come from the environment (``LORAHUB_FIELD_KEYS``, comma-separated
Fernet keys: the first seals, every one opens), so a copy of the database, or a serving node
that reads it, learns none of them.

Rotation: put a new key first, run ``manage.py rotate_field_keys`` (every sealed value is
sealed again with it), then drop the old key. Recovery codes cannot be re-derived (only their
digests are kept): they are checked against every listed key, so a user whose codes were made
under a dropped key makes new ones.
"""

from __future__ import annotations

import functools
import hashlib
import hmac

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

PREFIX = "fernet:"


@functools.cache
def _keys(keys: tuple[str, ...]) -> MultiFernet:
    try:
        return MultiFernet([Fernet(key) for key in keys])
    except (ValueError, TypeError):
        raise ImproperlyConfigured(
            "LORAHUB_FIELD_KEYS: each key is 32 url-safe base64-encoded bytes, e.g. "
            "python3 -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key()"
            ".decode())'"
        ) from None


def _fernet() -> MultiFernet:
    if not settings.LORAHUB_FIELD_KEYS:
        raise ImproperlyConfigured("LORAHUB_FIELD_KEYS is not set: this process opens no secret")
    return _keys(tuple(settings.LORAHUB_FIELD_KEYS))


def seal(plaintext: str) -> str:
    return PREFIX + _fernet().encrypt(plaintext.encode()).decode()


def is_sealed(value: str) -> bool:
    return value.startswith(PREFIX)


def unseal(value: str) -> str:
    if not is_sealed(value):
        raise ValueError("the value is not sealed (run the migrations)")
    try:
        return _fernet().decrypt(value[len(PREFIX) :].encode()).decode()
    except InvalidToken:
        raise ImproperlyConfigured(
            "a sealed secret opens with none of LORAHUB_FIELD_KEYS: the key it was sealed "
            "with was removed before `manage.py rotate_field_keys` ran; put it back"
        ) from None


def reseal(value: str) -> str:
    """The same secret sealed with the first key (``MultiFernet.rotate``)."""
    return PREFIX + _fernet().rotate(value[len(PREFIX) :].encode()).decode()


def _normalized(code: str) -> bytes:
    return code.replace(" ", "").replace("-", "").lower().encode()


def code_digests(code: str) -> list[str]:
    """The stored forms of a recovery code: one per key, the first key's first (16 hex
    characters, the width of django-otp's token column: 64 bits of a keyed HMAC)."""
    return [
        hmac.new(key.encode(), b"recovery-code:" + _normalized(code), hashlib.sha256).hexdigest()[
            :16
        ]
        for key in settings.LORAHUB_FIELD_KEYS
    ]
