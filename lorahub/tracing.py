"""OpenTelemetry traces, off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set (docs/usage.md, "Traces").

With it set, each process sends its spans over OTLP/HTTP (protobuf) from a batching
processor; the SDK and the exporter read the standard variables themselves (headers,
timeout, sampler, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``), and
``OTEL_SDK_DISABLED=true`` turns them off again. Without it, no provider, processor or
exporter is made: the API's no-op tracer stays in place and nothing leaves the process.

What is traced, with the maintained instrumentations where one exists:

- the console (``asgi.py``, ``wsgi.py``): Django's requests (through the ASGI
  instrumentation under uvicorn), its outgoing httpx calls (the nodes' internal API), its
  psycopg queries, and the Celery tasks it sends;
- the worker and beat (``celery.py``): each task, continuing the trace of whoever sent it,
  so an upload → validation → approval → broadcast is one trace;
- a serving node (``apps/serving/node/assembly.py``): the ASGI server span of each request
  (the caller's W3C ``traceparent`` continued; HAProxy passes the header through), and the
  request's own steps (``apps/serving/node/spans.py``): resolution, cache placement,
  admission wait, engine queue and first token, the stream.

Spans name the tenant, alias, version and node; never a prompt, an answer or a key.

The trust boundary (docs/security.md): a caller's ``traceparent`` is continued (its trace id),
but its sampled flag decides nothing at a public entrance — the platform samples a request
from outside at its own ratio (``OTEL_TRACES_SAMPLER_ARG``, default 1.0), by a draw the caller
cannot steer, so a flood of "sampled" requests cannot force exports (``EdgeSampler``); the
nodes' ``/internal/`` API and the worker's tasks follow their sender as usual. The sign-in
callback (its ``code`` and ``state``) is never traced, and a webhook delivery carries no trace
header to a tenant's receiver and makes no span of its URL (``untraced``).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_configured: dict[int, bool] = {}  # pid -> enabled (a forked worker configures its own)


def wanted() -> bool:
    """Whether the environment asks for traces."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(
        os.environ.get(name, "").strip()
        for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def enabled() -> bool:
    """Whether this process sends traces (``configure`` ran and found an endpoint)."""
    return _configured.get(os.getpid(), False)


def configure(service: str) -> bool:
    """Install the tracer provider and the OTLP/HTTP exporter for ``service`` (unless
    ``OTEL_SERVICE_NAME`` names it), once per process; False, doing nothing, when traces are
    not asked for."""
    with _lock:
        pid = os.getpid()
        if pid in _configured:
            return _configured[pid]
        if not wanted():
            _configured[pid] = False
            return False
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)})
        provider = TracerProvider(resource=resource, sampler=edge_sampler())
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        _configured[pid] = True
        return True


# never traced: the sign-in callback carries the provider's one-time code and state
UNTRACED_PATHS = "oidc/callback"
# the paths whose callers are the platform's own (their trace decisions are followed)
INTERNAL_PREFIXES = ("/internal/",)


def _ratio() -> float:
    try:
        return min(max(float(os.environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")), 0.0), 1.0)
    except ValueError:
        return 1.0


def edge_sampler(ratio: float | None = None) -> Any:
    """Parent-based sampling, except that a server span whose parent came from outside (any
    path but ``INTERNAL_PREFIXES``) is decided here: drawn at ``ratio``, whatever the caller's
    flag and trace id say."""
    from opentelemetry.sdk.trace.sampling import (
        Decision,
        ParentBased,
        Sampler,
        SamplingResult,
        TraceIdRatioBased,
    )
    from opentelemetry.trace import SpanKind, get_current_span

    chance = _ratio() if ratio is None else ratio
    follow = ParentBased(root=TraceIdRatioBased(chance))

    def from_outside(parent_context: Any, kind: Any, attributes: Any) -> Any:
        """The caller's span context when this is a public server span under it, else None."""
        parent = get_current_span(parent_context).get_span_context()
        attributes = attributes or {}
        path = str(attributes.get("url.path") or attributes.get("http.target") or "")
        public = not path.startswith(INTERNAL_PREFIXES)
        outside = kind is SpanKind.SERVER and parent.is_valid and parent.is_remote and public
        return parent if outside else None

    class EdgeSampler(Sampler):
        def should_sample(
            self, parent_context, trace_id, name, kind=None, attributes=None, links=None,
            trace_state=None,
        ):  # fmt: skip
            parent = from_outside(parent_context, kind, attributes)
            if parent is None:
                return follow.should_sample(
                    parent_context, trace_id, name, kind, attributes, links, trace_state
                )
            drawn = random.random() < chance  # noqa: S311 (a sampling draw, not a secret)
            decision = Decision.RECORD_AND_SAMPLE if drawn else Decision.DROP
            return SamplingResult(decision, attributes if drawn else None, parent.trace_state)

        def get_description(self) -> str:
            return f"EdgeSampler{{{chance}}}"

    return EdgeSampler()


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """HTTP calls in this block make no span and carry no ``traceparent``/``baggage``: what
    leaves the platform for a tenant's receiver."""
    if not enabled():
        yield
        return
    from opentelemetry.instrumentation.utils import suppress_http_instrumentation

    with suppress_http_instrumentation():
        yield


def instrument_console() -> None:
    """The console's instrumentations (call before Django builds its application)."""
    if not configure("lorahub-console"):
        return
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor

    DjangoInstrumentor().instrument(excluded_urls=UNTRACED_PATHS)
    CeleryInstrumentor().instrument()  # a task sent carries the request's trace
    _instrument_clients()


def instrument_worker(service: str) -> None:
    """A Celery worker's or beat's instrumentations (from their start-up signals)."""
    if not configure(service):
        return
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    CeleryInstrumentor().instrument()
    _instrument_clients()


def _instrument_clients() -> None:
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    HTTPXClientInstrumentor().instrument()
    # no SQL commenter: queries keep their text (and pg_stat_statements its grouping)
    PsycopgInstrumentor().instrument(enable_commenter=False)


def current_span():
    """The span a request runs in (the server's), or None when this process sends no
    traces: what a node's request keeps for its own steps' spans."""
    if not enabled():
        return None
    from opentelemetry import trace

    return trace.get_current_span()


def shutdown() -> None:
    """Send what is batched and stop the exporter (a process that exits on its own)."""
    if not enabled():
        return
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if hasattr(provider, "shutdown"):
        provider.shutdown()
