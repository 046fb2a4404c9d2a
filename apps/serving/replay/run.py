"""One replay as the command line and the console ask for it: build the trace, run every
policy and the offline optimum through the tier model, sweep capacities, return a JSON-able
report. ``report.py`` prints it."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apps.serving.cache.policies import POLICIES, SETTINGS, Adaptive, Weighted, make_policy
from apps.serving.replay import traces
from apps.serving.replay.offline import Oracle, belady_hits, known_popularity_hits
from apps.serving.replay.simulate import MB, TIERS, Capacity, Costs, Result, simulate

GIB = 1024**3
SYNTHETIC = ("zipf", "shift", "bursty", "scan")
SOURCES = (*SYNTHETIC, "csv", "db", "file")
L2_SWEEP = (4, 8, 16, 32, 64, 128, 256)
L1_SWEEP = (1, 2, 4, 8, 16)

Progress = Callable[[int, int, str], None]


@dataclass
class TraceSpec:
    """Where the requests come from (``source``) and, for traces without tenants or adapters,
    the mapping (see ``traces``)."""

    source: str = "zipf"
    path: str = ""  # csv / file: a path on the machine running the replay (never from a browser)
    since_hours: float = 24.0  # db
    tenant: str = ""  # db: one tenant's requests only
    alpha: float = 1.0
    drift: float = 0.2  # csv and shift
    drift_every_s: float = 600.0
    adapters: int = 1000
    tenants: int = 30
    sizes: str = "uniform"
    seed: int = 7
    requests: int = 50_000
    rate: float = traces.AZURE_RATE

    def build(self) -> traces.Trace:
        world = traces.World(self.adapters, self.tenants, self.sizes, self.seed)
        requests, rate = self.requests, self.rate
        if self.source == "zipf":
            return traces.zipf(self.alpha, requests=requests, rate=rate, world=world)
        if self.source == "shift":
            return traces.zipf(
                self.alpha,
                requests=requests,
                rate=rate,
                world=world,
                drift=self.drift or 0.2,
                drift_every_s=self.drift_every_s,
                name="shift",
            )
        if self.source == "bursty":
            return traces.bursty(alpha=self.alpha, requests=requests, rate=rate, world=world)
        if self.source == "scan":
            return traces.scan(alpha=self.alpha, requests=requests, rate=rate, world=world)
        if self.source == "csv":
            return traces.from_csv(
                Path(self.path),
                world=world,
                alpha=self.alpha,
                drift=self.drift,
                drift_every_s=self.drift_every_s,
            )
        if self.source == "file":
            return traces.read_export(Path(self.path))
        if self.source == "db":
            from apps.telemetry.requestlog import trace_from_log  # Django only here

            return trace_from_log(since_hours=self.since_hours, tenant=self.tenant or None)
        raise ValueError(f"unknown trace source {self.source!r}; use one of {', '.join(SOURCES)}")


@dataclass
class Spec:
    trace: TraceSpec = field(default_factory=TraceSpec)
    policies: tuple[str, ...] = POLICIES
    capacity: Capacity = field(default_factory=Capacity)
    costs: Costs = field(default_factory=Costs)
    sweep_l2: tuple[int, ...] = ()
    sweep_l1: tuple[int, ...] = ()

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Spec:
        capacity = dict(data.get("capacity", {}))
        capacity["warm_quotas"] = {int(k): v for k, v in capacity.get("warm_quotas", {}).items()}
        return cls(
            trace=TraceSpec(**data.get("trace", {})),
            policies=tuple(data.get("policies", POLICIES)),
            capacity=Capacity(**capacity),
            costs=Costs(**data.get("costs", {})),
            sweep_l2=tuple(data.get("sweep_l2", ())),
            sweep_l1=tuple(data.get("sweep_l1", ())),
        )


def capacity_from_config(config=None) -> Capacity:
    """The capacities of the cache configuration in force (or ``config``)."""
    if config is None:
        from apps.serving.config import effective_config  # Django only here

        config = effective_config()
    cache = config.adapter_cache
    return Capacity(
        l1_slots=cache.gpu_hot.max_adapters,
        l2_slots=cache.cpu_warm.max_adapters,
        l2_bytes=int(cache.cpu_warm.max_memory_gb * GIB),
        l3_bytes=int(cache.disk_cache.max_size_gb * GIB),
        ttl_s=cache.cpu_warm.ttl_minutes * 60,
        max_fetches=cache.load_queue.max_concurrent_fetches,
        max_loads=cache.loads_at_once,
        max_pending=cache.load_queue.max_pending,
    )


def equal_sizes(trace: traces.Trace, capacity: Capacity) -> bool:
    """True when Belady's MIN is the bound: one size, and slots (not bytes) limit the engine."""
    sizes = {a.size_bytes for a in trace.adapters.values()}
    if len(sizes) > 1:
        return False
    return capacity.l2_bytes is None or capacity.l2_slots * sizes.pop() <= capacity.l2_bytes


