from __future__ import annotations

import asyncio
import signal

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand

from apps.serving.node.drain import Drain


class Command(BaseCommand):
    help = (
        "Run the serving node: the vLLM engine and the node's HTTP API (one process). "
        "SIGTERM drains it (out of rotation, new requests 503, in-flight ones finish) before "
        "the engine stops; a second SIGTERM or Ctrl-C stops it at once."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=settings.LORAHUB_NODE_HOST)
        parser.add_argument("--port", type=int, default=settings.LORAHUB_NODE_PORT)

    def handle(self, *args, host: str, port: int, **options) -> None:
        from apps.serving.node import lifeline
        from apps.serving.node.assembly import build_app

        # The node registers the address it listens on (unless LORAHUB_NODE_URL says otherwise).
        settings.LORAHUB_NODE_HOST, settings.LORAHUB_NODE_PORT = host, port
        # What the engine leaves behind when it dies is the node's to end (lifeline.py).
        lifeline.become_subreaper()
        app = build_app()
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            workers=1,  # the engine lives in this process
            log_level="info",
            # the drain has already waited for the node's requests; this bounds what is left
            timeout_graceful_shutdown=10,
            # the caller behind HAProxy is read by lorahub/addresses.py (trusted proxies only)
            proxy_headers=False,
        )
        DrainingServer(config, app.state.node.drain).run()


class DrainingServer(uvicorn.Server):
    """uvicorn's server, whose first SIGTERM drains the node (``drain.py``) before uvicorn
    stops listening and runs the shutdown that stops the engine. SIGINT (Ctrl-C) and a second
    SIGTERM stop at once, as uvicorn does."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self.loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    async def startup(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig, frame) -> None:
        if sig != signal.SIGTERM or self.drain.draining or self.loop is None or not self.started:
            super().handle_exit(sig, frame)
            return
        # a signal handler: hand the drain to the event loop
        self.loop.call_soon_threadsafe(self._begin_drain)

    def _begin_drain(self) -> None:
        self.drain.begin()
        self._drain_task = asyncio.ensure_future(self._stop_when_drained())

    async def _stop_when_drained(self) -> None:
        await self.drain.wait()
        self.should_exit = True
