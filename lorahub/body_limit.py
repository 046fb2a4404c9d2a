"""The console's bounds on request bodies, enforced where the body arrives.

Django's ASGI handler reads the whole body into a temporary file before any middleware runs,
so a limit checked by middleware comes after the bytes are on disk: an anonymous multi-GB
POST would fill it. ``BodyLimit`` wraps the ASGI application and refuses with 413, naming the
limit, before Django reads anything: at once when ``Content-Length`` is over it, and as soon
as the bytes counted as they arrive pass it (a chunked body). Two bounds:

- uploads (``multipart/form-data`` to an upload endpoint, with credentials):
  ``LORAHUB_MAX_UPLOAD_MB`` plus room for the form's framing; the tenant's quota and the
  per-file rules follow in the view;
- every other body (forms, JSON, multipart elsewhere or without credentials):
  ``LORAHUB_MAX_BODY_KB``.

``BodyLimitMiddleware`` keeps the same rule for a server that runs the WSGI application.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

# the endpoints that take files: a version's upload, an evaluation set's
UPLOAD_PATHS = re.compile(r"^/api/adapters/[^/]+/(versions|evaluation-sets/[^/]+)/?$")
FRAMING_BYTES = 1 << 20  # multipart boundaries and the form's small fields

Scope = dict[str, Any]
Message = dict[str, Any]


class BodyTooLarge(Exception):
    pass


def _header(scope: Scope, name: bytes) -> bytes:
    for key, value in scope.get("headers", []):
        if key == name:
            return value
    return b""


def _has_credentials(scope: Scope) -> bool:
    cookie = _header(scope, b"cookie")
    return bool(_header(scope, b"authorization")) or settings.SESSION_COOKIE_NAME.encode() in cookie


def limit_for(scope: Scope) -> tuple[int, str]:
    """The bound on this request's body, and the setting that sets it."""
    multipart = _header(scope, b"content-type").lower().startswith(b"multipart/form-data")
    if multipart and UPLOAD_PATHS.match(scope.get("path", "")) and _has_credentials(scope):
        return settings.LORAHUB_MAX_UPLOAD_MB * 1024 * 1024 + FRAMING_BYTES, "LORAHUB_MAX_UPLOAD_MB"
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE, "LORAHUB_MAX_BODY_KB"


def refusal(path: str, limit: int, setting: str) -> tuple[bytes, bytes]:
    """The 413's content type and body: the API's error shape under /api/, text elsewhere."""
    if setting == "LORAHUB_MAX_UPLOAD_MB":
        message = (
            f"the upload is over the console's limit of {settings.LORAHUB_MAX_UPLOAD_MB} MiB "
            "(LORAHUB_MAX_UPLOAD_MB); upload fewer or smaller files"
        )
    else:
        message = (
            f"the request body is over the console's limit of {limit // 1024} KiB "
            "(LORAHUB_MAX_BODY_KB); files go in an upload (multipart/form-data to an upload "
            "endpoint, with your key)"
        )
    if path.startswith("/api/"):
        return b"application/json", json.dumps(
            {"code": "body_too_large", "detail": message}
        ).encode()
    return b"text/plain; charset=utf-8", (message + "\n").encode()


class BodyBound:
    """ASGI middleware: a request whose body is over ``limit_of(scope)`` bytes gets
    ``answer(scope, limit)`` (content type, body) with 413 — from ``Content-Length`` before
    the application runs, or as soon as the bytes counted as they arrive pass it, before the
    application has read them. The console's (``BodyLimit``) and a node's
    (``apps/serving/node/body_limit.py``) bounds are this, with their own limits and words."""

    def __init__(
        self,
        app: Callable[..., Any],
        *,
        limit_of: Callable[[Scope], int],
        answer: Callable[[Scope, int], tuple[bytes, bytes]],
    ) -> None:
        self.app, self.limit_of, self.answer = app, limit_of, answer

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_of(scope)
        length = _header(scope, b"content-length")
        if length.isdigit() and int(length) > limit:
            await self._refuse(scope, send, limit)
            return
        seen = 0
        started = False

        async def bounded_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, bounded_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(scope, send, limit)

    async def _refuse(self, scope: Scope, send: Callable, limit: int) -> None:
        content_type, body = self.answer(scope, limit)
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", content_type),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class BodyLimit(BodyBound):
    """The console's bounds (``limit_for``), before Django reads a byte."""

    def __init__(self, app: Callable[..., Any]) -> None:
        super().__init__(
            app,
            limit_of=lambda scope: limit_for(scope)[0],
            answer=lambda scope, limit: refusal(scope.get("path", ""), *limit_for(scope)),
        )


class BodyLimitMiddleware:
    """The same bounds from ``Content-Length`` for the WSGI application and Django's test
    client (which skip the ASGI layer)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        scope = {
            "path": request.path,
            "headers": [
                (b"content-type", request.META.get("CONTENT_TYPE", "").encode()),
                (b"authorization", request.META.get("HTTP_AUTHORIZATION", "").encode()),
                (b"cookie", request.META.get("HTTP_COOKIE", "").encode()),
            ],
        }
        limit, setting = limit_for(scope)
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > limit:
            content_type, body = refusal(request.path, limit, setting)
            if request.path.startswith("/api/"):
                return JsonResponse(json.loads(body), status=413)
            return HttpResponse(body, status=413, content_type=content_type.decode())
        return self.get_response(request)
