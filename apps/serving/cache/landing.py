"""L3, the local disk: landing a version from the registry (L4), checking its sealed copy,
and keeping the tier under its size cap and the filesystem's free space.

The cache manager (``manager.py``) owns one ``Landing``; the decisions (which copies go) are
the tier rules' (``book.py``), the file work is ``disk.DiskTier``'s.
"""

from __future__ import annotations

import errno
import logging
import shutil
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from apps.registry.contracts import ResolvedVersion
from apps.registry.storage import ObjectStore
from apps.serving.cache import download
from apps.serving.cache.book import TierBook
from apps.serving.cache.clock import Clock
from apps.serving.cache.disk import DiskTier, IntegrityFailure, Landed, OnDisk
from apps.serving.cache.limits import Limits
from apps.serving.cache.policies import Resident
from apps.serving.cache.versions import CachedVersion

logger = logging.getLogger(__name__)
# what a landing writes besides the adapter's files (its manifest and seal)
LANDING_OVERHEAD_BYTES = 64 * 1024


class AdapterIntegrityError(Exception):
    """A version failed its integrity check and is quarantined on this node."""


class DiskFull(Exception):
    """The disk cache's filesystem has no room for a landing, even after evicting every L3
    folder that is not in use. Nothing of the landing is left behind."""


@dataclass(frozen=True)
class OnDiskNow:
    """A version made present on the local disk (L3): where it was, and the time per step."""

    found_in: str  # "L3" (a sealed copy checked out) or "L4" (landed from the registry)
    timings: dict[str, float] = field(default_factory=dict)  # check, fetch, verify (ms)


