"""The node's in-memory view of API keys, aliases and quotas. The database stays the truth.

Lookups on the request path are dictionary reads, on the node's event loop (``cached_*``).
A miss reads the database once, in a worker thread, and caches the answer (including "no
such key"). Entries are dropped when a change broadcast names them
(``apps/tenants/events.py``), and everything is reloaded by a periodic full refresh, the safety
net for a lost message (it re-reads the keys it knows rather than forgetting them, so the
node keeps its callers through a database outage that follows it). Every other method is
synchronous and may touch the database: the node calls those from a worker thread, never
from its event loop.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from django.db import close_old_connections, connection
from django.db.models import Field

from apps.fleet.models import Quarantine
from apps.registry import snapshots
from apps.registry.contracts import AliasSnapshot
from apps.registry.models import Alias
from apps.serving.models import CacheSettings
from apps.tenants import services as tenant_services
from apps.tenants.errors import KeyExpired
from apps.tenants.models import ApiKey, Quota, Tenant

logger = logging.getLogger(__name__)
MISS_TTL_S = 5.0
UNKNOWN = object()  # not in the cache: only the database can answer
# Entries each table keeps, the oldest written going first: callers send keys and model names
# the node has never seen (a miss is cached too), so memory is bounded by these, not by
# traffic. Past them, a forgotten key or alias costs one database read again.
MAX_CALLERS = 50_000
MAX_ALIASES = 50_000


class Bounded(OrderedDict):
    """A dict that keeps at most ``limit`` entries, forgetting the oldest written first."""

    def __init__(self, limit: int, items: Iterable = ()) -> None:
        super().__init__()
        self.limit = limit
        for key, value in dict(items).items():
            self[key] = value

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


# What the change marker watches: (aggregate, model, field). A new or deleted alias changes
# the count, a moved one its updated_at; a revoked key, a changed quota or cache setting, a
# new tenant and a lifted quarantine each move one value (a node opens its own quarantines,
# so only an operator's lift is news to it).
_MARKED = (
    ("MAX", Alias, "updated_at"),
    ("COUNT", Alias, "id"),
    ("MAX", ApiKey, "revoked_at"),
    ("MAX", Quota, "updated_at"),
    ("COUNT", Tenant, "id"),
    ("MAX", CacheSettings, "updated_at"),
    ("MAX", Quarantine, "lifted_at"),
)


@functools.cache
def _marker_sql() -> str:
    """The change marker's one query. Every name in it comes from the models' metadata,
    quoted by the database backend; nothing from outside reaches it."""
    q = connection.ops.quote_name
    parts = []
    for fn, model, field in _MARKED:
        column = cast(str, cast(Field, model._meta.get_field(field)).column)
        table = model._meta.db_table
        parts.append(f"(SELECT {fn}({q(column)}) FROM {q(table)})")  # noqa: S608
    return "SELECT " + ", ".join(parts)


@dataclass(frozen=True)
class Caller:
    """Who is calling the node: the API key's tenant and its limits."""

    key_prefix: str
    tenant_id: int
    tenant_slug: str
    priority: int
    requests_per_minute: int
    max_hot_adapters: int = 2  # pinned in L1
    max_warm_adapters: int = 8  # in the engine, L1 + L2
    engine_weight: int = 100  # percent of the tier's share of the engine (tenants/shares.py)
    expires_at: float | None = None  # the key's expiry (epoch seconds), None: never


@dataclass(frozen=True)
class Expired:
    """A key past its expiry: the node answers 401 ``key_expired`` with this message."""

    message: str


def _digest(plaintext: str) -> str:
    """The key's SHA-256, which is also what the database keeps (``ApiKey.key_hash``)."""
    return hashlib.sha256(plaintext.encode()).hexdigest()


def _caller_of(key: ApiKey, quota: Quota) -> Caller:
    return Caller(
        key_prefix=key.prefix,
        tenant_id=key.tenant_id,
        tenant_slug=key.tenant.slug,
        priority=key.tenant.priority,
        requests_per_minute=quota.requests_per_minute,
        max_hot_adapters=quota.max_hot_adapters,
        max_warm_adapters=quota.max_warm_adapters,
        engine_weight=quota.engine_weight,
        expires_at=key.expires_at.timestamp() if key.expires_at else None,
    )


def _reread_callers(digests: list[str]) -> dict[str, Caller | float]:
    """The callers behind these key digests as the database has them now: a revoked or
    deleted key is left out (its next call asks the database and is refused)."""
    keys = ApiKey.objects.active().select_related("tenant").filter(key_hash__in=digests)
    quotas: dict[int, Quota] = {}
    callers: dict[str, Caller | float] = {}
    for key in keys:
        if key.tenant_id not in quotas:
            quotas[key.tenant_id] = tenant_services.get_quota(key.tenant)
        callers[key.key_hash] = _caller_of(key, quotas[key.tenant_id])
    return callers


