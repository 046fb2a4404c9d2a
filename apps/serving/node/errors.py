"""What a caller is told when a request fails: one table from the node's exceptions (the
cache's, the engine's, the database's) to the OpenAI-shaped error it answers with."""

from __future__ import annotations

import json
import logging

from django.db import DatabaseError

from apps.serving.cache.landing import AdapterIntegrityError, DiskFull
from apps.serving.cache.manager import LoadDeadline, LoadQueueFull
from apps.serving.node import openai_protocol as oai
from apps.serving.node.engine import EngineNotReady, EngineRefused

logger = logging.getLogger(__name__)


def engine_unavailable(why: object) -> oai.ApiError:
    return oai.ApiError(
        503,
        f"the engine is not ready ({why}); retry shortly",
        type_="overloaded_error",
        code="engine_unavailable",
        retry_after=5,
    )


def control_plane_unavailable() -> oai.ApiError:
    """The database is needed (a key or alias this node has not cached) and does not answer:
    what is cached keeps serving, this request may be sent again."""
    return oai.ApiError(
        503,
        "the node cannot reach the control plane's database to look up this key or model; "
        "requests it already knows keep working; retry shortly",
        type_="overloaded_error",
        code="control_plane_unavailable",
        retry_after=2,
    )


def error_in_event(event: str) -> oai.ApiError | None:
    """The error in a server-sent event from vLLM's serving layer, if it is one."""
    if not event.startswith('data: {"error"'):
        return None
    try:
        error = json.loads(event[len("data: ") :])["error"]
        status = int(error.get("code") or 400)
        message = str(error.get("message") or "the request was refused")
    except (ValueError, KeyError, TypeError, AttributeError):
        return oai.ApiError(500, "generation failed", type_="server_error")
    if status >= 500:
        return oai.ApiError(500, message, type_="server_error", code="internal_error")
    return oai.ApiError(status, message, code="invalid_request")


def api_error(exc: BaseException, *, label: str = "", engine_ready: bool = True) -> oai.ApiError:
    """The answer for ``exc``, raised while serving ``label`` (a version)."""
    if isinstance(exc, oai.ApiError):
        return exc
    if isinstance(exc, EngineNotReady):
        return engine_unavailable(exc)
    if isinstance(exc, DatabaseError):
        return control_plane_unavailable()
    if isinstance(exc, EngineRefused):  # vLLM refused the request: its message says why
        status = exc.status if exc.status < 500 else 400
        return oai.ApiError(status, str(exc), code="invalid_request")
    if isinstance(exc, (LoadQueueFull, LoadDeadline)):
        full = isinstance(exc, LoadQueueFull)
        return oai.ApiError(
            503,
            f"{label} is not loaded yet and "
            + ("the load queue is full" if full else f"{exc}")
            + "; retry shortly",
            type_="overloaded_error",
            code="load_queue_full" if full else "load_deadline",
            retry_after=1 if full else 2,
        )
    if isinstance(exc, DiskFull):
        logger.error("could not land %s: %s", label, exc)
        return oai.ApiError(
            503,
            f"{label} cannot be loaded: this node's disk cache is full; an operator has been "
            "alerted; retry later",
            type_="overloaded_error",
            code="disk_full",
            retry_after=30,
        )
    if isinstance(exc, AdapterIntegrityError):
        logger.error("refused to load %s: %s", label, exc)
        return oai.ApiError(
            403,
            f"{label} failed its integrity check and is quarantined on this node; an operator "
            "has been alerted",
            type_="permission_error",
            code="quarantined",
        )
    if not engine_ready:  # it died under this request: retryable
        return engine_unavailable("restarting")
    logger.error("inference request failed", exc_info=exc)
    return oai.ApiError(
        500, "internal error; it has been logged", type_="server_error", code="internal_error"
    )
