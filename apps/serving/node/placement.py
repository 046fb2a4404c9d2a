"""Step 4 of the request path: placing a request's version, then boarding it into the engine.

``place`` at arrival: the version ready to enter the engine with the request (in the engine,
or its L3 copy landed and checked: ``CacheManager.prepare``), or the tier's overload action
(degrade to the base model, or 503). ``board`` right before the send: the version held from
there, loaded by the request's own step if it is not in the engine (``CacheManager.board``).
``finishing``, ``leave_engine`` and ``let_go`` give back the device slot and the version.
"""

from __future__ import annotations

from apps.serving.cache.engine_tiers import Owner
from apps.serving.cache.landing import AdapterIntegrityError, DiskFull
from apps.serving.cache.manager import CacheManager, LoadDeadline, LoadQueueFull, Placed
from apps.serving.node import errors
from apps.serving.node.config_in_force import ConfigInForce
from apps.serving.node.demand import Demand
from apps.serving.node.metrics import NodeMetrics
from apps.serving.node.record import RequestTrace


class Placement:
    def __init__(
        self, *, cache: CacheManager, config: ConfigInForce, metrics: NodeMetrics, demand: Demand
    ) -> None:
        self.cache, self.config, self.metrics, self.demand = cache, config, metrics, demand

    async def place(
        self, trace: RequestTrace, *, deadline_s: float | None = None, demand: bool = True
    ):
        """Step 4: the adapter's handle, once it is ready to enter the engine with the request
        (in the engine, or its L3 copy landed and checked: ``CacheManager.prepare``); None
        for the base model. The request does not hold its version while it waits for a seat
        and a device slot: it boards the engine after them (``board``).

        A request waits for a cold load as long as its tenant tier's deadline allows. When
        the load queue is full or the deadline passes, the tier's overload action applies:
        the base model answers (``degrade``), or 503 with ``Retry-After``.
        """
        trace.mark("placing")
        if trace.resolved is None:
            return None
        caller = trace.caller
        assert caller is not None
        sla = self.config.sla(caller.priority)
        owner = Owner(
            tenant_id=caller.tenant_id,
            priority=caller.priority,
            warm_quota=caller.max_warm_adapters,
            hot_quota=caller.max_hot_adapters,
        )
        if demand:  # a caller's request; a shadow copy is nobody's demand
            self.demand.arrived(trace.resolved, owner)
        try:
            placed: Placed = await self.cache.prepare(
                trace.resolved,
                owner=owner,
                deadline_s=sla.deadline_ms / 1000 if deadline_s is None else deadline_s,
                wait_for_room=sla.on_overload == "wait",
            )
        except (LoadQueueFull, LoadDeadline) as exc:
            if sla.on_overload == "degrade":
                trace.tier, trace.degraded = "base", True
                self.metrics.degraded.labels(
                    tenant=self.metrics.labels_for(caller.tenant_slug, "")[0]
                ).inc()
                return None
            self.metrics.overloaded.inc()
            raise errors.api_error(exc, label=trace.resolved.label) from None
        except (DiskFull, AdapterIntegrityError) as exc:
            raise errors.api_error(exc, label=trace.resolved.label) from None
        trace.tier, trace.load_ms, trace.load_caused = placed.tier, placed.load_ms, placed.started
        if placed.timings:  # this request waited for a load: what the load itself cost
            trace.load_work_ms = sum(placed.timings.values())
        trace.held, trace.placed, trace.owner = placed.handle.lora_id, placed, owner
        return placed.handle

    async def board(self, trace: RequestTrace) -> None:
        """Into the engine, right before the request is sent: its version held from here on,
        and loaded by the request's own step if it is not in the engine (left it while the
        request waited, or was never in: ``CacheManager.board``). Nothing may await between
        this and the send."""
        if trace.placed is None or trace.resolved is None:
            return
        loaded = await self.cache.board(trace.resolved, owner=trace.owner, placed=trace.placed)
        trace.boarded = True
        trace.load_caused = loaded is not None  # its step loads the version into the engine
        if loaded is not None and trace.tier in ("L1", "L2"):
            trace.tier = loaded  # it left the engine while the request waited

    def leave_engine(self, trace: RequestTrace) -> None:
        """The request is out of the engine's batch (once per request): its device slot and
        its hold on the version go now, as vLLM finishes it, not when its response's last
        byte is written. A version is held while a request inside vLLM uses it; held until
        the response ended, a gate as wide as the host slots let in a sixteenth adapter while
        a finished stream still held the last host slot, and that load waited for a release
        (seed bench: 140 at C=32)."""
        if trace.active:
            self.cache.leave_engine(trace.held, finishing=trace.finishing)
            trace.active = False
        if trace.held is not None and trace.boarded:
            self.cache.release(trace.held)
            trace.held = None

    def finishing(self, trace: RequestTrace) -> None:
        """The request has one token left: its device slot may go to the next adapter."""
        if trace.active and not trace.finishing:
            trace.finishing = True
            self.cache.finishing_in_engine(trace.held)

    def let_go(self, trace: RequestTrace) -> None:
        """The request no longer needs its adapter in the engine (once per request)."""
        self.leave_engine(trace)  # a boarded request's hold goes there
        if trace.held is not None:
            self.cache.stop_waiting(trace.held)
            trace.held = None
