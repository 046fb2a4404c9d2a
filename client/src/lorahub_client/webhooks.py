"""Checking lorahub's webhook calls in a receiver.

    from lorahub_client.webhooks import verify, SignatureError

    event = verify(secret, request.headers, request.body)  # the parsed JSON, or SignatureError

``verify`` recomputes ``X-Lorahub-Signature`` (HMAC-SHA256 of ``"<timestamp>.<body>"`` with the
webhook's secret), compares it in constant time and refuses a timestamp outside the replay
window. Deduplicate on ``X-Lorahub-Delivery`` (or the body's ``id``): a delivery is retried
until the receiver answers 2xx, so the same one may arrive twice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

REPLAY_WINDOW_S = 300


class SignatureError(ValueError):
    """The call is not lorahub's, was altered, or is too old to trust."""


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    raise SignatureError(f"the {name} header is missing")


def verify(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    window_s: int = REPLAY_WINDOW_S,
    now: float | None = None,
) -> dict[str, Any]:
    timestamp = _header(headers, "X-Lorahub-Timestamp")
    signature = _header(headers, "X-Lorahub-Signature")
    try:
        sent = int(timestamp)
    except ValueError:
        raise SignatureError(f"X-Lorahub-Timestamp {timestamp!r} is not Unix seconds") from None
    if abs((now if now is not None else time.time()) - sent) > window_s:
        raise SignatureError(f"the call was signed {timestamp}, outside the {window_s} s window")
    expected = (
        "sha256="
        + hmac.new(secret.encode(), f"{sent}.".encode() + body, hashlib.sha256).hexdigest()
    )
    if not hmac.compare_digest(expected, signature):
        raise SignatureError("the signature does not match this body and the webhook's secret")
    return json.loads(body)
