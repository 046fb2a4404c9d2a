"""Sizing a fleet: N simulated nodes behind each routing policy, on the shared Azure trace.

Each request is routed (``apps/serving/replay/fleet.py``: round robin, least loaded,
consistent hashing, consistent hashing with bounded loads at several factors), then each
node's share of the trace runs through the node's tier model with the default policy. The
reference, measured in the same run: one cache holding the whole fleet's capacity (every
tier N times larger) under the same policy — what perfect routing could reach.

Trace: ../shared/traces/azure-llm-2023-conv.csv (19,366 real arrivals) under the replay's
documented mapping (1,000 adapters over 30 tenants, Zipf 1.0, 20 % of the ranks re-shuffled
every 10 minutes, seed 7; ``apps/serving/replay/traces.py``).
Per node: L1 8 device slots, L2 32 engine slots, L3 unbounded (uniform 27 MB adapters).
Load: each request is a 4 s generation; arrivals are sped up so that the fleet averages
``--in-flight`` requests per node (8 and 32 by default: a lightly and a fully batched GPU).

Printed per fleet size and load: fleet hit rate (served from an engine: L1+L2), its gap to
the pooled cache in points and its ratio to round robin, the local rate (no registry fetch:
L1-L3) and the max/mean requests-per-node ratio (1.00 = perfectly even).

Usage: .venv/bin/python bench/fleet.py [--nodes 4,16] [--in-flight 8,32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from apps.serving.replay import fleet, traces  # noqa: E402
from apps.serving.replay.simulate import Capacity, simulate  # noqa: E402

AZURE = ROOT.parent / "shared" / "traces" / "azure-llm-2023-conv.csv"
CAPACITY = Capacity(l1_slots=8, l2_slots=32)
SERVICE_S = 4.0
ROUTERS = ("round-robin", "least-loaded", "consistent", "bounded-1.25", "bounded-1.5", "bounded-2")


def one(job: tuple[int, int]) -> dict:
    nodes, per_node = job
    trace = traces.from_csv(AZURE)
    rate = len(trace) / trace.at[-1]
    speedup = per_node * nodes / (rate * SERVICE_S)
    pooled = simulate(trace, "weighted", fleet.pooled(CAPACITY, nodes))
    rows = {}
    for router in ROUTERS:
        result = fleet.simulate(
            trace,
            router=router,
            nodes=nodes,
            capacity=CAPACITY,
            service_s=SERVICE_S,
            speedup=speedup,
        )
        rows[router] = {
            "hit_rate": result.hit_rate,
            "local_rate": result.local_rate,
            "imbalance": result.imbalance,
            "ttft_p95_ms": result.ttft(95),
        }
    return {
        "nodes": nodes,
        "in_flight_per_node": per_node,
        "speedup": speedup,
        "pooled": {
            "hit_rate": pooled.hit_rate,
            "local_rate": (pooled.hits + pooled.tiers["L3"]) / pooled.requests,
        },
        "routers": rows,
    }


def table(run: dict) -> str:
    pooled = run["pooled"]["hit_rate"]
    rr = run["routers"]["round-robin"]["hit_rate"]
    lines = [
        f"\n{run['nodes']} nodes, {run['in_flight_per_node']} requests in flight per node "
        f"(arrivals x{run['speedup']:.1f}); pooled cache: hit {pooled:.3f}, "
        f"local {run['pooled']['local_rate']:.3f}",
        "| router | hit rate | vs pooled (points) | x round robin | local (L1-L3) | "
        "max/mean load |",
        "|---|---|---|---|---|---|",
    ]
    for router, row in run["routers"].items():
        lines.append(
            f"| {router} | {row['hit_rate']:.3f} | {100 * (row['hit_rate'] - pooled):+.1f} | "
            f"{row['hit_rate'] / rr:.2f} | {row['local_rate']:.3f} | {row['imbalance']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="4,16")
    parser.add_argument("--in-flight", default="8,32")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not AZURE.exists():
        sys.exit(f"{AZURE} is missing: this bench replays the shared Azure trace")
    jobs = [(int(n), int(p)) for n in args.nodes.split(",") for p in args.in_flight.split(",")]
    print(__doc__.split("\n\n")[2])
    print(f"per node: {CAPACITY.describe()}, policy weighted, {SERVICE_S:g} s per request")
    with ProcessPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(one, jobs))
    for run in runs:
        print(table(run))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
