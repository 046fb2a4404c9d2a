"""A request's steps as OpenTelemetry spans under its server span (``lorahub/tracing.py``).

The ASGI instrumentation opens the server span (the caller's ``traceparent`` continued);
when the request ends, ``emit`` adds one child span per step from the moments the request
path marked (``RequestTrace.mark``) and what the request recorded:

- ``lorahub.resolve``: the key checked, the alias resolved to a version, admitted;
- ``lorahub.cache.place``: the adapter made usable by the engine: the tier it came from,
  its bytes, the load's time and own work, whether this request started the load;
- ``lorahub.admission.wait``: the wait for a generation slot and the adapter's device slot;
- ``lorahub.engine``: from the engine's seat to the first token (vLLM's queue and prefill);
- ``lorahub.stream``: from the first token to the last.

Each span, and the server span, names the tenant, alias, version and node: never the prompt,
the answer or the key. Without tracing, ``emit`` returns at once.
"""

from __future__ import annotations

import logging
from time import perf_counter
from typing import Any

from django.conf import settings
from starlette.middleware import Middleware

from apps.serving.node.record import RequestTrace
from lorahub import tracing

logger = logging.getLogger(__name__)


def middleware() -> list[Middleware]:
    """The server span's middleware when this node sends traces; none otherwise."""
    if not tracing.configure("lorahub-node"):
        return []
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    return [
        Middleware(
            OpenTelemetryMiddleware,
            excluded_urls="healthz,metrics",
            exclude_spans=["receive", "send"],  # not one span per streamed chunk
        )
    ]


def identity(trace: RequestTrace) -> dict[str, Any]:
    resolved = trace.resolved
    attributes: dict[str, Any] = {"lorahub.node": settings.LORAHUB_NODE_NAME}
    if trace.caller is not None:
        attributes["lorahub.tenant"] = trace.caller.tenant_slug
    if trace.alias:
        attributes["lorahub.alias"] = trace.alias
    if resolved is not None:
        attributes["lorahub.version"] = resolved.label
        attributes["lorahub.version_id"] = resolved.version_id
    return attributes


def emit(trace: RequestTrace, status: int) -> None:
    """The request's steps as spans; a failure here is logged, never the request's."""
    if trace.span is None:
        return
    try:
        _emit(trace, status)
    except Exception:
        logger.warning("could not record the request's spans", exc_info=True)


def _emit(trace: RequestTrace, status: int) -> None:
    server = trace.span
    if not server.get_span_context().is_valid:
        return
    from opentelemetry import trace as otel

    tracer = otel.get_tracer("lorahub.node")
    attributes = identity(trace)
    server.set_attributes({**attributes, "lorahub.status": status})
    parent = otel.set_span_in_context(server)
    end = perf_counter()

    def at(moment: float) -> int:
        return trace.wall_ns + int((moment - trace.started) * 1e9)

    def span(name: str, start: float | None, stop: float | None, **extra: Any) -> None:
        if start is None or stop is None or stop < start:
            return  # the request never got that far
        child = tracer.start_span(
            name, context=parent, start_time=at(start), attributes={**attributes, **extra}
        )
        child.end(end_time=at(stop))

    marks = trace.marks
    first = None if trace.ttft_ms is None else trace.started + trace.ttft_ms / 1000
    span("lorahub.resolve", trace.started, marks.get("resolved"))
    placing = {
        "lorahub.cache.source_tier": trace.tier,
        "lorahub.cache.load_ms": trace.load_ms,
        "lorahub.cache.load_caused": trace.load_caused,
        "lorahub.cache.degraded": trace.degraded,
    }
    if trace.resolved is not None:
        placing["lorahub.adapter.bytes"] = trace.resolved.size_bytes
    if trace.load_work_ms is not None:
        placing["lorahub.cache.load_work_ms"] = trace.load_work_ms
    span("lorahub.cache.place", marks.get("placing"), marks.get("placed"), **placing)
    span(
        "lorahub.admission.wait",
        marks.get("placed"),
        marks.get("seated"),
        **{"lorahub.queue_ms": trace.queue_ms},
    )
    engine: dict[str, Any] = {"gen_ai.usage.input_tokens": trace.prompt_tokens}
    if trace.ttft_ms is not None:
        engine["lorahub.ttft_ms"] = trace.ttft_ms
    span("lorahub.engine", marks.get("seated"), first or end, **engine)
    span(
        "lorahub.stream",
        first,
        end,
        **{
            "gen_ai.usage.output_tokens": trace.completion_tokens,
            "lorahub.finish_reason": trace.finish_reason,
        },
    )
