"""The serving node: the engine's lifecycle, the node's background work, and its ASGI app.

Routes: ``/healthz``, ``/metrics`` and the OpenAI-compatible ``/v1/*`` (see ``requests.py``).
The engine starts in the background, so ``/healthz`` answers at once: 503 while the engine
starts or restarts, 200 with the base model, its revision and the LoRA limits when ready.
A watchdog restarts a dead engine; requests meanwhile get 503 with ``Retry-After``. How the
node follows the registry's changes is in ``changes.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from django.conf import settings
from django.utils import timezone
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from apps.registry import keys
from apps.registry.storage import get_store
from apps.serving import node_registry, quarantine
from apps.serving.cache import download
from apps.serving.cache.disk import IntegrityFailure, verify_manifest
from apps.serving.cache.manager import CacheManager, Limits
from apps.serving.cache.policy import make_policy
from apps.serving.config import effective_config
from apps.serving.node import offload
from apps.serving.node.changes import ChangeFollower
from apps.serving.node.engine import Engine, EngineSettings
from apps.serving.node.internal_api import InternalApi, has_internal_token
from apps.serving.node.lookups import Lookups
from apps.serving.node.metrics import NodeMetrics
from apps.serving.node.requests import RequestPath
from apps.serving.node_registry import node_header
from apps.serving.stats import StatsRecorder, prewarm_candidates
from lorahub.cacheconfig import CacheConfig, SlaTier

logger = logging.getLogger(__name__)


class RateLimiter:
    """A token bucket per tenant: ``rpm`` requests per minute, bursts up to ``rpm``."""

    def __init__(self) -> None:
        self._buckets: dict[int, tuple[float, float]] = {}

    def allow(self, tenant_id: int, rpm: int) -> bool:
        if rpm <= 0:
            return False
        now = time.monotonic()
        tokens, last = self._buckets.get(tenant_id, (float(rpm), now))
        tokens = min(float(rpm), tokens + (now - last) * rpm / 60.0)
        if tokens < 1.0:
            self._buckets[tenant_id] = (tokens, now)
            return False
        self._buckets[tenant_id] = (tokens - 1.0, now)
        return True


class ServingNode:
    def __init__(self, engine_settings: EngineSettings | None = None) -> None:
        # The configuration in force: an operator's stored one, else the node's YAML file.
        # The engine's LoRA slots and rank are fixed by it until the node restarts.
        self.config: CacheConfig = effective_config()
        self.started_with = self.config
        self.engine = Engine(
            engine_settings or EngineSettings.from_django_settings(self.started_with)
        )
        self.directory = Lookups()
        self.metrics = NodeMetrics()
        self.stats = StatsRecorder(
            settings.LORAHUB_NODE_NAME, on_drop=self.metrics.stats_dropped.inc
        )
        self.needs_restart: list[str] = []
        self._config_changed = asyncio.Event()
        self.placement = CacheManager(
            engine=self.engine,
            store=get_store(),
            root=settings.LORAHUB_NODE_CACHE_DIR,
            public_keys=keys.published_public_keys,
            policy=make_policy(self.config.adapter_cache.gpu_hot.eviction_policy),
            limits=Limits.from_config(self.config),
            on_integrity_failure=self._integrity_failure,
            on_evict=self.evicted,
            on_load=lambda tier, ms: self.metrics.load_latency.labels(source_tier=tier).observe(ms),
        )
        self.rate = RateLimiter()
        self.inference = RequestPath(self)
        self.slots = asyncio.Semaphore(settings.LORAHUB_NODE_MAX_CONCURRENT)
        self.max_queue = settings.LORAHUB_NODE_MAX_QUEUE
        self.waiting = 0
        self._tasks: list[asyncio.Task] = []
        self.changes = ChangeFollower(self)
        self._verified: dict[tuple[int, str], bool] = {}
        self.name = settings.LORAHUB_NODE_NAME
        self.started_at = timezone.now()
        self._engine_changed = asyncio.Event()  # ready, dead, restarting: tell the registry

    def _integrity_failure(self, resolved, tier: str, reason: str) -> None:
        """Count it; a failure at the registry (L4) also goes to the audit log (blocking)."""
        self.metrics.integrity_failures.labels(tier=tier).inc()
        if tier == "L4":
            from apps.registry.models import AdapterVersion
            from apps.tenants import services as tenant_services

            version = (
                AdapterVersion.objects.select_related("adapter__tenant")
                .filter(pk=resolved.version_id)
                .first()
            )
            if version is not None:
                quarantine.record(version_id=version.pk, node=self.name, tier=tier, reason=reason)
                tenant_services.record_event(
                    action="version.quarantine",
                    obj=version,
                    tenant=version.adapter.tenant,
                    after={"node": self.name, "tier": tier},
                    note=reason,
                )

    # --- configuration ---------------------------------------------------------------------

    def sla(self, priority: int) -> SlaTier:
        """The load deadline and overload action of a tenant tier."""
        name = {0: "batch", 2: "premium"}.get(priority, "standard")
        return self.config.adapter_cache.load_queue.sla[name]  # type: ignore[index]

    def apply_config(self, config: CacheConfig) -> None:
        """Take an operator's configuration live; what needs a node restart waits."""
        self.needs_restart = config.restart_fields(self.started_with)
        self.config = config
        self.placement.apply(config)
        self._config_changed.set()
        self.placement.trim_disk()

    async def refresh_quarantines(self) -> None:
        """Refuse exactly the versions with an open quarantine of this node (an operator's
        lift takes effect here)."""
        try:
            self.placement.quarantined = await offload.run(quarantine.open_on, self.name)
        except Exception:
            logger.warning("could not read this node's quarantines; keeping the set in force")

    async def reload_config(self) -> None:
        try:
            self.apply_config(await offload.run(effective_config))
            logger.info(
                "cache config applied (policy %s)%s",
                self.placement.policy.name,
                f"; waiting for a node restart: {', '.join(self.needs_restart)}"
                if self.needs_restart
                else "",
            )
        except Exception:
            logger.exception("could not apply the cache config; keeping the one in force")

    async def signature_ok(self, resolved) -> bool:
        """Ed25519 check of the version's signed manifest, remembered per (version, signature):
        a version is immutable, so a changed signature is a different question."""
        key = (resolved.version_id, resolved.signature)
        if key not in self._verified:
            public = await offload.run(keys.published_public_keys)
            if len(self._verified) > 10_000:
                self._verified.clear()
            try:
                verify_manifest(resolved, public)
                self._verified[key] = True
            except IntegrityFailure:
                self._verified[key] = False
        return self._verified[key]

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
        await self.reload_config()
        await self.refresh_quarantines()
        self._tasks = [
            asyncio.create_task(self._heartbeat(), name="heartbeat"),
            asyncio.create_task(self._start_engine(), name="engine-start"),
            asyncio.create_task(self._watch_engine(), name="engine-watchdog"),
            asyncio.create_task(self.changes.refresh_periodically(), name="full-refresh"),
            asyncio.create_task(self._expire_idle(), name="l2-ttl"),
            asyncio.create_task(
                self.changes.listen() if settings.LORAHUB_EVENTS_URL else self.changes.poll(),
                name="changes",
            ),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await offload.run(node_registry.deregister, self.name, started_at=self.started_at)
        except Exception:
            logger.warning("could not mark this node stopped in the registry", exc_info=True)
        # On the loop's thread, so vLLM cancels its output handler before the core exits.
        self.engine.shutdown()
        download.stop()
        await offload.run(self.stats.stop)

    async def _start_engine(self) -> None:
        try:
            kept = await offload.run(
                lambda: self.placement.disk.rebuild(keys.published_public_keys())
            )
            self.placement.adopt(kept)
            self.placement.trim_disk()
            logger.info("disk cache: %d verified version folders kept", len(kept))
        except Exception:
            # Without the registry's keys nothing on disk can be trusted: start empty.
            logger.exception("could not re-verify the disk cache; clearing it")
            await offload.run(self.placement.disk.clear)
        try:
            await offload.run(download.start)
        except Exception:
            logger.exception("the download worker did not start; cold loads will retry it")
        try:
            await offload.run(self.engine.start)
            await self.engine.list_adapters()  # attaches vLLM's output handler to this loop
        except Exception:
            logger.exception("the vLLM engine failed to start")
            self._engine_changed.set()
            return
        self._engine_changed.set()
        self.spawn(self.prewarm())

    async def prewarm(self) -> list[str]:
        """Warm what will be asked for: the most-requested versions of the last hours and the
        configured aliases. Each lands on disk (L3); while the engine's host cache has room
        they are loaded (L2) too. Nothing is evicted for a guess. Returns the labels warmed."""
        warmed: list[str] = []
        try:
            candidates = await offload.run(prewarm_candidates, self.config, self.name)
        except Exception:
            logger.warning("could not read what to prewarm", exc_info=True)
            return warmed
        for resolved in candidates:
            try:
                self.inference.admit(resolved)
                if not await self.signature_ok(resolved):
                    continue
                room = self.placement.in_engine() < self.engine.settings.max_cpu_loras
                if room and self.engine.is_ready:
                    await self.placement.place(resolved)
                else:
                    await offload.run(self.placement.to_disk, resolved)
                warmed.append(resolved.label)
            except Exception as exc:  # one bad candidate must not stop the rest
                logger.info("did not prewarm %s: %s", resolved.label, exc)
        if warmed:
            logger.info("prewarmed %d versions: %s", len(warmed), ", ".join(warmed))
        return warmed

    async def _expire_idle(self) -> None:
        """Take versions idle longer than the TTL out of the engine (their disk copy stays)."""
        while True:
            self._config_changed.clear()
            with contextlib.suppress(TimeoutError):  # a new TTL takes effect at once
                await asyncio.wait_for(
                    self._config_changed.wait(),
                    timeout=min(30.0, max(0.2, self.placement.limits.ttl_s / 4)),
                )
            try:
                await self.placement.expire_idle()
            except Exception:
                logger.warning("TTL sweep failed", exc_info=True)

    def evicted(self, tier: str, tenant_id: int | None = None) -> None:
        """An adapter left a tier: counted in the metrics and in the dashboards' statistics."""
        self.metrics.evictions.labels(tier=tier).inc()
        self.stats.count_eviction(tier, tenant_id)

    async def _watch_engine(self) -> None:
        """Restart the engine if it dies; the placement forgets what the dead one held.
        Each second it also notes the engine's residency per tenant for the dashboards."""
        while True:
            await asyncio.sleep(1.0)
            self.stats.note_residency(self.placement.residency())
            if self.engine.info().state != "dead":
                continue
            logger.error("the vLLM engine died; restarting it")
            self.engine.state = "restarting"
            self._engine_changed.set()
            with contextlib.suppress(Exception):
                self.engine.shutdown()
            self.engine.state = "restarting"
            self.placement.forget_engine()
            await self._start_engine()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as one of the node's background tasks (cancelled at stop)."""
        task = asyncio.create_task(coro)
        self._tasks.append(task)

        def forget(done: asyncio.Task) -> None:
            if done in self._tasks:
                self._tasks.remove(done)

        task.add_done_callback(forget)

    # --- endpoints -------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        info = self.engine.info()
        ready = self.engine.is_ready
        body = {
            "status": "ok" if ready else info.state,
            "engine": "ready" if ready else info.state,
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
        elif request.client is None or request.client.host not in ("127.0.0.1", "::1"):
            return Response("metrics are served to this machine only\n", status_code=403)
        self.metrics.gpu_memory.set(self.placement.hot_bytes() / 1048576)
        self.metrics.load_queue.set(self.placement.loading())
        for tenant, share in self.placement.quota_usage().items():
            self.metrics.quota_usage.labels(tenant=self.metrics.labels_for(tenant, "")[0]).set(
                share
            )
        self.metrics.in_flight.set(self.engine.requests_in_flight())
        self.metrics.stats_backlog.set(self.stats.backlog)
        return Response(
            self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )


def build_app(engine_settings: EngineSettings | None = None) -> Starlette:
    node = ServingNode(engine_settings)
    inference = node.inference
    internal = InternalApi(inference)

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
            Route("/v1/completions", inference.completions, methods=["POST"]),
            Route("/v1/chat/completions", inference.chat_completions, methods=["POST"]),
            Route("/v1/models", inference.models),
            Route("/internal/warm", internal.warm, methods=["POST"]),
            Route("/internal/evict", internal.evict, methods=["POST"]),
            Route("/internal/cache", internal.cache),
            Route("/internal/alias", internal.alias),
            Route("/internal/prewarm", internal.prewarm, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
    app.state.node = node
    return app
