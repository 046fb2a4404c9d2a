"""Change broadcasts to serving nodes: "something a node caches has changed".

Published after the change commits (``transaction.on_commit``), to Redis pub/sub when
configured, so every node on every machine drops its cached view within milliseconds. A
message only names what changed; nodes re-read the database, which stays the source of truth.
When Redis is not configured (the embedded default) nothing is sent and nodes poll the
database instead; a lost message is covered by the nodes' periodic full refresh.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache

from django.conf import settings
from django.db import transaction

logger = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def _client():
    import redis

    return redis.Redis.from_url(settings.LORAHUB_EVENTS_URL, socket_timeout=2)


def _send(payload: dict) -> None:
    if not settings.LORAHUB_EVENTS_URL:
        return
    try:
        _client().publish(settings.LORAHUB_EVENTS_CHANNEL, json.dumps(payload))
    except Exception:  # a broadcast must never fail the change it reports
        logger.warning(
            "could not broadcast %s; nodes will catch up on their next refresh",
            payload,
            exc_info=True,
        )


def publish_change(kind: str, **fields: object) -> None:
    """Broadcast once the current transaction commits (at once outside a transaction)."""
    payload = {"kind": kind, **fields}
    transaction.on_commit(lambda: _send(payload))
