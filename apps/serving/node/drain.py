"""A node's stop: it leaves the router first, finishes what it has started, then stops.

On SIGTERM (``runnode``'s server calls ``begin``) the node

1. fails readiness: ``/healthz`` answers 503 ``draining``, and the registry row says
   ``draining``, so HAProxy's health checks and Kubernetes' readiness probe take it out of
   rotation;
2. answers new inference requests 503 with ``Retry-After`` (HAProxy retries those on another
   node: ``retry-on ... 503`` in ``apps/fleet/haproxy.py``);
3. lets the requests and streams already under way finish, for at most ``timeout_s``;
4. and only then lets the server close its listener and run the shutdown that stops the engine.

It stays in step 1-2 for at least ``leave_s`` even when nothing is in flight: long enough for
a router that checks every second and takes a node out after two failures to stop sending it
anything, so a request that was already on its way gets a retryable 503, not a refused
connection. Kubernetes' ``preStop`` sleep plays the same part for its Service endpoints.

The in-flight count is kept by an ASGI middleware around the inference routes
(``/v1/*``): a request counts from its first byte in until its last byte out, streams
included. ``/healthz``, ``/metrics`` and ``/internal/*`` keep answering while the node drains.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DRAINING_BODY = json.dumps(
    {
        "error": {
            "message": "this node is shutting down; send the request again (the router "
            "sends it to another node)",
            "type": "service_unavailable",
            "code": "node_draining",
        }
    }
).encode()


class Drain:
    """The node's stop sequence: ``begin`` once, then ``wait`` until it is safe to stop."""

    def __init__(
        self,
        *,
        leave_s: float,
        timeout_s: float,
        retry_after_s: int = 2,
        on_begin: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.leave_s, self.timeout_s = leave_s, timeout_s
        self.retry_after_s = retry_after_s
        self.in_flight = 0
        self.refused = 0  # requests answered 503 while draining
        self.began_at: float | None = None
        self._on_begin = on_begin
        self._clock = clock
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def draining(self) -> bool:
        return self.began_at is not None

    def begin(self) -> None:
        """Start draining (idempotent)."""
        if self.began_at is not None:
            return
        self.began_at = self._clock()
        logger.warning(
            "draining: readiness fails, new requests get 503; %d in flight, waiting up to %.0f s",
            self.in_flight,
            self.timeout_s,
        )
        self._on_begin()

    async def wait(self) -> bool:
        """Wait until the node has been out of rotation ``leave_s`` and nothing is in flight,
        or ``timeout_s`` has passed since ``begin``. True when every request finished."""
        assert self.began_at is not None, "begin() first"
        await asyncio.sleep(max(0.0, self.began_at + self.leave_s - self._clock()))
        remaining = self.began_at + max(self.timeout_s, self.leave_s) - self._clock()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=max(0.0, remaining))
        except TimeoutError:
            logger.error(
                "drain timed out after %.0f s with %d request(s) in flight; stopping anyway",
                self.timeout_s,
                self.in_flight,
            )
            return False
        logger.warning(
            "drained in %.1f s (%d request(s) refused meanwhile)",
            self._clock() - self.began_at,
            self.refused,
        )
        return True

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """Counts inference requests in flight; refuses new ones while draining."""

        async def counted(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
                await app(scope, receive, send)
                return
            if self.draining:
                self.refused += 1
                await _refuse(send, self.retry_after_s)
                return
            self.in_flight += 1
            self._idle.clear()
            try:
                await app(scope, receive, send)
            finally:
                self.in_flight -= 1
                if self.in_flight == 0:
                    self._idle.set()

        return counted


async def _refuse(send: Send, retry_after_s: int) -> None:
    from apps.fleet.node_registry import node_header

    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(DRAINING_BODY)).encode()),
        (b"retry-after", str(retry_after_s).encode()),
        (b"connection", b"close"),
        *((k.lower().encode(), v.encode()) for k, v in node_header().items()),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": DRAINING_BODY})
