"""Streaming an answer: its server-sent events, and an async iterator over an already-started
generator (so the stream's ``finally`` runs even if the client vanishes before the first byte)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from typing import Generic, TypeVar

from apps.serving.node import openai_protocol as oai
from apps.serving.node.engine import EngineDied, Generation
from apps.serving.node.errors import error_in_event
from apps.serving.node.record import RequestTrace

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Started(Generic[T]):
    """An async iterator over ``first`` and then ``rest`` (a generator already started, so
    that its ``finally`` runs even if the client vanishes before the first byte). A class, not
    one more generator: it adds no frame per event to the stream."""

    def __init__(self, first: T, rest: AsyncGenerator[T, None]) -> None:
        self._first: T | None = first
        self._rest = rest

    def __aiter__(self) -> Started[T]:
        return self

    async def __anext__(self) -> T:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await self._rest.__anext__()

    async def aclose(self) -> None:
        await self._rest.aclose()


async def sse(
    first_event: str,
    events: AsyncGenerator[str, None],
    trace: RequestTrace,
    generation: Generation,
    holding: contextlib.AsyncExitStack,
    *,
    finish: Callable[[int], None],
) -> AsyncGenerator[bytes, None]:
    """The events of a streamed answer; ``holding`` (the request's slot, place and
    adapter) is given back when the stream ends, however it ends."""
    status = 200
    try:
        yield first_event.encode()
        async for event in events:
            if trace.ttft_ms is None and generation.first_token_s is not None:
                trace.ttft_ms = (generation.first_token_s - trace.started) * 1000
            if generation.died and error_in_event(event) is not None:
                raise EngineDied("the engine core exited")
            yield event.encode()
    except asyncio.CancelledError:
        status = 499  # the client went away; closing `events` aborts the request in vLLM
        raise
    except EngineDied:
        status = 503
        logger.error("the engine died during a streamed generation")
        yield oai.sse(
            oai.ApiError(
                503,
                "the engine stopped during this generation and is restarting; "
                "send the request again in a few seconds",
                type_="server_error",
                code="engine_restarting",
            ).body()
        )
    except Exception:
        status = 500
        logger.exception("streamed generation failed")
        yield oai.sse(oai.ApiError(500, "generation failed", type_="server_error").body())
    finally:
        await events.aclose()
        await holding.aclose()
        finish(status)
