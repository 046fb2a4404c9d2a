"""One record per version this node has cached: every fact about it in one place.

A version's whole state on this node is one :class:`CachedVersion`: where it is (its L3
folder and use, its use in the engine), what is happening to it (being landed, loading into
the engine, answering requests, awaited by requests whose load is under way) and what an
operator or the registry decided (pinned, deprecated, quarantined). ``state`` and ``busy``
are read from the record, never worked out elsewhere.

The tiers keep indexes of records, not facts of their own: ``engine_tiers.EngineTiers``
(L1 and L2), ``disk.DiskIndex`` (L3) and ``loads.LoadQueue`` (loads under way). Each is the
only writer of its part of the record (``engine``; ``disk`` and ``folder``; ``loading``), so
a record and the index it is in cannot disagree.

The record's id is the registry's version id, which is also the engine's LoRA id: the
registry gives each cache key (tenant, adapter, version, base-model revision) one id and
never reuses it. Records are kept for the life of the process (about 540 bytes per version
ever placed here, name and L3 use included): a quarantined or deprecated version stays so
even while it is in no tier, and no thread can drop a record another is about to use.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from apps.serving.cache.policies import Resident


class State(StrEnum):
    """The one word ``/internal/cache`` and the console show for a version (first that holds)."""

    QUARANTINED = "quarantined"  # failed its signed manifest: refused on this node
    LANDING = "landing"  # being downloaded and verified into L3, or its L3 copy checked
    LOADING = "loading"  # being added to the engine
    PINNED = "pinned"  # in a device slot for good (L1)
    HELD = "held"  # in the engine, answering requests
    IN_ENGINE = "in engine"  # in the engine (L1 or L2), idle
    ON_DISK = "on disk"  # on local disk only (L3)
    ABSENT = "absent"  # in no tier on this node


@dataclass(eq=False)
class CachedVersion:
    version_id: int
    name: str = ""  # "tenant-slug/adapter@vN", for reports
    folder: Path | None = None  # its L3 folder, while on disk
    disk: Resident | None = None  # its use as L3 knows it; None: not on disk
    engine: Resident | None = None  # its use in the engine; None: not in L1 or L2
    loading: asyncio.Task | None = None  # its load into the engine, while under way
    # held while it is landed on disk or its disk copy is checked: one at a time per
    # version (a second landing would replace the folder while the engine reads it)
    landing: threading.Lock = field(default_factory=threading.Lock)
    pinned: bool = False
    held: int = 0  # requests inside the engine with it (``board`` until ``release``)
    # requests waiting for its load that will hold it once it is done: until they resume,
    # the fresh version must not be evicted for another (loaded, evicted, loaded again)
    awaiting: int = 0
    # requests placed and still waiting for a seat or a device slot (``CacheManager.prepare``
    # until ``board``): they count toward keeping the version in the engine (it is the last
    # choice of victim) but do not protect it, and they keep its L3 copy
    waiting: int = 0
    deprecated: bool = False  # no alias uses it any more: the first to go from every tier
    quarantined: bool = False

    @property
    def state(self) -> State:
        if self.quarantined:
            return State.QUARANTINED
        if self.landing.locked():
            return State.LANDING
        if self.loading is not None:
            return State.LOADING
        if self.engine is not None:
            if self.pinned:
                return State.PINNED
            return State.HELD if self.held else State.IN_ENGINE
        return State.ON_DISK if self.disk is not None else State.ABSENT

    @property
    def busy(self) -> bool:
        """Loading into the engine, being landed on disk, answering requests or awaited by
        placed ones: an operator may not evict it now, and neither may the disk tier."""
        return (
            self.loading is not None or self.held > 0 or self.waiting > 0 or self.landing.locked()
        )

    @property
    def protected(self) -> bool:
        """Not to be evicted from the engine now: pinned, generating, or just loaded for
        requests that have not resumed yet."""
        return self.pinned or self.held > 0 or self.awaiting > 0


class Versions:
    """Every record, by version id. Safe to use from the event loop and from the threads that
    land versions on disk."""

    def __init__(self) -> None:
        self._records: dict[int, CachedVersion] = {}
        self._guard = threading.Lock()

    def get(self, version_id: int) -> CachedVersion | None:
        return self._records.get(version_id)

    def of(self, version_id: int, name: str | None = None) -> CachedVersion:
        """The version's record, made on first use; ``name`` updates its report name."""
        record = self._records.get(version_id)
        if record is None:
            with self._guard:
                record = self._records.setdefault(version_id, CachedVersion(version_id))
        if name:
            record.name = name
        return record

    def __iter__(self) -> Iterator[CachedVersion]:
        return iter(list(self._records.values()))

    def quarantined(self) -> set[int]:
        return {r.version_id for r in self if r.quarantined}

    def quarantine(self, version_ids: set[int]) -> None:
        """Mark these versions quarantined (and no others): what the registry holds for this
        node at start."""
        for record in self:
            record.quarantined = record.version_id in version_ids
        for version_id in version_ids:
            self.of(version_id).quarantined = True
