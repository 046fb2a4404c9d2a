"""The serving node's ASGI app: the engine's lifecycle and the node's health endpoint.

The engine starts in the background when the app starts, so ``/healthz`` answers at once:
503 while the engine starts (or has died), 200 with the base model, its revision and the LoRA
limits once it is ready. The inference API, the cache manager and the internal control API
mount here as they are built.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from apps.serving.engine import Engine, EngineSettings

logger = logging.getLogger(__name__)


async def _start_engine(engine: Engine) -> None:
    try:
        await asyncio.to_thread(engine.start)
        # The first call from this loop attaches vLLM's output handler to it.
        await engine.list_adapters()
    except Exception:
        logger.exception("the vLLM engine failed to start")


def build_app(engine_settings: EngineSettings | None = None) -> Starlette:
    engine = Engine(engine_settings or EngineSettings.from_django_settings())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(_start_engine(engine))
        try:
            yield
        finally:
            task.cancel()
            # On the loop's thread, so vLLM cancels its output handler before the core exits.
            engine.shutdown()

    async def healthz(request: Request) -> JSONResponse:
        info = engine.info()
        body = {
            "status": "ok" if engine.is_ready else info.state,
            "engine": info.state if not engine.is_ready else "ready",
            "base_model": info.served_model_name,
            "base_model_revision": info.base_model_revision,
            "lora": {
                "max_loras": info.max_loras,
                "max_cpu_loras": info.max_cpu_loras,
                "max_lora_rank": info.max_lora_rank,
            },
            "dtype": info.dtype,
            "engine_startup_s": round(info.started_s, 1) if info.started_s else None,
        }
        if engine.is_ready:
            return JSONResponse(body)
        return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})

    app = Starlette(routes=[Route("/healthz", healthz)], lifespan=lifespan)
    app.state.engine = engine
    return app
