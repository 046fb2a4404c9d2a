"""Shared secrets the platform's own parts present to each other (the internal token), and
the start-up rule for every secret setting.

``bearer_matches`` compares in constant time on bytes: ``hmac.compare_digest`` raises on a
``str`` with non-ASCII characters, which a caller may put in a header, and that must be a
plain "no", never a 500.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

# values copied from examples and templates; a secret that equals one of these (or contains
# "replace") was never set
PLACEHOLDERS = {
    "changeme",
    "change-me",
    "secret",
    "password",
    "replace-me",
    "example",
    "lorahub",
    "token",
    "xxx",
}


def bearer_matches(header: str, expected: str) -> bool:
    """True if ``header`` is ``Bearer <expected>``; never true when nothing is expected."""
    scheme, _, given = header.partition(" ")
    if not expected or scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(
        given.strip().encode("utf-8", "surrogateescape"), expected.encode("utf-8")
    )


def check_secret(name: str, value: str, *, min_length: int = 16) -> None:
    """Refuse, naming the variable, a secret that is a known placeholder or too short."""
    if not value:
        return
    lowered = value.strip().lower()
    if lowered in PLACEHOLDERS or "replace" in lowered or "example" in lowered:
        raise ImproperlyConfigured(
            f"{name} is still a placeholder ({value[:12]!r}…): set a random value, e.g. "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    if len(value) < min_length or len(set(value)) < 5:
        raise ImproperlyConfigured(
            f"{name} is too short or too simple: use {min_length} or more random characters, "
            "e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )


def url_password(url: str) -> str:
    """The password in a service URL (``postgres://user:PASSWORD@host/db``), or ""."""
    try:
        return urlsplit(url).password or ""
    except ValueError:
        return ""
