"""The serving node: builds its parts and gives each only what it needs; runs the engine's
lifecycle and the node's background work; serves its ASGI app.

Routes: ``/healthz``, ``/metrics``, the OpenAI-compatible ``/v1/*`` (``requests.py``) and
``/internal/*`` (``internal_api.py``). The engine starts in the background, so ``/healthz``
answers at once: 503 while the engine starts or restarts, 200 with the base model, its
revision and the LoRA limits when ready. A watchdog restarts a dead engine; requests
meanwhile get 503 with ``Retry-After``. How the node follows the registry's changes is in
``changes.py``. No part imports this module: each gets its collaborators here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

from django.conf import settings
from django.utils import timezone
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from apps.fleet import node_registry
from apps.fleet.node_registry import node_header
from apps.registry import keys
from apps.registry import services as registry_services
from apps.registry.storage import get_store
from apps.serving import offload
from apps.serving.cache import download, evictions, report
from apps.serving.cache.gate import GateRule
from apps.serving.cache.manager import CacheManager, Limits
from apps.serving.cache.policies import make_policy
from apps.serving.config import effective_config
from apps.serving.node import lifeline, spans
from apps.serving.node.admission import Admission
from apps.serving.node.background import BackgroundTasks
from apps.serving.node.body_limit import BodyLimit
from apps.serving.node.changes import ChangeFollower
from apps.serving.node.config_in_force import ConfigInForce
from apps.serving.node.drain import Drain
from apps.serving.node.engine import Engine, EngineSettings
from apps.serving.node.internal_api import InternalApi, has_internal_token
from apps.serving.node.lookups import Lookups
from apps.serving.node.metrics import NodeMetrics
from apps.serving.node.prewarm import Prewarm
from apps.serving.node.requests import RequestPath
from apps.serving.node.shadow import Shadows
from apps.serving.node.stats_recorder import StatsRecorder
from apps.serving.node.trust import Trust
from lorahub import tracing
from lorahub.addresses import caller_address

logger = logging.getLogger(__name__)


class Node:
    def __init__(self, engine_settings: EngineSettings | None = None) -> None:
        self.name = settings.LORAHUB_NODE_NAME
        self.started_at = timezone.now()
        # The configuration in force: an operator's stored one, else the node's YAML file.
        # The engine's LoRA slots and rank are fixed by it until the node restarts.
        self.config = ConfigInForce(effective_config())
        self.engine = Engine(
            engine_settings or EngineSettings.from_django_settings(self.config.started_with)
        )
        self.metrics = metrics = NodeMetrics()
        self.stats = stats = StatsRecorder(self.name, on_drop=metrics.stats_dropped.inc)
        self.lookups = Lookups()
        self.background = BackgroundTasks()
        self.trust = Trust(engine=self.engine.settings, metrics=metrics, node_name=self.name)

        self.cache = self._cache()
        self.admission = Admission(
            max_concurrent=settings.LORAHUB_NODE_MAX_CONCURRENT,
            max_queue=settings.LORAHUB_NODE_MAX_QUEUE,
            headroom=settings.LORAHUB_NODE_FAIR_HEADROOM,
            on_overloaded=metrics.overloaded.inc,
            on_waited=metrics.waited,
            on_tokens=metrics.served,
        )
        self.prewarm = Prewarm(
            config=self.config,
            trust=self.trust,
            cache=self.cache,
            engine=self.engine,
            node_name=self.name,
        )
        self.requests = RequestPath(
            engine=self.engine,
            lookups=self.lookups,
            trust=self.trust,
            admission=self.admission,
            cache=self.cache,
            config=self.config,
            metrics=metrics,
            stats=stats,
        )
        self.requests.demand.on_prefetch = metrics.prefetches.inc
        self._add_shadows()
        self.internal = InternalApi(
            engine=self.engine,
            lookups=self.lookups,
            trust=self.trust,
            cache=self.cache,
            config=self.config,
            prewarm=self.prewarm,
            requests=self.requests,
        )
        self.changes = ChangeFollower(
            lookups=self.lookups,
            trust=self.trust,
            cache=self.cache,
            config=self.config,
            background=self.background,
        )
        self._engine_changed = asyncio.Event()  # ready, dead, restarting: tell the registry
        # SIGTERM: out of rotation, new requests 503, in-flight ones finish (drain.py)
        self.drain = Drain(
            leave_s=settings.LORAHUB_NODE_DRAIN_LEAVE_S,
            timeout_s=settings.LORAHUB_NODE_DRAIN_TIMEOUT_S,
            on_begin=self._engine_changed.set,
        )
        self._engine_start: asyncio.Future | None = None  # the engine's start, in a thread

    def _cache(self) -> CacheManager:
        metrics, stats = self.metrics, self.stats

        def count_eviction(tier: str, tenant_id: int | None = None) -> None:
            metrics.evictions.labels(tier=tier).inc()
            stats.count_eviction(tier, tenant_id)

        cache = CacheManager(
            engine=self.engine,
            store=get_store(),
            root=settings.LORAHUB_NODE_CACHE_DIR,
            public_keys=keys.published_public_keys,
            policy=make_policy(self.config.config.adapter_cache.gpu_hot.eviction_policy),
            limits=Limits.from_config(self.config.config),
            on_integrity_failure=self.trust.integrity_failure,
            on_evict=count_eviction,
            on_load=metrics.loaded,
            gate_rule=GateRule(
                max_passed=settings.LORAHUB_NODE_GATE_MAX_PASSED,
                wide=settings.LORAHUB_NODE_GATE_WIDE,
            ),
        )
        self.config.apply_to(cache)
        return cache

    def _add_shadows(self) -> None:
        """Shadow copies, on spare capacity: a copy starts only while callers hold at most
        LORAHUB_SHADOW_WHILE_BUSY_BELOW_PERCENT of the generation slots (bench/shadow.py:
        beside a busier batch, copies slowed callers' p95 TTFT on the CPU engine)."""
        self.requests.shadows = Shadows(
            admission=self.admission,
            answer=self.requests.answer_shadow,
            stats=self.stats,
            metrics=self.metrics,
            background=self.background,
            budget_share=settings.LORAHUB_SHADOW_BUDGET_PERCENT / 100,
        )
        busy_below = settings.LORAHUB_SHADOW_WHILE_BUSY_BELOW_PERCENT / 100
        slots = self.admission.max_concurrent
        self.requests.shadow_headroom = max(
            self.requests.shadows.budget, slots - max(1, int(slots * busy_below))
        )

    # --- the node registry ---------------------------------------------------------------

    def identity(self) -> node_registry.Identity:
        info = self.engine.info()
        host = settings.LORAHUB_NODE_HOST
        if host in ("0.0.0.0", "::", ""):  # noqa: S104 (a wildcard is not an address to call)
            host = socket.gethostname()
        return node_registry.Identity(
            name=self.name,
            url=settings.LORAHUB_NODE_URL or f"http://{host}:{settings.LORAHUB_NODE_PORT}",
            base_model=info.served_model_name or "",
            base_model_revision=info.base_model_revision or "",
            max_loras=info.max_loras or 0,
            max_cpu_loras=info.max_cpu_loras or 0,
            max_lora_rank=info.max_lora_rank or 0,
        )

    def engine_state(self) -> str:
        if self.drain.draining:
            return "draining"
        return "ready" if self.engine.is_ready else self.engine.info().state

    async def _heartbeat(self) -> None:
        """Register, then say every few seconds that this node is alive and what it serves.
        A database that does not answer is logged and retried: serving never waits on it."""
        while True:
            try:
                await offload.run(
                    node_registry.heartbeat,
                    self.identity(),
                    engine=self.engine_state(),
                    started_at=self.started_at,
                )
            except Exception:
                logger.warning("could not write this node's heartbeat; retrying", exc_info=True)
            self._engine_changed.clear()
            with contextlib.suppress(TimeoutError):  # a new engine state is written at once
                await asyncio.wait_for(
                    self._engine_changed.wait(), timeout=settings.LORAHUB_NODE_HEARTBEAT_S
                )

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self.stats.start()
        await self.config.reload()
        await self.changes.refresh_quarantines()
        spawn = self.background.spawn
        spawn(self._heartbeat(), name="heartbeat")
        spawn(self._start_engine(), name="engine-start")
        spawn(self._watch_engine(), name="engine-watchdog")
        spawn(self.changes.refresh_periodically(), name="full-refresh")
        spawn(self._expire_idle(), name="l2-ttl")
        if settings.LORAHUB_NODE_SCRUB_EVERY_S:
            spawn(self._scrub_idle(settings.LORAHUB_NODE_SCRUB_EVERY_S), name="l3-scrub")
        if settings.LORAHUB_NODE_PREFETCH_RISING:
            demand = self.requests.demand
            spawn(demand.run(self.cache, lambda: self.engine.is_ready), name="prefetch")
        spawn(
            self.changes.listen() if settings.LORAHUB_EVENTS_URL else self.changes.poll(),
            name="changes",
        )

    async def stop(self) -> None:
        self.engine.closing = True  # an engine still starting shuts down as soon as it is up
        await self.background.cancel_all()
        try:
            await offload.run(node_registry.deregister, self.name, started_at=self.started_at)
        except Exception:
            logger.warning("could not mark this node stopped in the registry", exc_info=True)
        if self._engine_start is not None and not self._engine_start.done():
            # Stopped while vLLM starts: its thread cannot be interrupted, and leaving it would
            # leave the engine core it is spawning without a parent. Wait for it (bounded).
            logger.warning("stopping while the engine starts; waiting for it to come up first")
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._engine_start), timeout=120)
        # On the loop's thread, so vLLM cancels its output handler before the core exits.
        self.engine.shutdown()
        download.stop()
        await offload.run(self.stats.stop)
        await offload.run(tracing.shutdown)  # the spans still batched go out
        # Whatever the node started and is still there (an engine whose start timed out
        # above, its workers, vLLM's helpers) ends with it.
        await offload.run(lifeline.end_descendants)

    def _register_base_model(self) -> None:
        """Record the base model this node serves in the registry, whose validation accepts
        adapters only for base models the platform serves: a deployment's first node is what
        lets its tenants upload (``make run`` and the tests also seed it themselves)."""
        engine = self.engine.settings
        registry_services.register_base_model(
            name=engine.served_model_name,
            revision=engine.base_model_revision,
            model_config=json.loads((Path(engine.model_dir) / "config.json").read_text()),
            max_lora_rank=engine.max_lora_rank,
        )

    async def _start_engine(self) -> None:
        try:
            await offload.run(self._register_base_model)
        except Exception:
            logger.warning("could not record this node's base model in the registry", exc_info=True)
        try:
            kept = await offload.run(lambda: self.cache.disk.rebuild(keys.published_public_keys()))
            self.cache.adopt(kept)
            self.cache.trim_disk()
            logger.info("disk cache: %d verified version folders kept", len(kept))
        except Exception:
            # Without the registry's keys nothing on disk can be trusted: start empty.
            logger.exception("could not re-verify the disk cache; clearing it")
            await offload.run(self.cache.disk.clear)
        try:
            await offload.run(download.start)
        except Exception:
            logger.exception("the download worker did not start; cold loads will retry it")
        try:
            self._engine_start = asyncio.ensure_future(offload.run(self.engine.start))
            await asyncio.shield(self._engine_start)
            await self.engine.list_adapters()  # attaches vLLM's output handler to this loop
        except Exception:
            logger.exception("the vLLM engine failed to start")
            self._engine_changed.set()
            return
        self._engine_changed.set()
        self.background.spawn(self.prewarm.run(), name="prewarm")

    async def _expire_idle(self) -> None:
        """Take versions idle longer than the TTL out of the engine (their disk copy stays)."""
        while True:
            self.config.changed.clear()
            with contextlib.suppress(TimeoutError):  # a new TTL takes effect at once
                await asyncio.wait_for(
                    self.config.changed.wait(),
                    timeout=min(30.0, max(0.2, self.cache.limits.ttl_s / 4)),
                )
            try:
                await evictions.expire_idle(self.cache)
            except Exception:
                logger.warning("TTL sweep failed", exc_info=True)

    async def _scrub_idle(self, every_s: float) -> None:
        """Re-hash one L3 copy against its seal every ``every_s`` while the node is idle:
        nothing in the engine's batch and nothing loading (``Landing.scrub_one``), so the
        hashing never takes the cores from a step."""
        while True:
            await asyncio.sleep(every_s)
            if self.engine.requests_in_flight() or self.cache.loading():
                continue
            try:
                await offload.run(self.cache.landing.scrub_one)
            except Exception:
                logger.warning("disk scrub failed", exc_info=True)

    async def _watch_engine(self) -> None:
        """Restart the engine if it dies; the placement forgets what the dead one held.
        Each second it also notes the engine's residency per tenant for the dashboards."""
        while True:
            await asyncio.sleep(1.0)
            self.stats.note_residency(self.cache.residency())
            if self.engine.info().state != "dead":
                continue
            logger.error("the vLLM engine died; restarting it")
            self.metrics.engine_restarts.inc()
            self.engine.state = "restarting"
            self._engine_changed.set()
            with contextlib.suppress(Exception):
                self.engine.shutdown()
            self.engine.state = "restarting"
            self.cache.forget_engine()
            await self._start_engine()

    # --- endpoints -------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        info = self.engine.info()
        ready = self.engine.is_ready and not self.drain.draining
        body = {
            "status": "ok" if ready else ("draining" if self.drain.draining else info.state),
            "engine": "ready" if self.engine.is_ready else info.state,
            "node": self.name,
            "base_model": info.served_model_name,
            "base_model_revision": info.base_model_revision,
            "lora": {
                "max_loras": info.max_loras,
                "max_cpu_loras": info.max_cpu_loras,
                "max_lora_rank": info.max_lora_rank,
            },
            "dtype": info.dtype,
            "engine_startup_s": round(info.started_s, 1) if info.started_s else None,
        }
        if ready:
            return JSONResponse(body, headers=node_header())
        return JSONResponse(body, status_code=503, headers={"Retry-After": "5", **node_header()})

    async def metrics_endpoint(self, request: Request) -> Response:
        """Metrics name tenants and adapters, so tenants must not read them: with an internal
        token set, the scraper sends it; without one, only this machine may scrape."""
        if settings.LORAHUB_INTERNAL_TOKEN:
            if not has_internal_token(request):
                return Response("metrics need the node's internal token\n", status_code=401)
        elif caller_address(
            request.client.host if request.client else "",
            request.headers.getlist("x-forwarded-for"),
        ) not in ("127.0.0.1", "::1"):
            return Response("metrics are served to this machine only\n", status_code=403)
        self.metrics.gpu_memory.set(self.cache.hot_bytes() / 1048576)
        self.metrics.engine_ready.set(1 if self.engine.is_ready and not self.drain.draining else 0)
        self.metrics.load_queue.set(self.cache.loading())
        for tenant, share in report.quota_usage(self.cache).items():
            self.metrics.quota_usage.labels(tenant=self.metrics.labels_for(tenant, "")[0]).set(
                share
            )
        self.metrics.in_flight.set(self.engine.requests_in_flight())
        self.metrics.stats_backlog.set(self.stats.backlog)
        return Response(
            self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )


