"""Prewarming: warm what will be asked for before it is asked for."""

from __future__ import annotations

import logging

from apps.serving import offload
from apps.serving.cache.manager import CacheManager
from apps.serving.node.config_in_force import ConfigInForce
from apps.serving.node.engine import Engine
from apps.serving.node.trust import Trust
from apps.serving.stats import prewarm_candidates

logger = logging.getLogger(__name__)


class Prewarm:
    def __init__(
        self,
        *,
        config: ConfigInForce,
        trust: Trust,
        cache: CacheManager,
        engine: Engine,
        node_name: str,
    ) -> None:
        self.config, self.trust, self.cache, self.engine = config, trust, cache, engine
        self.node_name = node_name

    async def run(self) -> list[str]:
        """The most-requested versions of the last hours and the configured aliases: each
        lands on disk (L3); while the engine's host cache has room they are loaded (L2) too.
        Nothing is evicted for a guess. Returns the labels warmed."""
        warmed: list[str] = []
        try:
            candidates = await offload.run(prewarm_candidates, self.config.config, self.node_name)
        except Exception:
            logger.warning("could not read what to prewarm", exc_info=True)
            return warmed
        for resolved in candidates:
            try:
                await self.trust.admit(resolved)
                room = self.cache.in_engine() < self.engine.settings.max_cpu_loras
                if room and self.engine.is_ready:
                    await self.cache.activate(resolved)
                else:
                    await offload.run(self.cache.land, resolved)
                warmed.append(resolved.label)
            except Exception as exc:  # one bad candidate must not stop the rest
                logger.info("did not prewarm %s: %s", resolved.label, exc)
        if warmed:
            logger.info("prewarmed %d versions: %s", len(warmed), ", ".join(warmed))
        return warmed
