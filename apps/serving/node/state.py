"""What the request path needs of the serving node, as a protocol.

``requests.py``, ``internal_api.py`` and ``changes.py`` work on the node's state through
``NodeState``; ``assembly.ServingNode`` provides it (mypy checks that). So the node imports
the request path and never the other way round: no import cycle between the node's state and
the code that serves requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol

from apps.registry.aliases import ResolvedVersion
from apps.serving.cache.manager import CacheManager
from apps.serving.node.engine import Engine
from apps.serving.node.lookups import Lookups
from apps.serving.node.metrics import NodeMetrics
from apps.serving.stats import StatsRecorder
from lorahub.cacheconfig import SlaTier


class RequestRate(Protocol):
    def allow(self, tenant_id: int, rpm: int) -> bool: ...


class NodeState(Protocol):
    engine: Engine
    metrics: NodeMetrics
    placement: CacheManager
    directory: Lookups
    stats: StatsRecorder
    slots: asyncio.Semaphore  # generation slots
    waiting: int  # requests admitted and waiting for a slot or a load
    max_queue: int
    needs_restart: list[str]  # configuration that waits for a node restart

    @property
    def rate(self) -> RequestRate: ...  # requests per minute, per tenant

    def sla(self, priority: int) -> SlaTier: ...

    async def signature_ok(self, resolved: ResolvedVersion) -> bool: ...

    async def prewarm(self) -> list[str]: ...

    def evicted(self, tier: str, tenant_id: int | None = None) -> None: ...

    async def reload_config(self) -> None: ...

    async def refresh_quarantines(self) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...
