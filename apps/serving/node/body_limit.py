"""A bound on request bodies: a node reads each body whole (it is JSON) before admitting it,
so one caller's 300 MB body must not take the node's memory. Past
``LORAHUB_NODE_MAX_BODY_KB``, 413 in OpenAI's error shape, naming the limit: at once when
``Content-Length`` says so, and as soon as a chunked body passes it."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(Exception):
    pass


def _answer(limit: int) -> tuple[dict, bytes]:
    body = json.dumps(
        {
            "error": {
                "message": f"the request body is over this node's limit of {limit // 1024} KiB "
                "(LORAHUB_NODE_MAX_BODY_KB): send a shorter prompt or fewer messages",
                "type": "invalid_request_error",
                "code": "body_too_large",
                "param": None,
            }
        }
    ).encode()
    start = {
        "type": "http.response.start",
        "status": 413,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ],
    }
    return start, body


class BodyLimit:
    def __init__(self, app: ASGIApp, *, limit_bytes: int) -> None:
        self.app, self.limit = app, limit_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._refuse(send)
                return
        seen = 0
        started = False

        async def bounded_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
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
                await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        start, body = _answer(self.limit)
        await send(start)
        await send({"type": "http.response.body", "body": body})
