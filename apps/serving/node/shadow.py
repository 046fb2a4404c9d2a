"""Shadow traffic: a copy of a share of an alias's requests, answered by the alias's shadow
version off the response path and compared with what the caller got.

The copy is offered only once the caller's answer is complete, so the caller never waits for
it, never sees its output, and never gets its errors. Copies run on spare capacity only: one
is dropped (counted, by reason) when a caller is waiting for a generation slot or a load, or
when callers hold more than ``LORAHUB_SHADOW_WHILE_BUSY_BELOW_PERCENT`` (25 %) of the
generation slots (``busy``), or
when shadow copies already hold their budget of generation slots (``budget``,
``LORAHUB_SHADOW_BUDGET_PERCENT``, 20 % of them, at least one). What each copy did is recorded per
minute (``ShadowMinute``); prompts and answers are kept only as a bounded sample of
examples (``ShadowExample``), for aliases whose shadow asks for them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from apps.registry.contracts import ResolvedVersion
from apps.serving.node.admission import Admission, NoSpareSlot
from apps.serving.node.background import BackgroundTasks
from apps.serving.node.lookups import Caller
from apps.serving.node.metrics import NodeMetrics
from apps.serving.node.stats_recorder import StatsRecorder
from apps.telemetry import quality
from apps.telemetry.records import ShadowRecord

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answer:
    """What one version answered a request: its choices' texts, how they finished, whether
    they were the JSON asked for (None: not asked), and the time to the first token."""

    texts: list[str]
    finish_reason: str
    json_valid: bool | None
    ttft_ms: float | None


@dataclass(frozen=True)
class Mirrored:
    """A caller's completed request with its answer, to be asked again of the shadow."""

    caller: Caller
    shadow: ResolvedVersion
    alias: str
    live_version: str
    chat: bool
    body: dict[str, Any]
    live: Answer
    keep_example: bool = False  # the alias keeps examples of its shadow's answers


def compare(live: Answer, shadow: Answer) -> dict[str, Any]:
    """How the shadow's answer compares with the live one: identical, similarity (word level,
    averaged over choices), length ratio, the same finish reason, the same JSON validity."""
    pairs = list(zip(live.texts, shadow.texts, strict=False)) or [("", "")]
    live_chars = sum(len(t) for t in live.texts)
    shadow_chars = sum(len(t) for t in shadow.texts)
    return {
        "exact": live.texts == shadow.texts,
        "similarity": sum(quality.similarity(a, b) for a, b in pairs) / len(pairs),
        "length_ratio": shadow_chars / live_chars if live_chars else float(shadow_chars == 0),
        "finish_agree": live.finish_reason == shadow.finish_reason,
        "json_agree": None if live.json_valid is None else live.json_valid == shadow.json_valid,
    }


def _example(mirrored: Mirrored, shadow: Answer) -> tuple[str, str, str]:
    """The request (its prompt, or its chat messages as JSON) with both first answers."""
    body = mirrored.body
    request = body.get("prompt") if not mirrored.chat else body.get("messages")
    text = request if isinstance(request, str) else json.dumps(request, ensure_ascii=False)
    return text, (mirrored.live.texts or [""])[0], (shadow.texts or [""])[0]


class Shadows:
    """Schedules shadow copies: ``offer`` never blocks and never raises."""

    def __init__(
        self,
        *,
        admission: Admission,
        answer: Callable[[Mirrored], Awaitable[Answer]],
        stats: StatsRecorder,
        metrics: NodeMetrics,
        background: BackgroundTasks,
        budget_share: float,
    ) -> None:
        self.admission, self.answer, self.stats = admission, answer, stats
        self.metrics, self.background = metrics, background
        self.budget = max(1, int(admission.max_concurrent * budget_share))
        self.in_flight = 0

    def offer(self, mirrored: Mirrored) -> None:
        if self.admission.waiting > 0:
            self._record(mirrored, "dropped_busy")
        elif self.in_flight >= self.budget:
            self._record(mirrored, "dropped_budget")
        else:
            self.in_flight += 1
            self.background.spawn(self._run(mirrored), name="shadow")

    async def _run(self, mirrored: Mirrored) -> None:
        try:
            shadow = await self.answer(mirrored)
        except NoSpareSlot:
            self._record(mirrored, "dropped_busy")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.info("shadow copy to %s failed: %s", mirrored.shadow.label, exc)
            self._record(mirrored, "error")
        else:
            compared = compare(mirrored.live, shadow)
            example = _example(mirrored, shadow) if mirrored.keep_example else None
            self._record(mirrored, "compared", shadow, example=example, **compared)
        finally:
            self.in_flight -= 1

    def _record(
        self, mirrored: Mirrored, outcome: str, shadow: Answer | None = None, **compared: Any
    ) -> None:
        self.metrics.shadow_requests.labels(outcome=outcome).inc()
        self.stats.record_shadow(
            ShadowRecord(
                tenant_id=mirrored.caller.tenant_id,
                alias=mirrored.alias[:63],
                version=mirrored.live_version,
                shadow_version=mirrored.shadow.version,
                outcome=outcome,
                ttft_ms=shadow.ttft_ms if shadow else None,
                live_ttft_ms=mirrored.live.ttft_ms,
                **compared,
            )
        )
