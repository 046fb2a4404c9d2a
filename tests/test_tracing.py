"""Traces of the console and the worker (lorahub/tracing.py), read by an OTLP/HTTP receiver in
the test: an upload sent with a caller's traceparent is one trace from the console's request
through the validation task the worker ran; and with no OTLP endpoint set, no exporter (not
even the SDK) is loaded."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import httpx
import pytest

from apps.tenants import services as tenant_services
from tests.harness.processes import ROOT, S3_ENV, child_database_url, stop
from tests.harness.waiting import free_port, wait_for_port


@pytest.fixture
def traced_console(registry, signing_key, otlp, settings):
    """The console as production runs it (uvicorn, ``lorahub.asgi``), sending its traces."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": child_database_url(),
        "LORAHUB_S3_ENDPOINT": settings.LORAHUB_S3_ENDPOINT,
        **S3_ENV,
        "LORAHUB_SIGNING_KEY_FILE": str(settings.LORAHUB_SIGNING_KEY_FILE),
        **otlp.env,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "lorahub.asgi:application", "--port", str(port)],
        cwd=ROOT,
        env=env,
    )
    try:
        wait_for_port(port, proc, timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def test_an_upload_is_one_trace_from_the_console_through_the_validation_task(
    traced_console, otlp, tenant_a, adapter_files
):
    _, key = tenant_services.issue_api_key(tenant=tenant_a, name="ci", actor=None)
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    files = [
        ("files", (p.name, p.read_bytes(), "application/octet-stream"))
        for p in sorted(adapter_files.iterdir())
    ]
    answer = httpx.post(
        f"{traced_console}/api/adapters/support/versions",
        files=files,
        data={"version": "traced"},
        headers={
            "Authorization": f"Bearer {key}",
            "traceparent": f"00-{caller_trace}-{caller_span}-01",
        },
        timeout=60,
    )
    assert answer.status_code == 202, answer.text

    def validated(spans) -> bool:
        return any(s.service == "lorahub-worker" and "validate_version" in s.name for s in spans)

    spans = otlp.wait_for(caller_trace, validated, timeout=60)
    by_id = {s.span_id: s for s in spans}
    (request,) = [s for s in spans if s.parent_id == caller_span]
    assert request.service == "lorahub-console" and request.name.startswith("POST")
    # the console's queries, and the task the worker ran, under the caller's trace
    assert any(s.service == "lorahub-console" and s.attributes.get("db.system") for s in spans)
    task = next(s for s in spans if s.service == "lorahub-worker" and "validate_version" in s.name)
    chain, at = [], task
    while at.parent_id in by_id:
        at = by_id[at.parent_id]
        chain.append(at.service)
    assert at is request, chain  # the task's span leads back to the console's request span
    assert key not in repr([s.attributes for s in spans])


def test_without_an_otlp_endpoint_no_exporter_is_loaded():
    """The console's, the worker's and a node's start-up with tracing off: the SDK and the
    exporter are never imported, no thread is started, the node adds no middleware."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    probe = """
import sys, threading
import django, os
import lorahub.asgi, lorahub.celery
from lorahub import tracing
from apps.serving.node import spans
assert not tracing.configure("probe")
assert spans.middleware() == []
loaded = [m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))]
print(loaded, [t.name for t in threading.enumerate()])
assert not loaded, loaded
assert tracing.current_span() is None
"""
    ran = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.startswith("[] ['MainThread']"), ran.stdout


def test_the_sign_in_callbacks_code_never_reaches_a_span(traced_console, otlp):
    """The provider's one-time ``code`` and ``state`` travel in the callback's query: the
    callback is never traced (it was, with its URL)."""
    code = secrets.token_hex(12)
    marker_trace = secrets.token_hex(16)
    httpx.get(f"{traced_console}/oidc/callback/?code={code}&state=s", timeout=30)
    # a request after it, whose spans arriving proves the exporter has sent what it had
    httpx.get(
        f"{traced_console}/accounts/login/",
        headers={"traceparent": f"00-{marker_trace}-{secrets.token_hex(8)}-01"},
        timeout=30,
    )
    otlp.wait_for(marker_trace, lambda spans: any(s.service == "lorahub-console" for s in spans))
    assert code not in repr([(s.name, s.attributes) for s in otlp.spans])
