"""Replay a trace through the node's tier model with the node's own policy objects.

The model follows the node's cache manager (``apps/serving/cache/manager.py`` and the tiers in
``apps/serving/cache/``) step by step, so that a replay of the node's
request log reports the tiers the node reported (a test checks it on a real node's log):

- L2 is the engine (vLLM's host LoRA cache): ``l2_slots`` versions and ``l2_bytes``; a load
  makes room first with ``select_victims`` (quotas, guaranteed shares, the policy's order).
- L1 is the device slots: the ``l1_slots`` most recently used versions in the engine (the
  node's ``EngineTiers.device_set`` with no pins). A request for one of them is an L1 hit.
- L3 is local disk (``l3_bytes``, None for no cap): every version that reaches the engine
  lands there first; a landing that overflows it evicts the policy's pick among versions not
  in the engine or loading. Access counts carry down to L3 when a version leaves the engine
  and back up when it is loaded again.
- L4 is the registry: always there.

Loads take time from ``Costs`` (per tier, fixed + per MB) and go through the node's bounded
queue: ``max_fetches`` concurrent L4 downloads, ``max_loads`` concurrent engine adds, and at
most ``max_pending`` versions loading (a request finding it full waits for the first to
finish, counted as ``queue_full``). Requests for a version still loading wait for that load,
as on the node (single flight). A decision takes effect at the request's arrival; its time
cost is counted in that request's TTFT (base TTFT + waiting + loading).

Holds, for a trace from the node's log (``Trace.held_s``: each request's arrival to last
byte): a request holds its version until it ends, and a held or loading version never leaves
the engine (``EngineTiers.victims``). A load that finds every resident so waits, as the node's
``_make_room`` does, for the first to be let go; requests arriving meanwhile see the engine as
it is then (a version about to go can still be hit, and so held again), and requests for the
waiting version wait with it. Without ``held_s`` nothing is held (synthetic traces: requests
take no time). Approximations: a load waiting for room does not hold one of ``max_loads``'
slots (the node's does), and the holds are the node's logged durations, whatever the replayed
policy would have made them.

Policies that have a time-invariant ``retention`` key (lru, lfu and each of the default's
settings) are kept in a heap and handed to ``select_victims`` already ordered; the others are
ranked on every miss. Either way the policy object and ``select_victims`` are the node's, and
every policy sees every request (``observe``: the default learns from them) as on the node.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from apps.serving.cache.policies import (
    Census,
    Policy,
    Resident,
    make_policy,
    rank,
    select_victims,
)
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


class _Heap:
    """A tier's residents ordered by one ``retention`` key, updated lazily.

    A hit only replaces the resident (``_Tier.touch``); when an entry reaches the top and
    its resident has changed since it was pushed, it is pushed again with the resident's
    current key. That is exact because retention never falls on an access (more hits, a
    later last use; ``Weighted`` keeps its recency half-life at most its count half-life),
    so a stale key is never above the true one.
    """

    def __init__(self, retention: Callable[[Resident], float]) -> None:
        self.retention = retention
        self.entries: list[tuple[float, int, int]] = []
        self.seq: dict[int, int] = {}  # key -> counter of its live entry
        self.pushed: dict[int, Resident] = {}  # key -> the resident that entry was made from
        self.counter = 0

    def push(self, key: int, resident: Resident, live: int) -> None:
        self.counter += 1
        self.seq[key] = self.counter
        self.pushed[key] = resident
        heapq.heappush(self.entries, (self.retention(resident), self.counter, key))
        if len(self.entries) > 4 * live + 64:
            self.entries = [e for e in self.entries if self.seq.get(e[2]) == e[1]]
            heapq.heapify(self.entries)

    def drop(self, key: int) -> None:
        self.seq.pop(key, None)
        self.pushed.pop(key, None)


class _Tier:
    """One tier's residents and, for policies with a fixed ``retention_key``, a heap of them —
    one per setting of the policy (the default has three), so that every setting's choice is
    at hand and a change of the active setting costs nothing."""

    def __init__(self, policy: Policy, *, evicts: bool = True) -> None:
        self.policy = policy
        self.residents: dict[int, Resident] = {}
        self.census = Census()
        self.bytes = 0
        self.heaps: list[_Heap] = []
        # (a tier that never evicts, such as an unbounded disk, keeps no heap)
        if evicts and policy.retention_key() is not None:
            keys = [setting.retention_key() for setting in policy.settings()]
            self.heaps = [_Heap(key) for key in keys if key is not None]

    def put(self, key: int, resident: Resident) -> None:
        old = self.residents.get(key)
        if old is not None:
            self.bytes -= old.size_bytes
        else:
            self.census.add(resident)
        self.residents[key] = resident
        self.bytes += resident.size_bytes
        for heap in self.heaps:
            heap.push(key, resident, len(self.residents))

    def touch(self, key: int, resident: Resident) -> None:
        """A hit: the resident changes; its heap entries are brought up to date when read."""
        self.residents[key] = resident

    def pop(self, key: int) -> Resident:
        resident = self.residents.pop(key)
        self.census.remove(resident)
        self.bytes -= resident.size_bytes
        for heap in self.heaps:
            heap.drop(key)
        return resident

    def ordered(
        self, now: float, skip: Callable[[int], bool], setting: int | None = None
    ) -> _Ordered | list[Resident]:
        """The residents not skipped, in the policy's eviction order (``setting``: in that
        setting's order; else the active one's)."""
        policy = self.policy
        if setting is None:
            setting = policy.active
        if not self.heaps:
            policy = policy.settings()[setting]
            return rank(
                [r for k, r in self.residents.items() if not skip(k)], policy=policy, now=now
            )
        return _Ordered(self, self.heaps[setting], skip)


class _Ordered:
    """Lazily pops one of a tier's heaps in eviction order; ``restore`` puts back what was
    read."""

    def __init__(self, tier: _Tier, heap: _Heap, skip: Callable[[int], bool]) -> None:
        self.tier, self.heap, self.skip = tier, heap, skip
        self.read: list[tuple[float, int, int]] = []

    def __iter__(self) -> Iterator[Resident]:
        heap, residents, live = self.heap, self.tier.residents, len(self.tier.residents)
        entries, seq, pushed = heap.entries, heap.seq, heap.pushed
        while entries:
            entry = entries[0]
            key = entry[2]
            if seq.get(key) != entry[1]:
                heapq.heappop(entries)  # stale: re-pushed since, or gone
                continue
            current = residents[key]
            if pushed[key] is not current:  # accessed since: its key has only grown
                heapq.heappop(entries)
                heap.push(key, current, live)
                entries = heap.entries  # (a compaction replaces the list)
                continue
            if not self.skip(key):
                yield current  # still on top: a reader that stops here costs no pop
            self.read.append(heapq.heappop(entries))

    def restore(self) -> None:
        for entry in self.read:
            heapq.heappush(self.heap.entries, entry)
        self.read = []


def _restore(ordered) -> None:
    if isinstance(ordered, _Ordered):
        ordered.restore()


def replay(
    trace: Trace,
    policy: Policy | str,
    capacity: Capacity,
    costs: Costs | None = None,
    *,
    record_tiers: bool = False,
) -> Result:
    """Run ``trace`` through the tier model under ``policy``; see the module's docstring."""
    policy = make_policy(policy) if isinstance(policy, str) else policy
    costs = costs or Costs()
    half_life = policy.half_life_s
    result = Result(policy=policy.name, trace=trace.name, capacity=capacity)
    engine, disk = _Tier(policy), _Tier(policy, evicts=capacity.l3_bytes is not None)
    l1: list[int] = []  # device slots, most recent first
    recency: OrderedDict[int, None] = OrderedDict()  # engine residents, least recent first
    ready: dict[int, float] = {}  # when each version's last load finishes
    source: dict[int, str] = {}  # the tier that load came from
    fetchers = [0.0] * capacity.max_fetches
    loaders = [0.0] * capacity.max_loads
    pending: list[float] = []  # finish times of loads in flight
    n = len(trace.keys)
    ttft: list[float] = []
    hit: list[bool] = []
    base_ttft = costs.base_ttft_ms
    tier_log: list[str] | None = [] if record_tiers else None
    adapters, priorities = trace.adapters, trace.priorities
    quotas = capacity.warm_quotas or None
    l1_slots, l2_slots, l2_bytes = capacity.l1_slots, capacity.l2_slots, capacity.l2_bytes
    l3_bytes, ttl = capacity.l3_bytes, capacity.ttl_s
    peak = result.peak_bytes
    tiers = result.tiers
    next_expiry = 0.0
    l2_ms = costs.l2_ms
    observe = policy.observe
    held = trace.held_s
    held_until: dict[int, float] = {}  # when each version's last request ends (with ``held``)
    waiting_room: dict[int, list[tuple[int, float]]] = {}  # a load waiting for room: requests
    started = time.perf_counter()
    if capacity.warm_disk:
        start = trace.at[0] if trace.at else 0.0
        for key in dict.fromkeys(trace.keys):
            adapter = adapters[key]
            if l3_bytes is not None and disk.bytes + adapter.size_bytes > l3_bytes:
                break
            disk.put(
                key,
                Resident(
                    key,
                    adapter.tenant,
                    adapter.size_bytes,
                    start,
                    0.0,
                    costs.land_ms(adapter.size_bytes),
                    priorities.get(adapter.tenant, 1),
                ),
            )

    def refill_l1() -> None:
        if len(l1) < l1_slots and len(engine.residents) > len(l1):
            for k in reversed(recency):
                if k not in l1:
                    l1.append(k)
                    if len(l1) == l1_slots:
                        break

    def leave_engine(key: int) -> None:
        gone = engine.pop(key)
        recency.pop(key, None)
        if key in l1:
            l1.remove(key)
            refill_l1()
        if key in disk.residents:  # its use carries down to L3
            known = disk.residents[key]
            disk.put(
                key,
                Resident(
                    known.version_id,
                    known.tenant_id,
                    known.size_bytes,
                    max(known.last_used, gone.last_used),
                    gone.hits,
                    known.reload_cost_ms,
                    known.tenant_priority,
                ),
            )

    def busy(k: int, t: float) -> bool:
        """Loading, or held by a request still running at ``t``: it cannot leave the engine."""
        return ready.get(k, 0.0) > t or held_until.get(k, 0.0) > t

    def make_room(tenant: int, size: int, t: float, *, loading: int) -> bool:
        """Evict from the engine until one more version of ``tenant`` fits (placement.
        _make_room, EngineTiers.victims) at ``t``, beside ``loading`` loads not yet in the
        queue's count. False: every resident is held or loading, so the load waits for a
        release (only with holds; without them nothing is held)."""

        def skip(k: int, t: float = t) -> bool:
            return busy(k, t)

        while True:
            residents = engine.residents
            over_memory = bool(residents) and (
                l2_bytes is not None and engine.bytes + size > l2_bytes
            )
            capacity_now = len(residents) if over_memory else l2_slots
            if len(residents) < capacity_now and not quotas:
                return True
            ordered = engine.ordered(t, skip)
            asked: list = []

            def setting_order(e: int, asked: list = asked, t: float = t):
                asked.append(engine.ordered(t, skip, e))
                return asked[-1]

            victims = select_victims(
                residents.values(),
                policy=policy,
                now=t,
                capacity=capacity_now,
                requester=tenant,
                quotas=quotas,
                pressure=min(
                    1.0, (len(pending) + len(waiting_room) + loading) / capacity.max_pending
                ),
                ordered=ordered,
                census=engine.census,
                orders=setting_order,
            )
            _restore(ordered)
            for order in asked:
                _restore(order)
            if not victims and len(residents) >= capacity_now:
                fallback = engine.ordered(t, skip)
                victims = list(itertools.islice(fallback, 1))
                _restore(fallback)
            if not victims:
                return held is None or len(residents) < capacity_now
            for victim in victims:
                policy.on_evict(victim, t)
                leave_engine(victim.version_id)
                result.evictions["L2"] += 1

    def admit(key: int, t: float) -> None:
        """The version enters the engine at ``t`` (its room made)."""
        adapter = adapters[key]
        known = disk.residents.get(key)
        engine.put(
            key,
            Resident(
                key,
                adapter.tenant,
                adapter.size_bytes,
                t,
                known.hits if known is not None else 1.0,
                costs.load_ms("L3", adapter.size_bytes),
                priorities.get(adapter.tenant, 1),
            ),
        )

    settled = [0.0]  # when ``settle`` last placed a load: its clock never goes back

    def settle(until: float) -> None:
        """Loads waiting for room get it, oldest first, as the versions they wait on are let
        go (the end of their last request, or of their load), up to ``until``."""
        t = settled[0]
        while waiting_room:
            # make_room failed at t only if every resident was busy then: the next release
            frees = (max(held_until.get(k, 0.0), ready.get(k, 0.0)) for k in in_engine)
            released = min((f for f in frees if f > t), default=None)
            if released is None or released > until:
                return
            t = released
            while waiting_room:
                key = next(iter(waiting_room))
                size = adapters[key].size_bytes
                if not make_room(adapters[key].tenant, size, t, loading=0):
                    break
                settled[0] = t
                admit(key, t)
                done = t + (costs.l3_ms + costs.l3_ms_per_mb * size / MB) / 1000
                ready[key] = done
                heapq.heappush(pending, done)
                for index, arrived in waiting_room.pop(key):
                    ttft[index] = base_ttft + (done - arrived) * 1000

    in_engine = engine.residents  # (the same dict for the whole run)
    bytes_requested = bytes_hit = 0
    for index, (now, key) in enumerate(zip(trace.at, trace.keys, strict=True)):
        adapter = adapters[key]
        size = adapter.size_bytes
        bytes_requested += size
        if waiting_room:
            settle(now)
        observe(key, now)  # every request, as the node's cache manager does
        if ttl is not None and now >= next_expiry:  # the node's TTL sweep, once a second
            next_expiry = now + 1.0
            cutoff = now - ttl
            for gone in [k for k, r in engine.residents.items() if r.last_used < cutoff]:
                if ready.get(gone, 0.0) <= now and held_until.get(gone, 0.0) <= now:
                    leave_engine(gone)
                    result.evictions["L2"] += 1
        while pending and pending[0] <= now:
            heapq.heappop(pending)

        served_hot = False
        resident = in_engine.get(key)
        wait: float | None
        if key in waiting_room:  # its load waits for room: so does this request
            tier = source[key]
            waiting_room[key].append((index, now))
            wait = None  # known when the room is
        elif resident is not None:
            if ready.get(key, 0.0) > now:  # still loading: wait for that load
                tier = source[key]
                wait = (ready[key] - now) * 1000
            else:
                tier = "L1" if key in l1 else "L2"
                wait = l2_ms if tier == "L2" else 0.0
                served_hot = True
                bytes_hit += size
            engine.touch(key, resident.touched(now, half_life))
        else:
            tier = "L3" if key in disk.residents else "L4"
            t0 = now
            if len(pending) + len(waiting_room) >= capacity.max_pending and pending:
                result.queue_full += 1  # the queue is full: wait for room
                t0 = heapq.heappop(pending)
            if tier == "L4":
                fetched = max(t0, fetchers[0]) + costs.land_ms(size) / 1000
                heapq.heapreplace(fetchers, fetched)  # the download slot free first
                t0 = fetched
            done = max(t0, loaders[0]) + (costs.l3_ms + costs.l3_ms_per_mb * size / MB) / 1000
            source[key] = tier
            result.loads += 1
            result.reload_ms += costs.load_ms(tier, size)
            # L3 first, as the node lands a version before adding it to the engine
            known = disk.residents.get(key)
            priority = priorities.get(adapter.tenant, 1)
            if known is None:
                known = Resident(key, adapter.tenant, size, now, 0.0, 0.0, priority)
            known = known.touched(now, half_life)
            if tier == "L4":
                known = Resident(
                    known.version_id,
                    known.tenant_id,
                    size,
                    now,
                    known.hits,
                    costs.land_ms(size),
                    priority,
                )
            disk.put(key, known)
            if tier == "L4" and l3_bytes is not None and disk.bytes > l3_bytes:
                over = disk.bytes - l3_bytes

                def on_disk_busy(k: int, key: int = key, now: float = now) -> bool:
                    return (
                        k == key
                        or k in engine.residents
                        or k in waiting_room
                        or ready.get(k, 0.0) > now
                    )

                candidates = disk.ordered(now, on_disk_busy)
                chosen = []
                for victim in candidates:
                    if over <= 0:
                        break
                    chosen.append(victim)
                    over -= victim.size_bytes
                _restore(candidates)
                for victim in chosen:
                    policy.on_evict(victim, now)
                    disk.pop(victim.version_id)
                    result.evictions["L3"] += 1
            if make_room(adapter.tenant, size, now, loading=1):
                heapq.heapreplace(loaders, done)  # the engine-add slot free first
                heapq.heappush(pending, done)
                ready[key] = done
                wait = (done - now) * 1000
                admit(key, now)
            else:  # every resident held: wait for the first let go (``settle``)
                waiting_room[key] = [(index, now)]
                wait = None
        if held is not None:
            held_until[key] = max(held_until.get(key, 0.0), now + held[index])
        # device slots: the most recently used versions in the engine
        recency[key] = None
        recency.move_to_end(key)
        if tier == "L1":
            l1.remove(key)
            l1.insert(0, key)
        else:
            if key in l1:
                l1.remove(key)
            l1.insert(0, key)
            if len(l1) > l1_slots:
                l1.pop()
            if len(l1) * size > peak["L1"]:  # (cheap test first: most runs have one size)
                peak["L1"] = max(peak["L1"], sum(adapters[k].size_bytes for k in l1))
        tiers[tier] += 1
        ttft.append(base_ttft + wait if wait is not None else 0.0)
        hit.append(served_hot)
        if tier_log is not None:
            tier_log.append(tier)
        if engine.bytes > peak["L2"]:
            peak["L2"] = engine.bytes
        if disk.bytes > peak["L3"]:
            peak["L3"] = disk.bytes
    if waiting_room:
        settle(float("inf"))
    result.seconds = time.perf_counter() - started
    result.bytes_requested, result.bytes_hit = bytes_requested, bytes_hit
    result.requests = n
    result.ttft_ms = np.array(ttft)
    result.hit_of_request = np.array(hit, dtype=bool)
    result.tenant_of_request = np.array([adapters[k].tenant for k in trace.keys], dtype=np.int64)
    result.tier_log = tier_log
    return result
