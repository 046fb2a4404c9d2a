"""The node's request statistics, recorded off the request path.

The request path only appends a frozen ``RequestRecord`` to a bounded in-memory queue. A
background thread drains it every ``LORAHUB_STATS_FLUSH_MS`` (2 s) into the database
(``apps/telemetry/writers.py``). If the database is slow the queue fills and new records are
dropped and counted (``request_stats_dropped``); inference never waits for the database. A
write that fails (the database restarts, or is gone for a while) loses nothing: its batch is
written first on the next try, so every answered request is either written once or counted
as dropped.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime

from django.conf import settings
from django.db import close_old_connections

from apps.telemetry.aggregate import merge_cache_row
from apps.telemetry.records import RequestRecord, ShadowRecord
from apps.telemetry.writers import (
    purge_old_statistics,
    write_cache_minutes,
    write_records,
    write_shadow_records,
)

logger = logging.getLogger(__name__)
BATCH = 500
QUEUE_SIZE = 20_000
PURGE_EVERY_S = 3600


class StatsRecorder:
    def __init__(self, node: str, on_drop=None) -> None:
        self.node = node
        # cache activity per (minute, tenant id): evictions add up, residency keeps its peak
        self._cache_lock = threading.Lock()
        self._cache: dict[tuple[datetime, int | None], dict[str, int]] = {}
        self._last_residency: dict[int, tuple[int, int]] = {}
        self._queue: queue.Queue[RequestRecord] = queue.Queue(maxsize=QUEUE_SIZE)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_drop = on_drop
        self._last_purge = 0.0
        # what a failed write took off the queue: first in line for the next one
        self._unwritten: list[RequestRecord] = []
        self._shadow_lock = threading.Lock()
        self._shadows: list[ShadowRecord] = []  # at most QUEUE_SIZE; more are dropped

    def record(self, rec: RequestRecord) -> None:
        """Never blocks: a full queue drops the record."""
        try:
            self._queue.put_nowait(rec)
        except queue.Full:
            if self._on_drop:
                self._on_drop()

    def record_shadow(self, rec: ShadowRecord) -> None:
        """A mirrored request's outcome. Never blocks; beyond QUEUE_SIZE waiting, dropped."""
        with self._shadow_lock:
            if len(self._shadows) < QUEUE_SIZE:
                self._shadows.append(rec)
                return
        if self._on_drop:
            self._on_drop()

    def _cache_row(self, tenant_id: int | None) -> dict[str, int]:
        minute = datetime.now(UTC).replace(second=0, microsecond=0)
        return self._cache.setdefault((minute, tenant_id), defaultdict(int))

    def count_eviction(self, tier: str, tenant_id: int | None) -> None:
        """An adapter left the engine (L2) or the disk (L3). Never blocks on the database."""
        if tier not in ("L2", "L3"):
            return
        with self._cache_lock:
            self._cache_row(tenant_id)[f"evictions_{tier.lower()}"] += 1

    def note_residency(self, usage: dict[int, tuple[int, int]]) -> None:
        """The engine's residency per tenant id, (hot, warm); recorded when it changes (and
        as 0 for a tenant that has nothing left), so quiet minutes cost no rows."""
        with self._cache_lock:
            for tenant_id in set(usage) | set(self._last_residency):
                hot, warm = usage.get(tenant_id, (0, 0))
                if self._last_residency.get(tenant_id) == (hot, warm):
                    continue
                row = self._cache_row(tenant_id)
                row["hot"], row["warm"] = max(row["hot"], hot), max(row["warm"], warm)
                row["seen"] = 1
            self._last_residency = {t: v for t, v in usage.items() if v != (0, 0)}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="request-stats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        self.flush()

    def _run(self) -> None:
        failing_since: float | None = None  # one log line when writes fail, one when back
        while not self._stop.is_set():
            self._stop.wait(settings.LORAHUB_STATS_FLUSH_MS / 1000)
            try:
                close_old_connections()  # a connection the database dropped reconnects here
                self.flush()
                if failing_since is not None:
                    logger.warning(
                        "request statistics are written again after %.1f s",
                        time.monotonic() - failing_since,
                    )
                    failing_since = None
                if time.monotonic() - self._last_purge > PURGE_EVERY_S:
                    self._last_purge = time.monotonic()
                    purge_old_statistics()
            except Exception:
                if failing_since is None:
                    failing_since = time.monotonic()
                    logger.exception(
                        "writing request statistics failed; they are kept (up to %d waiting) "
                        "and written when the database answers",
                        QUEUE_SIZE,
                    )
            finally:
                close_old_connections()

    @property
    def backlog(self) -> int:
        """Records recorded but not written yet."""
        return len(self._unwritten) + self._queue.qsize()

    def flush(self) -> int:
        """Write what is waiting; returns the request records written. On a failure the
        batch (and the cache rows) stay for the next call, and the error is raised."""
        batch, self._unwritten = self._unwritten, []
        while len(batch) < BATCH * 20:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if batch:
            try:
                write_records(self.node, batch)
            except Exception:
                self._unwritten = batch
                raise
        with self._shadow_lock:
            shadows, self._shadows = self._shadows, []
        if shadows:
            try:
                write_shadow_records(shadows)
            except Exception:
                with self._shadow_lock:
                    self._shadows[:0] = shadows
                raise
        with self._cache_lock:
            cache, self._cache = self._cache, {}
        if cache:
            try:
                write_cache_minutes(self.node, cache)
            except Exception:
                with self._cache_lock:
                    for key, counts in cache.items():
                        merge_cache_row(self._cache.setdefault(key, defaultdict(int)), counts)
                raise
        return len(batch)