class Landing:
    def __init__(
        self,
        *,
        disk: DiskTier,
        book: TierBook,
        store: ObjectStore,
        public_keys: Callable[[], dict[str, str]],
        limits: Callable[[], Limits],
        timer: Clock,
        on_integrity_failure: Any = None,
        on_evict: Callable[[str, int | None], None] | None = None,
    ) -> None:
        self.disk, self.book, self.store = disk, book, store
        self.public_keys, self.limits, self.timer = public_keys, limits, timer
        self.on_integrity_failure = on_integrity_failure  # callable(resolved, tier, reason)
        self.on_evict = on_evict
        self._scrubbed: dict[int, float] = {}  # version id -> when its copy was last scrubbed

    def _record(self, resolved: ResolvedVersion) -> CachedVersion:
        return self.book.versions.of(
            resolved.version_id, f"{resolved.tenant_slug}/{resolved.label}"
        )

    def adopt(self, found: list[OnDisk]) -> None:
        """Index the verified folders found at start-up (their last use: when they landed)."""
        now, wall = self.book.clock(), time.time()
        for entry in found:
            record = self.book.versions.of(entry.version_id)
            record.name = record.name or entry.path.relative_to(self.disk.root).as_posix()
            resident = Resident(
                version_id=entry.version_id,
                tenant_id=entry.tenant_id,
                size_bytes=entry.size_bytes,
                last_used=now - max(0.0, wall - entry.landed_at),
            )
            self.book.on_disk.add(record, resident, entry.path)

    def land(self, resolved: ResolvedVersion) -> OnDiskNow:
        """L3 if the sealed copy checks out, else land it from L4 (blocking).

        Returns the tier it was found in and the time spent per step (ms). One caller at a
        time per version (requests, alias warming, prewarm and the internal API all land
        versions): a second landing would replace the folder while the engine reads it.
        """
        record = self._record(resolved)
        with record.landing:
            return self._land(resolved, record)

    def checked_now(self, resolved: ResolvedVersion) -> OnDiskNow | None:
        """The L3 copy, if its seal's stat check passes now (no hashing, no thread: well
        under a millisecond, so no deadline needs to cover it); None if that cannot be said
        at once — no copy, another landing or check under way, or a failure, which ``land``
        then handles."""
        record = self._record(resolved)
        if record.folder is None or not record.landing.acquire(blocking=False):
            return None
        try:
            started = self.timer()
            self.disk.check(resolved, hash_bytes=False)
            timings = {"check_ms": (self.timer() - started) * 1000}
            self.disk.read_ahead(resolved)
            self._note_on_disk(resolved, record)
            return OnDiskNow("L3", timings)
        except IntegrityFailure:
            return None
        finally:
            record.landing.release()

    def _land(self, resolved: ResolvedVersion, record: CachedVersion) -> OnDiskNow:
        timings: dict[str, float] = {}
        if self.disk.has(resolved):
            started = self.timer()
            try:
                self.disk.check(resolved, hash_bytes=self.limits().verify_checksum)
                timings["check_ms"] = (self.timer() - started) * 1000
                self.disk.read_ahead(resolved)
                self._note_on_disk(resolved, record)
                return OnDiskNow("L3", timings)
            except IntegrityFailure as exc:
                logger.warning("replacing a corrupt disk copy: %s", exc)
                self.disk.evict(resolved)
                self.book.on_disk.drop(record)
                if self.on_integrity_failure:
                    self.on_integrity_failure(resolved, "L3", str(exc))
        # room under the cap first: the tier never holds more than its cap, even mid-landing
        self.trim_disk(keep={resolved.version_id}, incoming=resolved.size_bytes)
        started = self.timer()
        try:
            landed = self._land_with_room(resolved)
        except IntegrityFailure as exc:
            record.quarantined = True
            if self.on_integrity_failure:
                self.on_integrity_failure(resolved, "L4", str(exc))
            raise AdapterIntegrityError(str(exc)) from None
        self.disk.remember(resolved)  # the seal later loads are held to
        timings.update(fetch_ms=landed.fetch_ms, verify_ms=landed.verify_ms)
        self._note_on_disk(resolved, record, reload_ms=(self.timer() - started) * 1000)
        return OnDiskNow("L4", timings)

    def _land_with_room(self, resolved: ResolvedVersion) -> Landed:
        """Land from L4. When the filesystem itself is full (other files on it, or a disk
        smaller than ``disk_cache.max_size_gb``), evict L3 folders not in use until the
        version fits, and try once more; if nothing can go, raise ``DiskFull``."""
        try:
            return download.land(self.disk.root, resolved, self.store, self.public_keys())
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        free = shutil.disk_usage(self.disk.root).free
        need = resolved.size_bytes + LANDING_OVERHEAD_BYTES - free
        evicted = self._evict_from_disk(need, keep={resolved.version_id})
        logger.warning(
            "the disk cache's filesystem is full (%d bytes free, %s needs %d): evicted %d "
            "version(s) from L3",
            free,
            resolved.label,
            resolved.size_bytes,
            len(evicted),
        )
        try:
            if evicted:
                return download.land(self.disk.root, resolved, self.store, self.public_keys())
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        free = shutil.disk_usage(self.disk.root).free
        raise DiskFull(
            f"the node's disk cache ({self.disk.root}) is full: {free / 1048576:.1f} MB free, "
            f"{resolved.label} needs {resolved.size_bytes / 1048576:.1f} MB and every version "
            "cached there is in use; an operator must free space on that disk or lower "
            "disk_cache.max_size_gb below what the disk holds"
        )

    def _note_on_disk(
        self, resolved: ResolvedVersion, record: CachedVersion, reload_ms: float | None = None
    ) -> None:
        """One more use of the version's disk copy (just landed, or checked for a load)."""
        self.book.landed(
            record,
            tenant_id=resolved.tenant_id,
            size_bytes=resolved.size_bytes,
            folder=self.disk.folder(resolved),
            reload_ms=reload_ms,
        )

    def scrub_one(self) -> str | None:
        """Re-hash the L3 copy checked longest ago (blocking; ``DiskTier.scrub``); a copy that
        fails is deleted, dropped from the index and counted as an L3 integrity failure, and
        lands again from L4 on its next use. None if nothing was found wrong (or nothing was
        there to scrub), else what was."""
        candidates = [r for r in self.book.on_disk.members.values() if r.folder is not None]
        candidates.sort(key=lambda r: self._scrubbed.get(r.version_id, 0.0))
        for record in candidates:
            if not record.landing.acquire(blocking=False):  # being landed or checked now
                continue
            try:
                folder = record.folder
                if folder is None:
                    continue
                self._scrubbed[record.version_id] = time.monotonic()
                problem = self.disk.scrub(folder)
                if problem is None:
                    return None
                logger.warning("the scrub found a corrupt disk copy: %s", problem)
                idle = record.engine is None and record.loading is None
                if idle and not record.held and not record.waiting:
                    self.book.drop_from_disk(record.version_id)
                    self.disk.remove(folder)
                else:  # the engine may read it again: its next check fails and it lands again
                    self.disk.condemn(folder, problem)
                if self.on_integrity_failure:
                    self.on_integrity_failure(None, "L3", problem)
                return problem
            finally:
                record.landing.release()
        return None

    def disk_bytes(self) -> int:
        return self.book.on_disk.bytes()

    def trim_disk(self, keep: Collection[int] = (), incoming: int = 0) -> list[int]:
        """Evict L3 folders, lowest value first, until the tier fits its size cap with
        ``incoming`` more bytes. Returns the versions evicted."""
        evicted = self._evict_from_disk(self._over_cap(incoming), keep)
        if self._over_cap(incoming) > 0:
            logger.warning(
                "the disk cache is %d bytes over its cap; everything left is in use",
                self._over_cap(incoming),
            )
        return evicted

    def _over_cap(self, incoming: int = 0) -> int:
        return self.book.on_disk.bytes() + incoming - self.limits().disk_bytes

    def _evict_from_disk(self, need_bytes: int, keep: Collection[int]) -> list[int]:
        """Evict L3 folders, lowest value first, until ``need_bytes`` are freed or nothing
        more may go (see ``TierBook.disk_victims``)."""
        evicted: list[int] = []
        for victim in self.book.disk_victims(need_bytes, keep=keep):
            folder = self.book.drop_from_disk(victim.version_id)
            if folder is not None:
                self.disk.remove(folder)
            evicted.append(victim.version_id)
            if self.on_evict:
                self.on_evict("L3", victim.tenant_id)
        return evicted

    def evict_from_disk(self, resolved: ResolvedVersion) -> None:
        self.disk.evict(resolved)
        self.book.on_disk.drop(self._record(resolved))
