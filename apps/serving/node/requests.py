"""The OpenAI-compatible inference API: the seed's five steps, in order, for each request.

1 parse (tenant from the API key, alias from ``model``) → 2 resolve (alias → immutable version,
from the node's in-memory table) → 3 admit (servable, signed, base revision, rank, rate) →
4 place (make the adapter usable by the engine) → generate → 5 record (statistics, off the
request path). The engine only ever gets an ``AdapterHandle`` built from a verified local
folder; nothing the caller sends becomes a path or an adapter name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

from django.db import DatabaseError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from apps.fleet.node_registry import node_header
from apps.registry.contracts import AliasSnapshot, ResolvedVersion
from apps.serving import offload
from apps.serving.cache.manager import CacheManager
from apps.serving.node import errors, record, spans, streaming
from apps.serving.node import openai_protocol as oai
from apps.serving.node.admission import Admission
from apps.serving.node.config_in_force import ConfigInForce
from apps.serving.node.demand import Demand
from apps.serving.node.engine import (
    Engine,
    EngineDied,
    EngineNotReady,
    EngineRefused,
    Generation,
)
from apps.serving.node.lookups import UNKNOWN, Caller, Expired, Lookups
from apps.serving.node.metrics import NodeMetrics
from apps.serving.node.placement import Placement
from apps.serving.node.record import RequestTrace
from apps.serving.node.seams import Seams
from apps.serving.node.shadow import Answer, Mirrored, Shadows
from apps.serving.node.stats_recorder import StatsRecorder
from apps.serving.node.streaming import Started
from apps.serving.node.trust import Trust
from apps.telemetry import quality
from apps.tenants.throttle import bad_keys
from apps.tenants.throttle import message as throttle_message
from lorahub.addresses import caller_address

logger = logging.getLogger(__name__)
T = TypeVar("T")
SHADOW_LOAD_DEADLINE_S = 60.0


class RequestPath:
    """The seed's five steps for each request, over the node's parts (built by
    ``assembly.py``): the engine, the cached lookups, trust, admission, the cache manager,
    the configuration in force, and the metrics and statistics the request leaves."""

    def __init__(
        self,
        *,
        engine: Engine,
        lookups: Lookups,
        trust: Trust,
        admission: Admission,
        cache: CacheManager,
        config: ConfigInForce,
        metrics: NodeMetrics,
        stats: StatsRecorder,
    ) -> None:
        self.engine, self.lookups, self.trust = engine, lookups, trust
        self.admission, self.cache, self.config = admission, cache, config
        self.metrics, self.stats = metrics, stats
        self.shadows: Shadows | None = None  # set by the assembly: it answers through here
        self.seams = Seams()  # faults a test injects (LORAHUB_TEST_SEAMS only)
        self.shadow_headroom = 0  # slots a shadow copy leaves free for callers (its budget)
        self.demand = Demand()  # what is asked for, for prefetch ahead of demand (demand.py)
        # step 4: prepare at arrival, board right before the send (placement.py)
        self.placement = Placement(cache=cache, config=config, metrics=metrics, demand=self.demand)
        self.place, self.board = self.placement.place, self.placement.board
        self.leave_engine, self.finishing = self.placement.leave_engine, self.placement.finishing
        self.let_go = self.placement.let_go

    # --- steps 1-3 -------------------------------------------------------------------------

    async def authenticate(self, request: Request) -> Caller:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise oai.ApiError(
                401,
                "missing API key: send 'Authorization: Bearer <key>'",
                type_="authentication_error",
                code="missing_api_key",
            )
        client = caller_address(
            request.client.host if request.client else "",
            request.headers.getlist("x-forwarded-for"),
        )
        token = token.strip()
        known = self.lookups.cached_caller(token)
        caller = (
            await offload.run(self.lookups.caller, token, client) if known is UNKNOWN else known
        )
        if isinstance(caller, Expired):  # a known key: not counted as a guess
            raise oai.ApiError(
                401, caller.message, type_="authentication_error", code="key_expired"
            )
        if not isinstance(caller, Caller):
            # a valid key is never refused: only failures count, and only the caller's own
            wait_s = bad_keys().failed(client)
            if wait_s:
                raise oai.ApiError(
                    429,
                    throttle_message(wait_s),
                    type_="rate_limit_error",
                    code="too_many_bad_keys",
                    retry_after=wait_s,
                )
            raise oai.ApiError(
                401,
                "the API key is not valid or has been revoked",
                type_="authentication_error",
                code="invalid_api_key",
            )
        return caller

    async def resolve(self, trace: RequestTrace, model: str, request_key: str) -> None:
        """Fill ``trace.resolved`` (None for the base model) and admit the request. The
        tenant's rate comes first, so that names it does not have cost it requests too; a
        name it does not have is never recorded (``trace.unknown_model``): the ledger's
        groups are the aliases that exist, never what a caller wrote."""
        caller = trace.caller
        assert caller is not None
        self.admission.check_rate(
            tenant_id=caller.tenant_id,
            tenant_slug=caller.tenant_slug,
            rpm=caller.requests_per_minute,
        )
        if model == self.engine.settings.served_model_name:
            trace.tier = "base"
            return
        known = self.lookups.cached_alias(caller.tenant_id, model)
        snapshot = (
            await offload.run(self.lookups.alias, caller.tenant_id, model)
            if known is UNKNOWN
            else known
        )
        if not isinstance(snapshot, AliasSnapshot):
            trace.unknown_model = True
            raise oai.ApiError(
                404,
                f"the model '{model[:100]}' does not exist; GET /v1/models "
                "lists the aliases you can call",
                code="model_not_found",
            )
        trace.alias = model
        trace.resolved = snapshot.choose(request_key, caller.key_prefix)
        trace.shadow = snapshot.mirror(request_key)
        trace.keep_shadow_example = snapshot.shadow_keep_examples
        await self.trust.admit(trace.resolved)

    # --- step 4 (placement.py) and generation -----------------------------------------------

    # --- the endpoints ---------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        return await self._handle(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._handle(request, chat=True)

    async def models(self, request: Request) -> Response:
        trace = RequestTrace()
        try:
            trace.caller = await self.authenticate(request)
            names = await offload.run(self.lookups.aliases_of, trace.caller.tenant_id)
            cards = self.engine.model_cards(names, trace.caller.tenant_slug)
        except (oai.ApiError, EngineNotReady, DatabaseError) as exc:
            return self._error(errors.api_error(exc), trace)
        return JSONResponse({"object": "list", "data": cards}, headers=node_header())

    async def _handle(self, request: Request, *, chat: bool) -> Response:
        trace = RequestTrace()

        async def parse_and_resolve() -> dict[str, Any]:
            trace.caller = await self.authenticate(request)
            body = oai.parse(await request.body(), chat=chat)
            request_key = (
                body.get("user") or request.headers.get("x-lorahub-request-key") or uuid.uuid4().hex
            )
            await self.resolve(trace, body["model"], request_key)
            return body

        return await self._answer(request, trace, parse_and_resolve, chat=chat)

    async def answer_for_version(
        self,
        request: Request,
        *,
        resolved: ResolvedVersion,
        caller: Caller,
        body: dict[str, Any],
        chat: bool,
    ) -> Response:
        """A non-streamed request for one version rather than an alias (an evaluation run's,
        through the internal API): admitted, placed and generated as any other, not counted
        in the tenant's statistics. The response carries its TTFT in ``X-Lorahub-Ttft-Ms``."""
        trace = RequestTrace(caller=caller, resolved=resolved, counted=False)

        async def parse() -> dict[str, Any]:
            raw = json.dumps({**body, "model": resolved.label, "stream": False}).encode()
            return oai.parse(raw, chat=chat)

        return await self._answer(request, trace, parse, chat=chat)

    async def _answer(
        self,
        request: Request,
        trace: RequestTrace,
        parse: Callable[[], Awaitable[dict[str, Any]]],
        *,
        chat: bool,
    ) -> Response:
        try:
            # What the request holds (its place in the queue, its generation slot, its version)
            # is given back when this block ends, or when its stream does (``pop_all``).
            async with contextlib.AsyncExitStack() as holding:
                body = await parse()
                trace.mark("resolved")
                model = body["model"]
                trace.json = quality.json_wanted(body)
                trace.body, trace.chat = body, chat
                if not self.engine.is_ready:
                    raise EngineNotReady(self.engine.info().state)
                engine_request = await self.engine.openai_request(chat=chat, body=body)
                ticket = holding.enter_context(self.admission.queue_for(trace.caller))
                holding.callback(self.let_go, trace)
                # Place first: a cold load must not hold a generation slot that hot requests
                # need (no head-of-line blocking).
                handle = await self.place(trace)
                trace.mark("placed")
                await holding.enter_async_context(ticket.slot(reserve=oai.output_budget(body)))
                trace.queue_ms = ticket.waited_ms
                await self.cache.enter_engine(handle.lora_id if handle else None)
                trace.mark("seated")
                trace.active = handle is not None
                if self.seams.faults:
                    await self.seams.apply(trace.resolved.version_id if trace.resolved else None)
                await self.board(trace)  # nothing may await between this and the send
                # the device slot is free for others as soon as vLLM is done with the request
                generation = Generation(
                    on_finished=lambda: self.leave_engine(trace),
                    on_last_token=lambda: self.finishing(trace),
                    keep_text=trace.json is not None or trace.shadow is not None,
                    on_tokens=ticket.charge,
                    priority=ticket.priority,
                )
                trace.generating = True
                result = await self._generate(request, engine_request, handle, model, generation)
                if isinstance(result, dict):
                    record.observe(trace, generation)
                    self._finish(trace, 200)
                    return JSONResponse(result, headers=trace.headers())
                # vLLM checks the request when it first runs it: take the first event before
                # answering, so that a refusal is a plain error response, not one inside a 200
                first_event = await result.__anext__()
                refused = errors.error_in_event(first_event)
                if refused is not None:
                    await result.aclose()
                    if generation.died:
                        raise EngineDied("the engine core exited")
                    trace.refused = refused.status < 500
                    raise refused
                stream = streaming.sse(
                    first_event,
                    result,
                    trace,
                    generation,
                    holding.pop_all(),
                    finish=lambda status: self._end(trace, generation, status),
                )
                # Start the stream before answering: a started async generator is closed
                # (and its `finally` run) even if the client vanishes before the first byte.
                first = await stream.__anext__()
                return StreamingResponse(
                    Started(first, stream),
                    media_type="text/event-stream",
                    headers=trace.headers(),
                )
        except Exception as exc:
            trace.refused = trace.refused or isinstance(exc, EngineRefused)
            label = trace.resolved.label if trace.resolved else ""
            return self._error(
                errors.api_error(exc, label=label, engine_ready=self.engine.is_ready), trace
            )

    async def _generate(
        self,
        request: Request,
        engine_request: Any,
        handle: Any,
        model: str,
        generation: Generation,
    ) -> dict[str, Any] | AsyncGenerator[str, None]:
        """vLLM's answer; a non-streamed one is aborted in vLLM if the client goes away."""
        task = asyncio.ensure_future(
            self.engine.openai(
                engine_request, adapter=handle, model_name=model, generation=generation
            )
        )
        while not task.done():
            await asyncio.wait({task}, timeout=0.25)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                raise oai.ApiError(499, "client closed the request", code="client_closed")
        return task.result()

    # --- step 5 ----------------------------------------------------------------------------

    def _end(self, trace: RequestTrace, generation: Generation, status: int) -> None:
        record.observe(trace, generation)
        self._finish(trace, status)

    def _finish(self, trace: RequestTrace, status: int, error: str = "") -> None:
        """Step 5: the request's metrics, its statistics row and its shadow's copy."""
        if not trace.counted:
            return
        record.count(self.metrics, trace, status, error)
        if not trace.unknown_model:
            self.stats.record(record.statistics_row(trace, status, error))
        spans.emit(trace, status)
        if trace.shadow is not None and status == 200 and self.shadows is not None:
            self.shadows.offer(record.mirrored(trace))

    async def answer_shadow(self, mirrored: Mirrored) -> Answer:
        """The shadow version's answer to a caller's request, on spare capacity only: a
        generation slot is taken only while nobody waits and ``shadow_headroom`` slots stay
        free for callers (else ``NoSpareSlot``); a shadow that cannot load, or is refused by
        trust, raises. Never counted in the tenant's statistics."""
        shadow = mirrored.shadow
        trace = RequestTrace(caller=mirrored.caller, resolved=shadow, counted=False)
        copy = {k: v for k, v in mirrored.body.items() if k != "stream_options"}
        raw = json.dumps({**copy, "model": shadow.label, "stream": False}).encode()
        body = oai.parse(raw, chat=mirrored.chat)
        trace.json = quality.json_wanted(body)
        if not self.engine.is_ready:
            raise EngineNotReady(self.engine.info().state)
        await self.trust.admit(shadow)
        engine_request = await self.engine.openai_request(chat=mirrored.chat, body=body)
        try:
            # a copy is nobody's answer: it may wait longer for its version's load than a
            # caller's SLA allows (loads stay single-flight, in the bounded load queue)
            handle = await self.place(trace, deadline_s=SHADOW_LOAD_DEADLINE_S, demand=False)
            if handle is None:  # the load missed its deadline and the base model would answer
                raise oai.ApiError(503, f"{shadow.label} did not load in time", code="degraded")
            async with self.admission.spare_slot(headroom=self.shadow_headroom):
                await self.cache.enter_engine(handle.lora_id)
                trace.active = True
                await self.board(trace)
                generation = Generation(
                    on_finished=lambda: self.leave_engine(trace),
                    on_last_token=lambda: self.finishing(trace),
                    keep_text=True,
                )
                await self.engine.openai(
                    engine_request, adapter=handle, model_name=shadow.label, generation=generation
                )
                record.observe(trace, generation)
        finally:
            self.let_go(trace)
        return record.answer_of(trace)

    def _error(self, exc: oai.ApiError, trace: RequestTrace) -> Response:
        self._finish(trace, exc.status, exc.code or "")
        headers = trace.headers()
        if exc.retry_after is not None:
            headers["Retry-After"] = str(exc.retry_after)
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)
