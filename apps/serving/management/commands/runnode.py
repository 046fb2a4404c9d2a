from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run the serving node: the vLLM engine and the node's HTTP API (one process)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=settings.LORAHUB_NODE_HOST)
        parser.add_argument("--port", type=int, default=settings.LORAHUB_NODE_PORT)

    def handle(self, *args, host: str, port: int, **options) -> None:
        import uvicorn

        from apps.serving.node.assembly import build_app

        # The node registers the address it listens on (unless LORAHUB_NODE_URL says otherwise).
        settings.LORAHUB_NODE_HOST, settings.LORAHUB_NODE_PORT = host, port
        # One worker: the engine lives in this process. uvicorn drains in-flight requests on
        # SIGTERM before the lifespan shuts the engine down.
        uvicorn.run(
            build_app(),
            host=host,
            port=port,
            workers=1,
            log_level="info",
            timeout_graceful_shutdown=30,
            # the client address behind HAProxy (its X-Forwarded-For), for the bad-key throttle
            proxy_headers=True,
            forwarded_allow_ips=settings.LORAHUB_NODE_TRUSTED_PROXIES,
        )
