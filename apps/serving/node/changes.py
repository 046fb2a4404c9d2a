"""How a serving node follows the registry's changes: alias moves, keys, cache settings,
quarantines.

- With a broadcast channel (``LORAHUB_EVENTS_URL``, Redis pub/sub), each change message
  drops or replaces the node's cached entry at once (``listen``); a lost channel falls back to
  watching the database's change marker until it is back.
- Without one, the node watches that marker every ``POLL_S`` (``poll``).
- Either way a full refresh of aliases and keys runs every ``LORAHUB_NODE_FULL_REFRESH_S``.

An alias move also prepares the cache before traffic follows it (``follow_alias``): a new
canary is landed on disk, a version the alias no longer uses leaves the engine once its last
request is done (``demote``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from django.conf import settings

from apps.serving import offload
from apps.serving.cache import evictions
from apps.serving.cache.manager import CacheManager
from apps.serving.node.background import BackgroundTasks
from apps.serving.node.config_in_force import ConfigInForce
from apps.serving.node.lookups import Lookups
from apps.serving.node.trust import Trust

logger = logging.getLogger(__name__)
POLL_S = 0.5


class ChangeFollower:
    def __init__(
        self,
        *,
        lookups: Lookups,
        trust: Trust,
        cache: CacheManager,
        config: ConfigInForce,
        background: BackgroundTasks,
    ) -> None:
        self.lookups, self.trust, self.cache = lookups, trust, cache
        self.config, self.background = config, background

    async def refresh_quarantines(self) -> None:
        """Refuse exactly the versions with an open quarantine of this node (an operator's
        lift takes effect here)."""
        found = await self.trust.open_quarantines()
        if found is not None:
            self.cache.quarantined = found

    async def _changed(self) -> None:
        await self.config.reload()
        await self.refresh_quarantines()

    async def refresh_periodically(self) -> None:
        while True:
            try:
                await offload.run(self.lookups.full_refresh)
            except Exception:
                logger.exception("full refresh of aliases and keys failed; retrying")
            await self.refresh_quarantines()
            await asyncio.sleep(settings.LORAHUB_NODE_FULL_REFRESH_S)

    async def poll(self) -> None:
        """Without a broadcast channel: watch the database's change marker."""
        while True:
            try:
                if await offload.run(self.lookups.poll):
                    await self._changed()
            except Exception:
                logger.exception("polling for changes failed; retrying")
            await asyncio.sleep(POLL_S)

    async def listen(self) -> None:
        """Drop cached entries as change broadcasts arrive (Redis pub/sub)."""
        import redis.asyncio as aioredis

        while True:
            client = aioredis.Redis.from_url(settings.LORAHUB_EVENTS_URL)
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(settings.LORAHUB_EVENTS_CHANNEL)
                    # Anything missed while (re)connecting is caught by one full refresh.
                    await offload.run(self.lookups.full_refresh)
                    async for message in pubsub.listen():
                        if message.get("type") != "message":
                            continue
                        try:
                            change = json.loads(message["data"])
                            previous = self.lookups.apply_change(change)
                        except (ValueError, TypeError):
                            logger.warning("ignored a malformed change message")
                            continue
                        if change.get("kind") == "alias":
                            self.background.spawn(self.follow_alias(change, previous))
                        elif change.get("kind") == "cache_config":
                            self.background.spawn(self.config.reload())
                        elif change.get("kind") == "quarantine":
                            self.background.spawn(self.refresh_quarantines())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Until the channel is back, watch the database's change marker instead, so
                # alias moves still arrive within about a second (not at the next refresh).
                logger.warning("change channel lost (%s); polling until it is back", exc)
                try:
                    if await offload.run(self.lookups.poll):
                        await self._changed()
                except Exception:
                    logger.warning("polling for changes failed too", exc_info=True)
                await asyncio.sleep(POLL_S * 2)
            finally:
                await client.aclose()

    async def follow_alias(self, change: dict, previous) -> None:
        """Prepare the cache for an alias move before traffic follows it.

        A new canary or shadow version is landed on disk (L3: the download and full
        verification, the slow part) so its first requests do not pay for them. A version
        the alias no longer uses (rolled back, replaced) leaves the engine's slots; its disk
        copy stays for a quick return.
        """
        try:
            current = await offload.run(
                self.lookups.alias,
                int(change.get("tenant_id") or 0),
                str(change.get("name")),
            )
            if current is None:
                return
            in_use = {current.stable.version_id}
            for coming in (current.canary, current.shadow):
                if coming is None:
                    continue
                in_use.add(coming.version_id)
                if coming.servable and await self.trust.signature_ok(coming):
                    await offload.run(self.cache.land, coming)
            for version_id in in_use:  # e.g. rolled back to: no longer on its way out
                self.cache.deprecate(version_id, False)
            if previous is not None:
                for old in (previous.stable, previous.canary, previous.shadow):
                    if old is not None and old.version_id not in in_use:
                        self.background.spawn(self.demote(old.version_id))
        except Exception:
            logger.warning("could not prepare the cache for an alias change", exc_info=True)

    async def demote(self, version_id: int, patience_s: float = 120.0) -> None:
        """Take a version the alias stopped using out of the engine once its last running
        request is done (removing it under one would kill the engine core)."""
        self.cache.deprecate(version_id)  # first to go from disk, too
        deadline = time.monotonic() + patience_s
        while self.cache.in_use(version_id) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await evictions.evict_unused(self.cache, version_id)
