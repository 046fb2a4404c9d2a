"""Replay a trace through the node's own tier rules, on a virtual clock.

The rules are the node's, not a copy: a replay drives ``cache/book.py``'s ``TierBook`` (the
records, ``EngineTiers``, the disk index, the policy object and ``select_victims``) as the
node's cache manager (``cache/manager.py``) does, with the clock set to each event's time. A
replay of the node's request log reports the tiers the node reported (a test checks it on a
real node's log), and the same requests through the manager and through the replay give the
same decisions under every policy (``tests/serving/replay/test_replay_equivalence.py``).

``Replay`` is an event loop. Its events, in time order: a request arrives (``_arrive``); a
load finishes (the version stops being protected as one loading); a request ends (it lets go
of its version, with ``Trace.held_s``). A load that finds everything in the engine protected
waits, as the node's ``_make_room`` does, and is retried at each later event.

What the replay adds to the rules is cost and time (``Costs``): per tier, fixed + per MB,
through the node's bounded queue (``max_fetches`` concurrent L4 downloads, ``max_loads``
concurrent engine adds, at most ``max_pending`` versions loading; a request finding it full
waits for the first load to finish, counted as ``queue_full``). A decision takes effect at the
request's arrival; its time cost is counted in that request's TTFT (base TTFT + waiting +
loading). Approximations: a version is admitted to the engine when its load starts and is
protected until it ends (the node counts it as ``adding`` meanwhile, to the same effect); a
load waiting for room does not hold one of ``max_loads``' slots (the node's does); the holds
are the node's logged durations, whatever the replayed policy would have made them; no
device-slot gate runs, so L1 is the pinned and then the most recently used versions; loads
take their slots in arrival order (the node's queue lets a small version pass large ones,
``cache/loads.py``), and the node's prefetch from rising demand is not replayed.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field

import numpy as np

from apps.serving.cache.book import TierBook
from apps.serving.cache.engine_tiers import Owner
from apps.serving.cache.policies import Policy, make_policy
from apps.serving.replay.traces import Trace

MB = 1048576
TIERS = ("L1", "L2", "L3", "L4")


@dataclass(frozen=True)
class Capacity:
    """The tiers' sizes and the load queue, as in the node's cache configuration."""

    l1_slots: int = 4
    l2_slots: int = 16
    l2_bytes: int | None = None
    l3_bytes: int | None = None
    ttl_s: float | None = None
    max_fetches: int = 2
    max_loads: int = 1
    max_pending: int = 16
    warm_quotas: dict[int, int] = field(default_factory=dict)  # tenant -> versions in engine
    # every version the trace names is on disk at the start, in order of first use while the
    # cap allows (a node whose disk was prewarmed, as bench/many_adapters.py's); else empty
    warm_disk: bool = False

    def describe(self) -> str:
        parts = [f"L1 {self.l1_slots}", f"L2 {self.l2_slots}"]
        if self.l2_bytes:
            parts[-1] += f" / {self.l2_bytes / MB:.0f} MB"
        parts.append(f"L3 {self.l3_bytes / MB:.0f} MB" if self.l3_bytes else "L3 unbounded")
        if self.warm_disk:
            parts[-1] += " (prewarmed)"
        return ", ".join(parts)


@dataclass(frozen=True)
class Costs:
    """What each tier costs a request, in ms (fixed + per MB of the version).

    Defaults: the medians of ``bench/load_tiers.py`` on this project's 2-core CI machine
    (L3 check + engine add ~4.5 ms for a 1 MB demo adapter, ~40 ms for a 109 MB Llama-3-8B
    rank-16 one; L4 fetch + verify ~18 ms and ~80 ms). ``Costs.from_log`` measures them on
    the node's own log instead.
    """

    base_ttft_ms: float = 60.0
    l2_ms: float = 0.0  # an engine version swapped into a device slot: inside the batch step
    l3_ms: float = 4.0
    l3_ms_per_mb: float = 0.33
    l4_ms: float = 16.0
    l4_ms_per_mb: float = 0.6
    source: str = "bench/load_tiers.py's medians (no node measurements)"

    def describe(self) -> str:
        return (
            f"base TTFT {self.base_ttft_ms:.0f} ms, L3 {self.l3_ms:.0f} ms + "
            f"{self.l3_ms_per_mb:.2f}/MB, L4 +{self.l4_ms:.0f} ms + {self.l4_ms_per_mb:.2f}/MB"
        )

    def load_ms(self, tier: str, size_bytes: int) -> float:
        """Time to bring a version from ``tier`` into the engine."""
        mb = size_bytes / MB
        add = self.l3_ms + self.l3_ms_per_mb * mb
        if tier == "L4":
            return self.l4_ms + self.l4_ms_per_mb * mb + add
        return add

    def land_ms(self, size_bytes: int) -> float:
        return self.l4_ms + self.l4_ms_per_mb * size_bytes / MB


@dataclass
class Result:
    policy: str
    trace: str
    capacity: Capacity
    requests: int = 0
    tiers: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    bytes_requested: int = 0
    bytes_hit: int = 0
    loads: int = 0
    reload_ms: float = 0.0
    evictions: dict[str, int] = field(default_factory=lambda: {"L2": 0, "L3": 0})
    peak_bytes: dict[str, int] = field(default_factory=lambda: {"L1": 0, "L2": 0, "L3": 0})
    queue_full: int = 0
    ttft_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tenant_of_request: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    hit_of_request: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    seconds: float = 0.0  # wall time of the replay itself
    tier_log: list[str] | None = None

    @property
    def hits(self) -> int:
        """Requests served from the engine (L1 or L2) without waiting for a load."""
        return self.tiers["L1"] + self.tiers["L2"]

    @property
    def hit_rate(self) -> float:
        return self.hits / max(self.requests, 1)

    @property
    def byte_hit_rate(self) -> float:
        return self.bytes_hit / max(self.bytes_requested, 1)

    def rate(self, tier: str) -> float:
        return self.tiers[tier] / max(self.requests, 1)

    def ttft(self, q: float) -> float:
        return float(np.percentile(self.ttft_ms, q)) if len(self.ttft_ms) else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.requests / max(self.seconds, 1e-9)

    def per_tenant(self) -> dict[int, dict[str, float]]:
        out: dict[int, dict[str, float]] = {}
        for tenant in np.unique(self.tenant_of_request):
            mine = self.tenant_of_request == tenant
            out[int(tenant)] = {
                "requests": int(mine.sum()),
                "hit_rate": float(self.hit_of_request[mine].mean()),
                "ttft_p95_ms": float(np.percentile(self.ttft_ms[mine], 95)),
            }
        return out

    def fairness(self) -> float:
        """Jain's index over the tenants' hit rates: 1 when all are equal, 1/n at worst."""
        rates = np.array([t["hit_rate"] for t in self.per_tenant().values()])
        if not len(rates) or not rates.any():
            return 1.0
        return float(rates.sum() ** 2 / (len(rates) * (rates**2).sum()))


class VirtualClock:
    """The replay's clock: the time of the event being handled."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


