"""Domain errors, mapped to HTTP status in one handler (``lorahub/api.py``).

Messages are read by people: say what was wrong and what to do about it.
"""

from __future__ import annotations


class DomainError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Invalid(DomainError):
    status = 422
    code = "invalid"


class NotFound(DomainError):
    status = 404
    code = "not_found"


class Forbidden(DomainError):
    status = 403
    code = "forbidden"


class KeyExpired(DomainError):
    """An API key past its expiry: refused like a revoked key, with a reason to act on."""

    status = 401
    code = "key_expired"


class SecondFactorRequired(Forbidden):
    """A reviewer's or operator's action that needs a second factor in the session."""

    code = "second_factor_required"


class Conflict(DomainError):
    status = 409
    code = "conflict"


class QuotaExceeded(DomainError):
    status = 429
    code = "quota_exceeded"


class Throttled(DomainError):
    """Too many bad API keys from one address; ``retry_after`` seconds until it may try again."""

    status = 429
    code = "too_many_bad_keys"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TooLarge(DomainError):
    status = 413
    code = "too_large"
