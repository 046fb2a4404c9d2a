"""Replay a production arrival trace against each eviction policy, on the same request log.

The trace (../shared/traces/azure-llm-2023-conv.csv: one hour, 19,366 requests) has arrival
times and token counts but no tenants or adapters. This replay assigns them with a seeded,
documented scheme, printed beside the results:

* ``--adapters`` adapters (default 300) owned by ``--tenants`` tenants (default 30), tenant
  priority 0/1/2 in a 50/35/15 mix; adapter sizes from their rank (8, 16, 32, 64 → 14, 27, 55,
  109 MB: Llama-3-8B q/k/v/o in bf16); reload cost ~ 40 ms + 8 ms per MB with ±30 % noise.
* Popularity is Zipf(s=1.1) over adapters; every 10 minutes of the trace the ranking shifts:
  20 % of the adapters swap ranks at random (new launches, campaigns ending).
* One request per trace row, at its timestamp. The cache holds ``--slots`` adapters (default
  16, the seed's ``gpu_hot.max_adapters``); a miss loads the adapter and evicts by the policy.

Prints hit rate, evictions, reload time spent, and hit rate per tenant priority, per policy.
Usage: .venv/bin/python bench/replay_policies.py [--slots 16] [--adapters 300] [--seed 7]
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from apps.serving.cache.policy import Resident, make_policy, select_victims  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "azure-llm-2023-conv.csv"
RANK_MB = {8: 14, 16: 27, 32: 55, 64: 109}


def load_arrivals(path: Path) -> list[float]:
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    stamps = [datetime.fromisoformat(r["TIMESTAMP"][:26]) for r in rows]
    start = stamps[0]
    return [(s - start).total_seconds() for s in stamps]


def build_world(n_adapters: int, n_tenants: int, rng: random.Random):
    tenants = {t: rng.choices([0, 1, 2], weights=[50, 35, 15])[0] for t in range(n_tenants)}
    adapters = []
    for a in range(n_adapters):
        rank = rng.choices([8, 16, 32, 64], weights=[40, 35, 18, 7])[0]
        size_mb = RANK_MB[rank]
        cost = (40 + 8 * size_mb) * rng.uniform(0.7, 1.3)
        adapters.append({"id": a, "tenant": a % n_tenants, "size_mb": size_mb, "cost": cost})
    return tenants, adapters


def assign(arrivals: list[float], n_adapters: int, rng: random.Random) -> list[int]:
    weights = [1.0 / (k + 1) ** 1.1 for k in range(n_adapters)]
    ranking = list(range(n_adapters))
    rng.shuffle(ranking)
    out, epoch = [], -1
    for t in arrivals:
        if int(t // 600) != epoch:
            epoch = int(t // 600)
            if epoch:
                moved = rng.sample(range(n_adapters), k=n_adapters // 5)
                shuffled = moved[:]
                rng.shuffle(shuffled)
                snapshot = ranking[:]
                for src, dst in zip(moved, shuffled, strict=True):
                    ranking[dst] = snapshot[src]
        out.append(ranking[rng.choices(range(n_adapters), weights=weights)[0]])
    return out


def replay(policy_name, arrivals, requests, tenants, adapters, slots):
    policy = make_policy(policy_name)
    cache: dict[int, Resident] = {}
    hits = evictions = 0
    reload_ms = 0.0
    by_priority = defaultdict(lambda: [0, 0])
    for now, a in zip(arrivals, requests, strict=True):
        info = adapters[a]
        prio = tenants[info["tenant"]]
        by_priority[prio][1] += 1
        if a in cache:
            hits += 1
            by_priority[prio][0] += 1
            cache[a] = cache[a].touched(now)
            continue
        reload_ms += info["cost"]
        victims = select_victims(list(cache.values()), policy=policy, now=now, capacity=slots)
        for v in victims:
            policy.on_evict(v, now)
            del cache[v.key[0]]
            evictions += 1
        cache[a] = Resident(
            key=(a,),
            tenant_id=info["tenant"],
            size_bytes=int(info["size_mb"] * 1048576),
            last_used=now,
            hits=1.0,
            reload_cost_ms=info["cost"],
            tenant_priority=prio,
        )
    return hits, evictions, reload_ms, by_priority


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--adapters", type=int, default=300)
    parser.add_argument("--tenants", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--trace", type=Path, default=TRACE)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    arrivals = load_arrivals(args.trace)
    tenants, adapters = build_world(args.adapters, args.tenants, rng)
    requests = assign(arrivals, args.adapters, rng)
    print(
        f"\ntrace: {args.trace.name}, {len(arrivals)} requests over "
        f"{arrivals[-1] / 60:.0f} min; {args.adapters} adapters, {args.tenants} tenants, "
        f"{args.slots} slots, seed {args.seed}; Zipf 1.1, 20 % re-ranked every 10 min\n"
    )
    print(
        f"{'policy':<10}{'hit rate':>10}{'evictions':>11}{'reload s':>10}"
        f"{'hit p0':>9}{'hit p1':>9}{'hit p2':>9}"
    )
    results = {}
    for name in ("lru", "lfu", "weighted", "gdsf"):
        hits, evictions, reload_ms, by_p = replay(
            name, arrivals, requests, tenants, adapters, args.slots
        )
        results[name] = reload_ms
        rates = [by_p[p][0] / max(by_p[p][1], 1) for p in (0, 1, 2)]
        print(
            f"{name:<10}{hits / len(requests):>10.3f}{evictions:>11}{reload_ms / 1000:>10.1f}"
            + "".join(f"{r:>9.3f}" for r in rates)
        )
    print(
        "\nreload time vs. LRU: "
        + ", ".join(f"{n} {results[n] / results['lru']:.2f}x" for n in ("lfu", "weighted", "gdsf"))
    )


if __name__ == "__main__":
    main()