READY, RELEASE = 0, 1  # events: a load finishes; a request lets go of its version


class Replay:
    """One replay of ``trace`` under ``policy``: see the module's docstring."""

    def __init__(
        self,
        trace: Trace,
        policy: Policy | str,
        capacity: Capacity,
        costs: Costs | None = None,
        *,
        record_tiers: bool = False,
    ) -> None:
        self.trace, self.capacity, self.costs = trace, capacity, costs or Costs()
        policy = make_policy(policy) if isinstance(policy, str) else policy
        self.clock = VirtualClock(trace.at[0] if trace.at else 0.0)
        self.book = TierBook(
            slots=lambda: (capacity.l1_slots, capacity.l2_slots), policy=policy, clock=self.clock
        )
        self.result = Result(policy=policy.name, trace=trace.name, capacity=capacity)
        self.events: list[tuple[float, int, int, int]] = []  # (time, seq, kind, version)
        self.seq = itertools.count()
        self.fetchers = [0.0] * capacity.max_fetches  # when each download slot is free
        self.loaders = [0.0] * capacity.max_loads  # when each engine-add slot is free
        self.pending: list[float] = []  # when each load in flight finishes
        self.loading: dict[int, float] = {}  # version -> when its load finishes
        self.source: dict[int, str] = {}  # version -> the tier its last load came from
        self.waiting: dict[int, list[tuple[int, float]]] = {}  # loads waiting for room
        self.ttft: list[float] = []
        self.hit: list[bool] = []
        self.tier_log: list[str] | None = [] if record_tiers else None
        self.next_expiry = 0.0

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> Result:
        started = time.perf_counter()
        trace, result = self.trace, self.result
        if self.capacity.warm_disk:
            self._prewarm_disk()
        for index, (now, key) in enumerate(zip(trace.at, trace.keys, strict=True)):
            self._until(now)
            self.clock.now = now
            self._arrive(index, now, key)
        self._until(float("inf"))
        result.seconds = time.perf_counter() - started
        result.requests = len(trace.keys)
        result.ttft_ms = np.array(self.ttft)
        result.hit_of_request = np.array(self.hit, dtype=bool)
        result.tenant_of_request = np.array(
            [trace.adapters[k].tenant for k in trace.keys], dtype=np.int64
        )
        result.tier_log = self.tier_log
        return result

    def _until(self, t: float) -> None:
        """Handle the events due by ``t``, in time order; a load waiting for room is retried
        after each (what let go may make its room)."""
        while self.events and self.events[0][0] <= t:
            at, _, kind, key = heapq.heappop(self.events)
            self.clock.now = max(self.clock.now, at)
            record = self.book.versions.of(key)
            if kind == READY:
                if self.loading.get(key) == at:
                    del self.loading[key]
                self.book.tiers.await_load(record, False)
            else:
                self.book.tiers.release(record)
            if self.waiting:
                self._retry_waiting()

    def _after(self, at: float, kind: int, key: int) -> None:
        heapq.heappush(self.events, (at, next(self.seq), kind, key))

    # --- a request -----------------------------------------------------------------------------

    def _arrive(self, index: int, now: float, key: int) -> None:
        adapter = self.trace.adapters[key]
        book, result = self.book, self.result
        record = book.versions.of(key)
        result.bytes_requested += adapter.size_bytes
        book.observe(key)  # every request, as the node's cache manager does
        self._sweep_ttl(now)
        while self.pending and self.pending[0] <= now:
            heapq.heappop(self.pending)
        served_hot = False
        wait: float | None
        if key in self.waiting:  # its load waits for room: so does this request
            tier = self.source[key]
            self.waiting[key].append((index, now))
            wait = None  # known when the room is
        elif key in self.loading:  # still loading: wait for that load
            tier = self.source[key]
            wait = (self.loading[key] - now) * 1000
            book.use(record)
        elif (found := book.use(record)) is not None:
            tier, served_hot = found, True
            wait = self.costs.l2_ms if tier == "L2" else 0.0
            result.bytes_hit += adapter.size_bytes
        else:
            tier, wait = self._load(index, now, key)
        if self.trace.held_s is not None:  # the request holds its version until it ends
            record.held += 1
            self._after(now + self.trace.held_s[index], RELEASE, key)
        result.tiers[tier] += 1
        self.ttft.append(self.costs.base_ttft_ms + wait if wait is not None else 0.0)
        self.hit.append(served_hot)
        if self.tier_log is not None:
            self.tier_log.append(tier)
        if not served_hot:
            self._note_peaks()

    def _sweep_ttl(self, now: float) -> None:
        """The node's TTL sweep, once a second."""
        ttl = self.capacity.ttl_s
        if ttl is None or now < self.next_expiry:
            return
        self.next_expiry = now + 1.0
        for version_id in self.book.expired(ttl):
            self.book.take_out(version_id)
            self.result.evictions["L2"] += 1

    def _load(self, index: int, now: float, key: int) -> tuple[str, float | None]:
        """A cold request: land the version on L3 if it is not there, make room in the engine
        and admit it, or wait for room. Returns the tier it came from and the wait (ms)."""
        adapter, costs, result = self.trace.adapters[key], self.costs, self.result
        record = self.book.versions.of(key)
        size = adapter.size_bytes
        tier = "L3" if record.disk is not None else "L4"
        t0 = now
        if len(self.pending) + len(self.waiting) >= self.capacity.max_pending and self.pending:
            result.queue_full += 1  # the queue is full: wait for room
            t0 = heapq.heappop(self.pending)
        if tier == "L4":
            t0 = max(t0, self.fetchers[0]) + costs.land_ms(size) / 1000
            heapq.heapreplace(self.fetchers, t0)  # the download slot free first
            self._trim_disk(key, size)
            self.book.landed(
                record,
                tenant_id=adapter.tenant,
                size_bytes=size,
                folder=None,
                reload_ms=costs.land_ms(size),
            )
        else:
            self.book.landed(record, tenant_id=adapter.tenant, size_bytes=size, folder=None)
        self.source[key] = tier
        result.loads += 1
        result.reload_ms += costs.load_ms(tier, size)
        if not self._room_for(key):
            self.waiting[key] = [(index, now)]  # every resident protected: wait for a release
            return tier, None
        done = max(t0, self.loaders[0]) + self._add_s(size)
        heapq.heapreplace(self.loaders, done)  # the engine-add slot free first
        self._admit(key, done)
        return tier, (done - now) * 1000

    def _retry_waiting(self) -> None:
        """Loads waiting for room get it, oldest first, while the rules allow."""
        now = self.clock.now
        for key in list(self.waiting):
            if not self._room_for(key):
                return
            done = now + self._add_s(self.trace.adapters[key].size_bytes)
            self._admit(key, done)
            for index, arrived in self.waiting.pop(key):
                self.ttft[index] = self.costs.base_ttft_ms + (done - arrived) * 1000

    # --- the rules, carried out ----------------------------------------------------------------

    def _owner(self, key: int) -> Owner:
        tenant = self.trace.adapters[key].tenant
        return Owner(
            tenant_id=tenant,
            priority=self.trace.priorities.get(tenant, 1),
            warm_quota=self.capacity.warm_quotas.get(tenant),
        )

    def _room_for(self, key: int) -> bool:
        """Make room in the engine for ``key`` (``TierBook.engine_victims``); False when
        everything there is protected."""
        pressure = (len(self.pending) + len(self.waiting) + 1) / self.capacity.max_pending
        victims = self.book.engine_victims(
            self._owner(key),
            incoming=self.trace.adapters[key].size_bytes,
            warm_bytes=self.capacity.l2_bytes,
            pressure=min(1.0, pressure),
        )
        if victims is None:
            return False
        for victim in victims:
            self.book.take_out(victim.version_id)
            self.result.evictions["L2"] += 1
        return True

    def _admit(self, key: int, done: float) -> None:
        """``key`` enters the engine now, protected as loading until ``done``; the request
        that loaded it uses it."""
        record = self.book.versions.of(key)
        size = self.trace.adapters[key].size_bytes
        self.book.admit(
            record,
            self._owner(key),
            size_bytes=size,
            reload_cost_ms=self.costs.load_ms("L3", size),
        )
        self.book.use(record)
        self.book.tiers.await_load(record, True)
        self.loading[key] = done
        heapq.heappush(self.pending, done)
        self._after(done, READY, key)

    def _add_s(self, size: int) -> float:
        return (self.costs.l3_ms + self.costs.l3_ms_per_mb * size / MB) / 1000

    def _trim_disk(self, key: int, incoming: int) -> None:
        """Room on L3 for ``incoming`` more bytes under its cap (``TierBook.disk_victims``);
        what is loading or waiting to load keeps its copy, as on the node."""
        cap = self.capacity.l3_bytes
        if cap is None:
            return
        need = self.book.on_disk.bytes() + incoming - cap
        keep = {key, *self.waiting}
        for victim in self.book.disk_victims(need, keep=keep):
            self.book.drop_from_disk(victim.version_id)
            self.result.evictions["L3"] += 1

    def _prewarm_disk(self) -> None:
        """Every version the trace names on disk, in order of first use while the cap allows."""
        cap = self.capacity.l3_bytes
        for key in dict.fromkeys(self.trace.keys):
            adapter = self.trace.adapters[key]
            if cap is not None and self.book.on_disk.bytes() + adapter.size_bytes > cap:
                break
            record = self.book.versions.of(key)
            self.book.landed(
                record,
                tenant_id=adapter.tenant,
                size_bytes=adapter.size_bytes,
                folder=None,
                reload_ms=self.costs.land_ms(adapter.size_bytes),
            )
            # prewarmed, not used: no hits yet
            assert record.disk is not None
            record.disk = record.disk._replace(hits=0.0)

    def _note_peaks(self) -> None:
        peak, tiers = self.result.peak_bytes, self.book.tiers
        engine = sum(r.engine.size_bytes for r in tiers.members.values() if r.engine)
        peak["L1"] = max(peak["L1"], tiers.hot_bytes())
        peak["L2"] = max(peak["L2"], engine)
        peak["L3"] = max(peak["L3"], self.book.on_disk.bytes())


def simulate(
    trace: Trace,
    policy: Policy | str,
    capacity: Capacity,
    costs: Costs | None = None,
    *,
    record_tiers: bool = False,
) -> Result:
    """Replay ``trace`` under ``policy`` (see ``Replay``)."""
    return Replay(trace, policy, capacity, costs, record_tiers=record_tiers).run()
