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
"""

from __future__ import annotations

import os
import threading

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
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        _configured[pid] = True
        return True


def instrument_console() -> None:
    """The console's instrumentations (call before Django builds its application)."""
    if not configure("lorahub-console"):
        return
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor

    DjangoInstrumentor().instrument()
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
