"""``manage.py replay``: compare eviction policies and capacities on recorded or synthetic
traffic before they go live. See ``apps/serving/replay/`` and docs/replay.md."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.serving.cache.policies import POLICIES
from apps.serving.replay import report as tables
from apps.serving.replay import run
from apps.serving.replay.simulate import Capacity, Costs
from apps.serving.replay.traces import AZURE_RATE
from apps.tenants.errors import DomainError

DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([mhd])$")


def hours(text: str) -> float:
    """'90m', '24h' or '7d' in hours."""
    match = DURATION.match(text.strip())
    if not match:
        raise CommandError(f"--since {text!r}: write a number and m, h or d (e.g. 24h)")
    value, unit = float(match[1]), match[2]
    return value / 60 if unit == "m" else value * 24 if unit == "d" else value


def int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise CommandError(f"{text!r}: write whole numbers separated by commas") from None
    if any(v < 1 for v in values):
        raise CommandError(f"{text!r}: capacities are at least 1")
    return values


class Command(BaseCommand):
    help = (
        "Replay traffic through the node's adapter-cache tiers under each eviction policy and "
        "print hit rates per tier, reload time, TTFT, memory, evictions, per-tenant fairness and "
        "each policy's share of the offline optimum. Capacities default to the cache "
        "configuration in force."
    )

    def add_arguments(self, parser) -> None:
        source = parser.add_argument_group("trace (pick one; default --synthetic zipf)")
        source.add_argument("--from-db", action="store_true", help="this platform's request log")
        source.add_argument("--since", default="24h", help="with --from-db: 90m, 24h, 7d")
        source.add_argument("--tenant", default="", help="with --from-db: one tenant's slug")
        source.add_argument("--csv", type=Path, help="an arrival trace with a TIMESTAMP column")
        source.add_argument("--file", type=Path, help="a file written by export_requests")
        source.add_argument("--synthetic", choices=run.SYNTHETIC)
        mapping = parser.add_argument_group("mapping of --csv and synthetic traces")
        mapping.add_argument("--alpha", type=float, default=1.0, help="Zipf exponent")
        mapping.add_argument("--drift", type=float, default=0.2, help="share of ranks shuffled")
        mapping.add_argument("--drift-every", type=float, default=600.0, help="seconds")
        mapping.add_argument("--adapters", type=int, default=1000)
        mapping.add_argument("--tenants", type=int, default=30)
        mapping.add_argument("--sizes", choices=("uniform", "mixed"), default="uniform")
        mapping.add_argument("--seed", type=int, default=7)
        mapping.add_argument("--requests", type=int, default=50_000, help="synthetic only")
        mapping.add_argument("--rate", type=float, default=AZURE_RATE, help="synthetic req/s")
        tiers = parser.add_argument_group("capacities (default: the cache configuration)")
        tiers.add_argument("--l1", type=int, help="device slots (gpu_hot.max_adapters)")
        tiers.add_argument("--l2", type=int, help="engine slots (cpu_warm.max_adapters)")
        tiers.add_argument("--l2-gb", type=float, help="engine memory cap; 0: none")
        tiers.add_argument("--l3-gb", type=float, help="disk cap; 0: unbounded")
        tiers.add_argument(
            "--warm-disk",
            action="store_true",
            help="start with every version of the trace on disk (a prewarmed node); "
            "default: an empty disk",
        )
        tiers.add_argument("--ttl-minutes", type=float, help="engine idle TTL; 0: none")
        tiers.add_argument("--max-pending", type=int)
        tiers.add_argument("--max-loads", type=int)
        tiers.add_argument("--max-fetches", type=int)
        costs = parser.add_argument_group(
            "load costs in ms (default: what the nodes measured, where they have; else "
            "bench/load_tiers.py's)"
        )
        costs.add_argument(
            "--bench-costs", action="store_true", help="bench/load_tiers.py's, not the nodes'"
        )
        costs.add_argument("--costs-from-db", action="store_true", help=argparse.SUPPRESS)
        for name in ("base-ttft-ms", "l2-ms", "l3-ms", "l3-ms-per-mb", "l4-ms", "l4-ms-per-mb"):
            costs.add_argument(f"--{name}", type=float)
        parser.add_argument(
            "--policies", default=",".join(POLICIES), help=f"comma-separated, of {POLICIES}"
        )
        fair = parser.add_argument_group(
            "fair admission (--seats): each tenant's wait for a seat in the engine under the "
            "weights in force and under the weights tried"
        )
        fair.add_argument("--seats", action="store_true", help="replay the seats, not the tiers")
        fair.add_argument("--max-concurrent", type=int, help="default: LORAHUB_NODE_MAX_CONCURRENT")
        fair.add_argument("--headroom", type=int, help="default: LORAHUB_NODE_FAIR_HEADROOM")
        fair.add_argument(
            "--engine-weight",
            action="append",
            default=[],
            metavar="TENANT=PERCENT",
            help="try this engine weight for a tenant (as on its quota page; 100: its tier's "
            "share); repeat for more tenants",
        )
        parser.add_argument("--sweep-l2", type=int_list, default=(), help="e.g. 4,8,16,32,64")
        parser.add_argument("--sweep-l1", type=int_list, default=(), help="e.g. 1,2,4,8")
        parser.add_argument("--per-tenant", action="store_true", help="print the tenant table")
        parser.add_argument("--json", type=Path, help="also write the report here ('-': stdout)")
        parser.add_argument(
            "--tune",
            action="store_true",
            help="search the default policy's parameters on this trace and validate them on "
            "another (the next seed; for a log or file, train on its first half, validate on "
            "the second)",
        )

    def handle(self, *args, **options) -> None:
        spec = self.spec(options)
        try:
            if options["seats"]:
                self.seats(spec, options)
                return
            if options["tune"]:
                self.tune(spec)
                return
            report = run.execute(spec, progress=self.progress)
        except (DomainError, ValueError, OSError) as exc:
            raise CommandError(getattr(exc, "message", None) or str(exc)) from None
        sys.stderr.write("\n")
        if options["json"] and str(options["json"]) == "-":
            self.stdout.write(json.dumps(report, indent=1))
            return
        self.stdout.write(tables.policy_table(report))
        for which in ("l2", "l1"):
            if which in report["sweeps"]:
                self.stdout.write("\n" + tables.sweep_table(report, which))
        if options["per_tenant"]:
            for name in report["policies"]:
                self.stdout.write("\n" + tables.tenant_table(report, name))
        if options["json"]:
            options["json"].write_text(json.dumps(report, indent=1))
            self.stdout.write(f"\nwrote {options['json']}")

    def progress(self, done: int, total: int, what: str) -> None:
        sys.stderr.write(f"\r{done}/{total} {what:<30}")
        sys.stderr.flush()

    def spec(self, options) -> run.Spec:
        chosen = [k for k in ("from_db", "csv", "file", "synthetic") if options[k]]
        if len(chosen) > 1:
            raise CommandError("pick one trace: --from-db, --csv, --file or --synthetic")
        source = {"from_db": "db", "csv": "csv", "file": "file"}.get(
            chosen[0] if chosen else "", options["synthetic"] or "zipf"
        )
        path = options["csv"] or options["file"] or ""
        if path and not Path(path).is_file():
            raise CommandError(f"{path}: no such file")
        trace = run.TraceSpec(
            source=source,
            path=str(path),
            since_hours=hours(options["since"]),
            tenant=options["tenant"],
            alpha=options["alpha"],
            drift=options["drift"],
            drift_every_s=options["drift_every"],
            adapters=options["adapters"],
            tenants=options["tenants"],
            sizes=options["sizes"],
            seed=options["seed"],
            requests=options["requests"],
            rate=options["rate"],
        )
        policies = tuple(p.strip() for p in options["policies"].split(",") if p.strip())
        unknown = [p for p in policies if p not in POLICIES]
        if unknown or not policies:
            raise CommandError(f"--policies: unknown {unknown}; choose from {', '.join(POLICIES)}")
        return run.Spec(
            trace=trace,
            policies=policies,
            capacity=self.capacity(options),
            costs=self.costs(options),
            sweep_l2=options["sweep_l2"],
            sweep_l1=options["sweep_l1"],
        )

    def capacity(self, options) -> Capacity:
        changes: dict = {}
        for option, name in (
            ("l1", "l1_slots"),
            ("l2", "l2_slots"),
            ("max_pending", "max_pending"),
            ("max_loads", "max_loads"),
            ("max_fetches", "max_fetches"),
        ):
            if options[option] is not None:
                changes[name] = options[option]
        for option, name, scale in (
            ("l2_gb", "l2_bytes", run.GIB),
            ("l3_gb", "l3_bytes", run.GIB),
            ("ttl_minutes", "ttl_s", 60),
        ):
            if options[option] is not None:  # 0 turns the limit off
                changes[name] = (
                    (int(options[option] * scale) or None)
                    if name != "ttl_s"
                    else (options[option] * scale or None)
                )
        for option in ("l1", "l2", "max_pending", "max_loads", "max_fetches"):
            if options[option] is not None and options[option] < 1:
                raise CommandError(f"--{option.replace('_', '-')} must be at least 1")
        for option in ("l2_gb", "l3_gb", "ttl_minutes"):
            if options[option] is not None and options[option] < 0:
                raise CommandError(f"--{option.replace('_', '-')} cannot be negative (0: no limit)")
        if options["warm_disk"]:
            changes["warm_disk"] = True
        capacity = dataclasses.replace(run.capacity_from_config(), **changes)
        if capacity.l1_slots > capacity.l2_slots:
            raise CommandError(
                f"--l1 ({capacity.l1_slots}) cannot exceed --l2 ({capacity.l2_slots})"
            )
        return capacity

    def costs(self, options) -> Costs:
        base = Costs()
        if not options["bench_costs"]:  # --costs-from-db: the default since it exists
            from apps.telemetry.requestlog import costs_from_log

            base = costs_from_log(since_hours=max(hours(options["since"]), 24.0))
        given = {
            field.name: options[field.name]
            for field in dataclasses.fields(Costs)
            if options.get(field.name) is not None
        }
        if given:  # the report says where its costs came from: these, then base's
            named = ", ".join(f"--{name.replace('_', '-')}" for name in given)
            left = len(given) < len(dataclasses.fields(Costs)) - 1  # (``source`` is no cost)
            given["source"] = f"given ({named})" + (f"; the rest {base.source}" if left else "")
        return dataclasses.replace(base, **given)

    def seats(self, spec: run.Spec, options) -> None:
        from django.conf import settings

        from apps.serving.replay.seats import replay_seats, seats_table
        from apps.tenants.models import Quota
        from apps.tenants.shares import ENGINE_WEIGHT_RANGE, weight_of

        tried: dict[str, int] = {}
        low, high = ENGINE_WEIGHT_RANGE
        for given in options["engine_weight"]:
            slug, _, value = given.partition("=")
            if not value.strip().isdigit() or not low <= int(value) <= high:
                raise CommandError(
                    f"--engine-weight {given!r}: write TENANT=PERCENT, a whole number from "
                    f"{low} to {high} (100: the tenant's tier share)"
                )
            tried[slug.strip()] = int(value)
        seats = options["max_concurrent"] or settings.LORAHUB_NODE_MAX_CONCURRENT
        headroom = options["headroom"]
        headroom = settings.LORAHUB_NODE_FAIR_HEADROOM if headroom is None else headroom
        if seats < 1 or headroom < 0:
            raise CommandError("--max-concurrent must be at least 1 and --headroom at least 0")
        trace = spec.trace.build()
        names = {t: trace.tenant_names.get(t, str(t)) for t in trace.priorities}
        unknown = sorted(set(tried) - set(names.values()))
        if unknown:
            raise CommandError(
                f"--engine-weight: no tenant {', '.join(unknown)} in this trace (it has "
                f"{', '.join(sorted(names.values())[:10])})"
            )
        in_force = dict(
            Quota.objects.filter(tenant__slug__in=names.values()).values_list(
                "tenant__slug", "engine_weight"
            )
        )

        def weights(percent: dict[str, int]) -> dict[int, float]:
            return {
                t: weight_of(p, percent.get(names[t], 100)) for t, p in trace.priorities.items()
            }

        plans = {"in force": in_force, **({"tried": in_force | tried} if tried else {})}
        runs = {}
        for run_name, percent in plans.items():
            chosen = weights(percent)
            runs[run_name] = (
                chosen,
                replay_seats(trace, seats=seats, headroom=headroom, weights=chosen),
            )
        self.stdout.write(
            f"{trace.name}: {len(trace)} requests, {seats} seats and {headroom} of headroom; a "
            f"request holds its seat for its logged time"
            f"{'' if trace.held_s else ' (unknown here: 1 s each)'}\n"
        )
        self.stdout.write(seats_table(trace, runs))

    def tune(self, spec: run.Spec) -> None:
        if spec.trace.source in ("db", "file"):
            whole = spec.trace.build()
            train, validate = whole.head(0.5), whole.tail(0.5)
        else:
            train = spec.trace.build()
            validate = dataclasses.replace(spec.trace, seed=spec.trace.seed + 1).build()
        rows = run.tune(train, validate, spec.capacity, spec.costs, progress=self.progress)
        sys.stderr.write("\n")
        self.stdout.write(
            f"train: {train.name} ({len(train)} requests); validate: {validate.name} "
            f"({len(validate)} requests, {validate.description}); capacity "
            f"{spec.capacity.describe()}\n"
        )
        self.stdout.write(tables.tune_table(rows))