def build_app(engine_settings: EngineSettings | None = None) -> Starlette:
    node = Node(engine_settings)
    requests, internal = node.requests, node.internal

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await node.start()
        try:
            yield
        finally:
            await node.stop()

    app = Starlette(
        routes=[
            Route("/healthz", node.healthz),
            Route("/metrics", node.metrics_endpoint),
            Route("/v1/completions", requests.completions, methods=["POST"]),
            Route("/v1/chat/completions", requests.chat_completions, methods=["POST"]),
            Route("/v1/models", requests.models),
            Route("/internal/warm", internal.warm, methods=["POST"]),
            Route("/internal/evict", internal.evict, methods=["POST"]),
            Route("/internal/cache", internal.cache_state),
            Route("/internal/alias", internal.alias),
            Route("/internal/prewarm", internal.prewarm, methods=["POST"]),
            Route("/internal/generate", internal.generate, methods=["POST"]),
            Route("/internal/test-seams/faults", internal.test_seam_faults, methods=["POST"]),
        ],
        lifespan=lifespan,
        middleware=[
            *spans.middleware(),  # the server span, when this node sends traces
            Middleware(BodyLimit, limit_bytes=settings.LORAHUB_NODE_MAX_BODY_KB * 1024),
            Middleware(node.drain.middleware),
        ],
    )
    app.state.node = node
    return app