class Lookups:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # digest -> Caller, or the time of a miss
        self._callers: Bounded = Bounded(MAX_CALLERS)
        self._aliases: Bounded = Bounded(MAX_ALIASES)  # (tenant id, name) -> snapshot or None
        self.marker: tuple | None = None
        # Bumped by every invalidation: a lookup that started before one does not cache its
        # (possibly stale) answer.
        self._generation = 0
        self.refreshed_at = 0.0

    # --- callers ---------------------------------------------------------------------------

    def cached_caller(self, plaintext: str) -> Caller | Expired | object | None:
        """The caller from memory alone (the event loop may call this): a ``Caller``, None for
        a key known to be bad, ``Expired`` for a key past its expiry (checked on every call,
        so a cached key stops at its expiry), or ``UNKNOWN`` when the database must be asked
        (``caller``)."""
        cached = self._callers.get(_digest(plaintext))
        if isinstance(cached, Caller):
            if cached.expires_at is not None and time.time() >= cached.expires_at:
                return Expired(
                    f"the API key lh_{cached.key_prefix}_… expired at "
                    f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(cached.expires_at))} UTC; "
                    "ask an admin of the tenant for a new key"
                )
            return cached
        if isinstance(cached, float) and time.monotonic() - cached < MISS_TTL_S:
            return None
        return UNKNOWN

    def caller(self, plaintext: str, address: str | None = None) -> Caller | Expired | None:
        cached = self.cached_caller(plaintext)
        if cached is not UNKNOWN:
            return cached  # type: ignore[return-value]
        digest = _digest(plaintext)
        generation = self._generation
        try:
            key = tenant_services.authenticate_api_key(plaintext, address=address)
        except KeyExpired as exc:
            return Expired(exc.message)
        if key is None:
            if generation == self._generation:
                self._callers[digest] = time.monotonic()
            return None
        caller = _caller_of(key, tenant_services.get_quota(key.tenant))
        if generation == self._generation:
            self._callers[digest] = caller
        return caller

    # --- aliases ---------------------------------------------------------------------------

    def cached_alias(self, tenant_id: int, name: str) -> AliasSnapshot | object | None:
        """The alias from memory alone: a snapshot, None for "no such alias", or ``UNKNOWN``."""
        return self._aliases.get((tenant_id, name), UNKNOWN)

    def alias(self, tenant_id: int, name: str) -> AliasSnapshot | None:
        key = (tenant_id, name)
        if key in self._aliases:
            return self._aliases[key]
        generation = self._generation
        snapshot = snapshots.load_alias_snapshot(tenant_id=tenant_id, name=name)
        if generation == self._generation:
            self._aliases[key] = snapshot
        return snapshot

    def aliases_of(self, tenant_id: int) -> list[str]:
        return list(
            Alias.objects.filter(tenant_id=tenant_id)
            .order_by("name")
            .values_list("name", flat=True)
        )

    # --- invalidation ----------------------------------------------------------------------

    def apply_change(self, change: dict) -> AliasSnapshot | None:
        """Drop what a broadcast names; the next lookup re-reads it. For an alias, returns
        the snapshot it had before (None if it was not cached)."""
        kind = change.get("kind")
        previous = None
        with self._lock:
            self._generation += 1
            if kind == "alias":
                key = (int(change.get("tenant_id") or 0), str(change.get("name")))
                previous = self._aliases.pop(key, None)
            elif kind in ("api_key", "quota"):
                self._callers.clear()
            elif kind in ("cache_config", "quarantine"):
                pass  # the node re-reads these itself; nothing cached here changes
            else:
                self._drop_all()
        return previous

    def _drop_all(self) -> None:
        self._callers.clear()
        self._aliases.clear()

    def full_refresh(self) -> None:
        """Reload every alias and re-read every known key; the safety net for lost
        broadcasts. Known keys are re-read, not forgotten: a refresh just before the database
        goes away must not leave the node without the callers it was serving."""
        with self._lock:
            self._generation += 1
            generation = self._generation
            known = [d for d, c in self._callers.items() if isinstance(c, Caller)]
        loaded = snapshots.load_all_alias_snapshots()
        callers = _reread_callers(known)
        with self._lock:
            if generation != self._generation:  # a change arrived while loading: drop all
                self._drop_all()
                return
            self._callers = Bounded(MAX_CALLERS, callers)
            self._aliases = Bounded(MAX_ALIASES, {(s.tenant_id, s.name): s for s in loaded})
            self.refreshed_at = time.monotonic()
        close_old_connections()

    def change_marker(self) -> tuple:
        """A cheap fingerprint of everything cached; it changes whenever any of it changes.
        One query (it runs every half second on a node without a broadcast channel)."""
        with connection.cursor() as cursor:
            cursor.execute(_marker_sql())
            marker = tuple(cursor.fetchone())
        close_old_connections()
        return marker

    def poll(self) -> bool:
        """Full refresh if the change marker moved (for nodes without a broadcast channel)."""
        marker = self.change_marker()
        if marker != self.marker:
            self.marker = marker
            self.full_refresh()
            return True
        return False
