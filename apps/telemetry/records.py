"""What a node records of each request and of each mirrored copy: plain values, written by
``writers.py`` and summed by ``aggregate.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime


@dataclass(frozen=True)
class RequestRecord:
    tenant_id: int | None
    alias: str
    adapter_id: str
    version: str
    tier: str
    status: int
    error: str = ""
    degraded: bool = False
    load_ms: float = 0.0
    load_work_ms: float | None = None  # fetch, verify or check, add: without slot waits
    load_caused: bool = False  # it started the load (concurrent requests share one)
    queue_ms: float = 0.0
    ttft_ms: float | None = None
    total_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # output-quality markers (``apps/telemetry/quality.py``)
    finish_reason: str = ""  # stop, length, error (or abort, or "" without a generation)
    empty_output: bool = False
    json_requested: bool = False
    json_valid: bool | None = None  # None: JSON was not asked for, or nothing finished
    json_matches: bool | None = None  # None: no schema
    refused: bool = False
    at: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass(frozen=True)
class ShadowRecord:
    """One mirrored request: dropped (``outcome`` ``dropped_busy``/``dropped_budget``), failed
    on the shadow (``error``), or answered and compared with the live answer."""

    tenant_id: int | None
    alias: str
    version: str
    shadow_version: str
    outcome: str  # compared, error, dropped_busy, dropped_budget
    exact: bool = False
    similarity: float = 0.0
    length_ratio: float = 0.0
    finish_agree: bool = False
    json_agree: bool | None = None  # None: the request did not ask for JSON
    ttft_ms: float | None = None
    live_ttft_ms: float | None = None
    # (request, live answer, shadow answer), for an alias whose shadow keeps examples
    example: tuple[str, str, str] | None = None
    at: datetime = field(default_factory=lambda: datetime.now(UTC))
