"""What the client raises. Every error carries a message that says what to do; API errors carry
the server's ``code`` and ``detail`` verbatim."""

from __future__ import annotations


class LorahubError(Exception):
    """Anything the client could not do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ApiError(LorahubError):
    """The server answered with an error: ``status``, its ``code`` and ``detail``."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail

    def __str__(self) -> str:
        return f"{self.detail} ({self.status} {self.code})"


class Refused(ApiError):
    """The server refused the request (bad input, not allowed, a conflict): 400-409, 422."""


class Unauthorized(Refused):
    """The API key is missing, wrong or revoked (401)."""


class NotFound(ApiError):
    """No such object that this key can see (404)."""


class Rejected(LorahubError):
    """An uploaded version was rejected by validation; ``reason`` is the server's, verbatim."""

    def __init__(self, version_label: str, reason: str) -> None:
        super().__init__(f"{version_label} was rejected: {reason}")
        self.version_label, self.reason = version_label, reason


class Unavailable(LorahubError):
    """The server could not be reached, or kept answering 429/5xx, after the bounded retries."""


class TimedOut(LorahubError):
    """Waiting for a verdict or a run took longer than the caller allowed."""
