"""A bound on request bodies: a node reads each body whole (it is JSON) before admitting it,
so one caller's 300 MB body must not take the node's memory. Past
``LORAHUB_NODE_MAX_BODY_KB``, 413 in OpenAI's error shape, naming the limit: at once when
``Content-Length`` says so, and as soon as a chunked body passes it."""

from __future__ import annotations

import json

from starlette.types import ASGIApp

from lorahub.body_limit import BodyBound


def _answer(limit: int) -> bytes:
    return json.dumps(
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


class BodyLimit(BodyBound):
    def __init__(self, app: ASGIApp, *, limit_bytes: int) -> None:
        super().__init__(
            app,
            limit_of=lambda scope: limit_bytes,
            answer=lambda scope, limit: (b"application/json", _answer(limit)),
        )
        self.limit = limit_bytes
