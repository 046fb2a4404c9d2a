"""A caller from outside cannot decide what the platform traces (lorahub/tracing.py).

The caller's ``traceparent`` is continued, but its sampled flag forced every request it sent
to be recorded and exported (the default parent-based sampler follows a remote parent): a
flood of "sampled" requests made the platform's traces as costly as the caller liked. At a
public entrance the platform now draws itself; its own hops (``/internal/``, tasks) follow
their sender. What leaves for a tenant (webhooks) carries no trace header:
``tests/tenants/test_webhooks.py`` checks a real receiver's headers.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from lorahub import tracing

TRACE_ID = 0x0000000000000000000000000000000F  # a trace id any ratio sampler keeps


def remote_parent(sampled: bool):
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    context = SpanContext(TRACE_ID, 0xABC, is_remote=True, trace_flags=flags)
    return trace.set_span_in_context(trace.NonRecordingSpan(context))


def decide(sampler, *, sampled: bool, path: str, kind=SpanKind.SERVER) -> Decision:
    result = sampler.should_sample(
        remote_parent(sampled), TRACE_ID, "POST", kind, {"url.path": path, "http.target": path}
    )
    return result.decision


def test_a_callers_sampled_flag_and_trace_id_decide_nothing_at_the_public_entrance():
    never = tracing.edge_sampler(ratio=0.0)
    # a caller's "sampled" flag and a trace id chosen to pass any ratio: still dropped
    assert decide(never, sampled=True, path="/v1/chat/completions") == Decision.DROP
    assert decide(never, sampled=True, path="/api/versions") == Decision.DROP
    always = tracing.edge_sampler(ratio=1.0)
    # nor can a caller turn the platform's own tracing off
    assert decide(always, sampled=False, path="/v1/completions") == Decision.RECORD_AND_SAMPLE


def test_the_platforms_own_hops_follow_their_sender():
    never = tracing.edge_sampler(ratio=0.0)
    assert decide(never, sampled=True, path="/internal/generate") == Decision.RECORD_AND_SAMPLE
    assert decide(never, sampled=False, path="/internal/generate") == Decision.DROP
    # a task the console sent (a consumer span under the console's context)
    task = decide(never, sampled=True, path="", kind=SpanKind.CONSUMER)
    assert task == Decision.RECORD_AND_SAMPLE
