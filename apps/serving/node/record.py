"""What one request did (``RequestTrace``), and what is made of it when it ends: its
response headers, its metrics, its statistics row and, for an alias with a shadow, the copy
offered to the shadow. Built here, in one place."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from apps.fleet.node_registry import node_header
from apps.registry.contracts import ResolvedVersion
from apps.serving.node.generation import Generation
from apps.serving.node.lookups import Caller
from apps.serving.node.metrics import NodeMetrics
from apps.serving.node.shadow import Answer, Mirrored
from apps.telemetry import outcomes, quality
from apps.telemetry.records import RequestRecord
from lorahub import tracing


@dataclass
class RequestTrace:
    """What one request did, for its headers, its metrics and its statistics row."""

    started: float = field(default_factory=time.perf_counter)
    wall_ns: int = field(default_factory=time.time_ns)  # the same moment, for span times
    span: Any = field(default_factory=tracing.current_span)  # the server's (None: no tracing)
    marks: dict[str, float] = field(default_factory=dict)  # step -> perf_counter (spans.py)
    caller: Caller | None = None
    alias: str = ""
    resolved: ResolvedVersion | None = None
    tier: str = ""
    load_ms: float = 0.0
    load_work_ms: float | None = None  # the load's own work, without waits for a slot
    load_caused: bool = False  # this request started the load (usage counts loads by it)
    queue_ms: float = 0.0
    ttft_ms: float | None = None
    degraded: bool = False  # the base model answered: the adapter could not load in time
    # the LoRA id of this request's version from placement on: awaited (``placed``) until
    # the request boards the engine, then held there while it runs (``boarded``)
    held: int | None = None
    placed: Any = None  # cache.manager.Placed, for boarding
    owner: Any = None  # cache.engine_tiers.Owner of the placement
    boarded: bool = False
    active: bool = False  # admitted to the engine's batch (the device-slot gate)
    finishing: bool = False  # on its last token (the gate may hand its slot on)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # the output-quality markers (``apps/telemetry/quality.py``)
    json: quality.JsonWanted | None = None  # the request asked for JSON
    finish_reason: str = ""
    empty_output: bool = False
    json_valid: bool | None = None
    json_matches: bool | None = None
    refused: bool = False  # vLLM refused the request itself
    generating: bool = False  # handed to the engine
    counted: bool = True  # in the tenant's statistics and metrics (an evaluation's is not)
    unknown_model: bool = False  # named no alias of its tenant: a metric, never a usage row
    shadow: ResolvedVersion | None = None  # the alias's shadow gets a copy of this request
    keep_shadow_example: bool = False
    body: dict[str, Any] = field(default_factory=dict)  # as parsed, for the shadow's copy
    chat: bool = False
    texts: list[str] = field(default_factory=list)  # the answer's, when kept (JSON, shadow)

    def mark(self, step: str) -> None:
        """The moment ``step`` ended (resolved, placing, placed, seated), for its span."""
        self.marks[step] = time.perf_counter()

    def headers(self) -> dict[str, str]:
        if self.resolved is not None:
            adapter = self.resolved.label
        else:
            adapter = "base" if self.tier == "base" else "none"
        headers = {
            **node_header(),
            "X-Lorahub-Adapter": adapter,
            "X-Lorahub-Cache-Tier": self.tier or "none",
            "X-Lorahub-Load-Ms": f"{self.load_ms:.1f}",
            # the wait for a seat in the engine's batch, in the tenant's fair order
            "X-Lorahub-Queue-Ms": f"{self.queue_ms:.1f}",
        }
        if self.degraded:
            headers["X-Lorahub-Degraded"] = "1"
        if not self.counted and self.ttft_ms is not None:
            headers["X-Lorahub-Ttft-Ms"] = f"{self.ttft_ms:.1f}"
        return headers


def finish_reason(trace: RequestTrace, status: int) -> str:
    """A generation that failed finished with an error, whatever its choices did."""
    return "error" if status >= 500 and trace.generating else trace.finish_reason


def count(metrics: NodeMetrics, trace: RequestTrace, status: int, error: str) -> None:
    """The request in the node's Prometheus metrics."""
    caller, resolved = trace.caller, trace.resolved
    tenant = caller.tenant_slug if caller else "anonymous"
    adapter = resolved.adapter_id if resolved else ("base" if trace.tier == "base" else "none")
    tenant_label, adapter_label = metrics.labels_for(tenant, adapter)
    finished = finish_reason(trace, status)
    outcome = outcomes.classify(status, finished)
    metrics.requests.labels(tenant=tenant_label, adapter=adapter_label, outcome=outcome.value).inc()
    if outcome is outcomes.Outcome.SERVER_FAILURE:  # the error rate: server failures only
        metrics.errors.labels(
            tenant=tenant_label, adapter=adapter_label, code=error or str(status)
        ).inc()
    if trace.tier:
        metrics.count_tier(trace.tier)
    if trace.ttft_ms is not None:
        metrics.ttft.labels(tenant=tenant_label, adapter=adapter_label).observe(trace.ttft_ms)
    for marker, present in (
        ("cut", finished == "length"),
        ("empty", trace.empty_output),
        ("refused", trace.refused),
        ("json_invalid", trace.json_valid is False),
        ("json_mismatched", trace.json_matches is False),
        ("failed", finished == "error"),
    ):
        if present:
            metrics.output_markers.labels(
                tenant=tenant_label, adapter=adapter_label, marker=marker
            ).inc()


