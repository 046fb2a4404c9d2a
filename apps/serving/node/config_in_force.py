"""The adapter-cache configuration a node runs with: an operator's stored one, else the node's
YAML file. Changes apply at once to the cache manager (policy, caps, TTL, load queue); what
only a restart can change (LoRA slots, rank, base model) is listed in ``needs_restart``."""

from __future__ import annotations

import asyncio
import logging

from apps.serving import offload
from apps.serving.cache.manager import CacheManager
from apps.serving.config import effective_config
from lorahub.cacheconfig import CacheConfig, SlaTier

logger = logging.getLogger(__name__)


class ConfigInForce:
    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.started_with = config  # the engine's LoRA slots and rank are fixed by it
        self.needs_restart: list[str] = []
        self.changed = asyncio.Event()  # set on every change (the TTL sweep waits on it)
        self._cache: CacheManager | None = None

    def apply_to(self, cache: CacheManager) -> None:
        """The cache manager that follows this configuration."""
        self._cache = cache

    def sla(self, priority: int) -> SlaTier:
        """The load deadline and overload action of a tenant tier."""
        name = {0: "batch", 2: "premium"}.get(priority, "standard")
        return self.config.adapter_cache.load_queue.sla[name]  # type: ignore[index]

    def apply(self, config: CacheConfig) -> None:
        """Take an operator's configuration live; what needs a node restart waits."""
        self.needs_restart = config.restart_fields(self.started_with)
        self.config = config
        if self._cache is not None:
            self._cache.apply(config)
            self._cache.trim_disk()
        self.changed.set()

    async def reload(self) -> None:
        try:
            self.apply(await offload.run(effective_config))
            logger.info(
                "cache config applied (policy %s)%s",
                self._cache.policy.name
                if self._cache is not None
                else self.config.adapter_cache.gpu_hot.eviction_policy,
                f"; waiting for a node restart: {', '.join(self.needs_restart)}"
                if self.needs_restart
                else "",
            )
        except Exception:
            logger.exception("could not apply the cache config; keeping the one in force")
