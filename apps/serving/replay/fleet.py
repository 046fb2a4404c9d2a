"""Several nodes behind a router, simulated: which node each request goes to, then each node's
share of the trace through the tier model (``simulate.simulate``) with the node's own policy.

Routers (the ones an operator chooses between in front of a fleet):

- ``round-robin``: request i goes to node i mod N.
- ``least-loaded``: the node with the fewest requests in flight (ties: the next in turn).
- ``consistent``: a hash ring with ``VNODES`` points per node; a request goes to the first
  point at or after its key's hash. The key is the adapter (tenant and adapter), as HAProxy's
  key is the API key's prefix and the model.
- ``bounded-<f>``: consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam
  2018; HAProxy's ``hash-balance-factor``): a node may hold at most
  ``ceil(f * (requests in flight + 1) / N)`` requests; a request walks the ring from its
  key's point to the first node under that bound.

Load model: each request keeps its node busy for ``service_s`` seconds (a generation), and the
trace's arrival times are divided by ``speedup`` so that a small trace can load a large fleet.
The routing decision does not depend on hits (a cold load does not lengthen the request here):
the router sees only in-flight counts, as HAProxy does.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import math
from dataclasses import dataclass, replace

import numpy as np

from apps.serving.replay import simulate as single
from apps.serving.replay.simulate import Capacity, Costs, Result
from apps.serving.replay.traces import Trace

VNODES = 160
ROUTERS = ("round-robin", "least-loaded", "consistent", "bounded-1.25", "bounded-1.5")


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class Ring:
    """A consistent-hash ring: ``VNODES`` points per node."""

    def __init__(self, nodes: int, vnodes: int = VNODES) -> None:
        points = sorted((_hash(f"node-{n}#{v}"), n) for n in range(nodes) for v in range(vnodes))
        self.hashes = [h for h, _ in points]
        self.owners = [n for _, n in points]
        self.nodes = nodes

    def walk(self, key: str):
        """The distinct nodes in ring order from the key's point."""
        start = bisect.bisect_left(self.hashes, _hash(key)) % len(self.hashes)
        seen: set[int] = set()
        for i in range(len(self.owners)):
            node = self.owners[(start + i) % len(self.owners)]
            if node not in seen:
                seen.add(node)
                yield node
                if len(seen) == self.nodes:
                    return


def route(trace: Trace, router: str, nodes: int, *, service_s: float, speedup: float) -> np.ndarray:
    """The node (0..nodes-1) each request of ``trace`` goes to under ``router``."""
    if nodes < 1:
        raise ValueError("a fleet needs at least one node")
    factor = None
    if router.startswith("bounded-"):
        factor = float(router.removeprefix("bounded-"))
        if factor < 1.0:
            raise ValueError("a bounded-load factor is at least 1.0")
    elif router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)} or bounded-<factor>")
    ring = Ring(nodes) if router == "consistent" or factor else None
    finishing: list[tuple[float, int]] = []  # (finish time, node) of requests in flight
    load = [0] * nodes
    in_flight = 0
    turn = 0
    owner_cache: dict[int, list[int]] = {}
    out = np.empty(len(trace.keys), dtype=np.int64)
    for i, (at, key) in enumerate(zip(trace.at, trace.keys, strict=True)):
        now = at / speedup
        while finishing and finishing[0][0] <= now:
            _, done = heapq.heappop(finishing)
            load[done] -= 1
            in_flight -= 1
        if router == "round-robin":
            node = i % nodes
        elif router == "least-loaded":
            low = min(load)
            node = next(n for k in range(nodes) if load[n := (turn + k) % nodes] == low)
            turn = (node + 1) % nodes
        else:
            assert ring is not None
            order = owner_cache.get(key)
            if order is None:
                order = owner_cache[key] = list(ring.walk(trace.adapters[key].label))
            if factor is None:
                node = order[0]
            else:
                bound = math.ceil(factor * (in_flight + 1) / nodes)
                node = next((n for n in order if load[n] < bound), order[0])
        out[i] = node
        load[node] += 1
        in_flight += 1
        heapq.heappush(finishing, (now + service_s, node))
    return out


@dataclass
class FleetResult:
    router: str
    nodes: int
    requests: int
    hits: int  # served from an engine (L1 or L2) without a load
    local: int  # served without a registry fetch (L1, L2 or L3)
    per_node: list[int]  # requests per node
    results: list[Result]

    @property
    def hit_rate(self) -> float:
        return self.hits / max(self.requests, 1)

    @property
    def local_rate(self) -> float:
        return self.local / max(self.requests, 1)

    @property
    def imbalance(self) -> float:
        """Max over mean requests per node: 1.0 is perfectly even."""
        mean = self.requests / self.nodes
        return max(self.per_node) / mean if mean else 1.0

    def ttft(self, q: float) -> float:
        joined = np.concatenate([r.ttft_ms for r in self.results if len(r.ttft_ms)])
        return float(np.percentile(joined, q)) if len(joined) else 0.0


def subtrace(trace: Trace, mask: np.ndarray, name: str) -> Trace:
    picked = np.flatnonzero(mask)
    return replace(
        trace,
        name=name,
        at=[trace.at[i] for i in picked],
        keys=[trace.keys[i] for i in picked],
        tiers=None,
    )


def simulate(
    trace: Trace,
    *,
    router: str,
    nodes: int,
    capacity: Capacity,
    policy: str = "weighted",
    costs: Costs | None = None,
    service_s: float = 4.0,
    speedup: float = 1.0,
) -> FleetResult:
    """Route ``trace`` over ``nodes`` nodes, each with ``capacity``, and replay each share."""
    assignment = route(trace, router, nodes, service_s=service_s, speedup=speedup)
    results = [
        single.simulate(
            subtrace(trace, assignment == n, f"{trace.name}@node{n}"), policy, capacity, costs
        )
        for n in range(nodes)
    ]
    return FleetResult(
        router=router,
        nodes=nodes,
        requests=len(trace.keys),
        hits=sum(r.hits for r in results),
        local=sum(r.hits + r.tiers["L3"] for r in results),
        per_node=[r.requests for r in results],
        results=results,
    )


def pooled(capacity: Capacity, nodes: int) -> Capacity:
    """One cache holding the whole fleet's capacity (the reference a router is judged by)."""

    def times(value):
        return None if value is None else value * nodes

    return replace(
        capacity,
        l1_slots=capacity.l1_slots * nodes,
        l2_slots=capacity.l2_slots * nodes,
        l2_bytes=times(capacity.l2_bytes),
        l3_bytes=times(capacity.l3_bytes),
        max_fetches=capacity.max_fetches * nodes,
        max_loads=capacity.max_loads * nodes,
        max_pending=capacity.max_pending * nodes,
    )