def observe(trace: RequestTrace, generation: Generation) -> None:
    """What the engine reported of the request: first token, tokens, how it finished, and
    the JSON asked for judged against the answer."""
    if trace.ttft_ms is None and generation.first_token_s is not None:
        trace.ttft_ms = (generation.first_token_s - trace.started) * 1000
    trace.prompt_tokens = generation.prompt_tokens
    trace.completion_tokens = generation.completion_tokens
    trace.finish_reason = generation.finish_reason
    trace.empty_output = generation.empty_output
    if generation.keep_text:  # always when JSON was asked for
        trace.texts = generation.texts()
    if trace.json is not None and generation.finish_reasons:
        verdict = quality.judge_json(trace.texts, trace.json)
        trace.json_valid, trace.json_matches = verdict.valid, verdict.matches


def statistics_row(trace: RequestTrace, status: int, error: str) -> RequestRecord:
    caller, resolved = trace.caller, trace.resolved
    return RequestRecord(
        tenant_id=caller.tenant_id if caller else None,
        alias=trace.alias[:63],
        adapter_id=resolved.adapter_id if resolved else "",
        version=resolved.version if resolved else "",
        tier=trace.tier,
        degraded=trace.degraded,
        status=status,
        error=error,
        load_ms=trace.load_ms,
        load_work_ms=trace.load_work_ms,
        load_caused=trace.load_caused,
        queue_ms=trace.queue_ms,
        ttft_ms=trace.ttft_ms,
        total_ms=(time.perf_counter() - trace.started) * 1000,
        prompt_tokens=trace.prompt_tokens,
        completion_tokens=trace.completion_tokens,
        finish_reason=finish_reason(trace, status),
        empty_output=trace.empty_output,
        json_requested=trace.json is not None,
        json_valid=trace.json_valid,
        json_matches=trace.json_matches,
        refused=trace.refused,
    )


def answer_of(trace: RequestTrace) -> Answer:
    return Answer(
        texts=trace.texts,
        finish_reason=trace.finish_reason,
        json_valid=trace.json_valid,
        ttft_ms=trace.ttft_ms,
    )


def mirrored(trace: RequestTrace) -> Mirrored:
    """The copy of an answered request offered to its alias's shadow."""
    assert trace.caller is not None and trace.resolved is not None and trace.shadow
    return Mirrored(
        caller=trace.caller,
        shadow=trace.shadow,
        alias=trace.alias,
        live_version=trace.resolved.version,
        chat=trace.chat,
        body=trace.body,
        live=answer_of(trace),
        keep_example=trace.keep_shadow_example,
    )