def summarize(result: Result, optimum_hits: float | None = None) -> dict:
    """A run's figures, JSON-able. ``optimum_hits``: the offline optimum's hit rate."""
    tenants = result.per_tenant()
    out = {
        "policy": result.policy,
        "requests": result.requests,
        "hit_rate": result.hit_rate,
        "tier_rates": {tier: result.rate(tier) for tier in TIERS},
        "byte_hit_rate": result.byte_hit_rate,
        "loads": result.loads,
        "reload_s": result.reload_ms / 1000,
        "ttft_ms": {f"p{q}": result.ttft(q) for q in (50, 95, 99)},
        "peak_mb": {tier: round(b / MB, 1) for tier, b in result.peak_bytes.items()},
        "evictions": dict(result.evictions),
        "queue_full": result.queue_full,
        "fairness": result.fairness(),
        "tenants": {str(t): v for t, v in tenants.items()},
        "requests_per_s": result.requests_per_s,
    }
    if optimum_hits:
        out["share_of_optimum"] = result.hit_rate / optimum_hits
    return out


def optimum(trace: traces.Trace, capacity: Capacity, costs: Costs) -> dict:
    """Belady's MIN on equal sizes (and, on a generated trace, the online ceiling of a policy
    that knows the popularity); the documented offline heuristic otherwise."""
    if equal_sizes(trace, capacity):
        hits = belady_hits(trace, capacity.l2_slots)
        best = {"kind": "Belady MIN", "hit_rate": hits / max(len(trace), 1), "bound": True}
        known = known_popularity_hits(trace, capacity.l2_slots)
        if known is not None:  # a generated trace: the online ceiling too
            best["known_popularity_hit_rate"] = known / max(len(trace), 1)
        return best
    result = simulate(trace, Oracle(trace), capacity, costs)
    figures = summarize(result)
    return {"kind": "offline heuristic", "bound": False, **figures}


def execute(
    spec: Spec, progress: Progress | None = None, trace: traces.Trace | None = None
) -> dict:
    """Run ``spec``; ``progress(done, total, what)`` is called as runs finish."""
    trace = trace or spec.trace.build()
    if not len(trace):
        raise ValueError("the trace has no requests: widen --since or pick another source")
    capacity, costs = spec.capacity, spec.costs
    sweeps = {"l2": spec.sweep_l2, "l1": spec.sweep_l1}
    total = 1 + len(spec.policies) * (1 + sum(len(v) for v in sweeps.values())) + len(spec.sweep_l2)
    done = itertools.count(1)

    def tick(what: str) -> None:
        if progress:
            progress(next(done), total, what)

    best = optimum(trace, capacity, costs)
    tick("offline optimum")
    runs = {}
    for name in spec.policies:
        runs[name] = summarize(simulate(trace, name, capacity, costs), best["hit_rate"])
        tick(name)
    report: dict[str, Any] = {
        "trace": {
            "name": trace.name,
            "description": trace.description,
            "requests": len(trace),
            "adapters": len(set(trace.keys)),
            "tenants": len(set(trace.adapters[k].tenant for k in set(trace.keys))),
            "duration_s": (trace.at[-1] - trace.at[0]) if len(trace) > 1 else 0.0,
        },
        "capacity": {**dataclasses.asdict(capacity), "described": capacity.describe()},
        "costs": dataclasses.asdict(costs),
        "optimum": best,
        "policies": runs,
        "policy_order": list(runs),  # (a jsonb column does not keep the keys' order)
        "tenant_names": {str(t): name for t, name in trace.tenant_names.items()},
        "tenant_priorities": {str(t): p for t, p in trace.priorities.items()},
        "default": make_policy("weighted").name,
        "sweeps": {},
    }
    if trace.tiers:
        report["node_tiers"] = {tier: trace.tiers.count(tier) / len(trace) for tier in TIERS}
    for which, values in sweeps.items():
        if not values:
            continue
        curve: dict = {"values": list(values), "policies": {}}
        for name in spec.policies:
            rates = []
            for value in values:
                cap = _resized(capacity, which, value)
                result = simulate(trace, name, cap, costs)
                rates.append(result.rate("L1") if which == "l1" else result.hit_rate)
                tick(f"{name} {which.upper()}={value}")
            curve["policies"][name] = rates
        if which == "l2":
            curve["optimum"] = []
            for value in values:
                curve["optimum"].append(
                    optimum(trace, _resized(capacity, "l2", value), costs)["hit_rate"]
                )
                tick(f"optimum L2={value}")
        report["sweeps"][which] = curve
    return report


def _resized(capacity: Capacity, which: str, value: int) -> Capacity:
    if which == "l1":
        return dataclasses.replace(capacity, l1_slots=value, l2_slots=max(capacity.l2_slots, value))
    return dataclasses.replace(capacity, l2_slots=value, l1_slots=min(capacity.l1_slots, value))


# --- tuning ------------------------------------------------------------------------------------

MEMORIES = (0.99, 0.996, 0.999)
DRIFT_HALF_LIVES = (120.0, 240.0, 600.0)  # the "drift" setting's count half-life
BURST_RECENCIES = (15.0, 30.0, 60.0)  # the "bursts" setting's recency half-life
PRIORITY_WEIGHTS = (0.0, 0.1)
SIZE_EXPONENTS = (0.5, 1.0)


def adaptive(
    memory: float,
    drift_half_life_s: float,
    bursts_recency_s: float,
    priority_weight: float,
    size_exponent: float,
) -> Adaptive:
    """The default policy with these parameters (the rest as shipped)."""
    settings = dict(SETTINGS)
    settings["drift"] = (drift_half_life_s, min(settings["drift"][1], drift_half_life_s))
    settings["bursts"] = (settings["bursts"][0], bursts_recency_s)
    experts = tuple(
        Weighted(
            half_life_s=count,
            recency_half_life_s=recency,
            priority_weight=priority_weight,
            size_exponent=size_exponent,
        )
        for count, recency in settings.values()
    )
    return Adaptive(experts=experts, labels=tuple(settings), memory=memory)


def shipped_parameters() -> dict:
    policy, setting = Adaptive(), Weighted()
    return {
        "memory": policy.memory,
        "drift_half_life_s": SETTINGS["drift"][0],
        "bursts_recency_s": SETTINGS["bursts"][1],
        "priority_weight": setting.priority_weight,
        "size_exponent": setting.size_exponent,
    }


def tune(
    train: traces.Trace,
    validate: traces.Trace,
    capacity: Capacity,
    costs: Costs,
    progress: Progress | None = None,
) -> list[dict]:
    """Grid-search the default policy's parameters on ``train`` and score each setting on
    ``validate`` too: rows sorted by the training objective (hit rate on equal sizes, least
    reload time otherwise), so a setting that wins only on its own trace shows."""
    by_hits = equal_sizes(train, capacity)
    names = tuple(shipped_parameters())
    grid = list(
        itertools.product(
            MEMORIES,
            DRIFT_HALF_LIVES,
            BURST_RECENCIES,
            PRIORITY_WEIGHTS,
            (1.0,) if by_hits else SIZE_EXPONENTS,
        )
    )
    rows = []
    for n, values in enumerate(grid, start=1):
        params = dict(zip(names, values, strict=True))
        row: dict = {"params": params}
        for which, trace in (("train", train), ("validate", validate)):
            result = simulate(trace, adaptive(**params), capacity, costs)
            row[which] = {"hit_rate": result.hit_rate, "reload_s": result.reload_ms / 1000}
        rows.append(row)
        if progress:
            progress(n, len(grid), f"memory {params['memory']:g}")
    objective = "hit_rate" if by_hits else "reload_s"
    rows.sort(key=lambda r: r["train"][objective], reverse=by_hits)
    shipped = shipped_parameters()
    for row in rows:
        row["shipped"] = row["params"] == shipped
    return rows
