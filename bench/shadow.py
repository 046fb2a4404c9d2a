"""What shadow traffic costs callers: caller TTFT and req/s with a shadow at 0 %, 25 % and
100 % of an alias's requests, against an A/A repeat of 0 %.

One serving node on a throwaway control plane (the demo's `support` alias: stable
support@1 = support-v1's weights, shadow support@2 = support-v2's). Per repetition, five
conditions run one after the other on the same node — 0 %, 0 % again (A/A), 25 %, 100 % —
with the order rotated between repetitions (on this machine whatever runs first is
measurably slower), at each concurrency. Each condition sends ``--requests`` streamed
completions (max_tokens 16, ignore_eos) with fresh request keys, after the node has followed
the shadow change; then waits for the copies still running to end. Printed per point:
req/s, caller TTFT p50/p95 (client side), ratios against 0 % per repetition and their
medians, the A/A ratio (0 % against 0 %) as the noise floor, and the share of copies dropped
(the node's ``shadow_requests_total`` by outcome).

Usage: .venv/bin/python bench/shadow.py [--reps 3] [--requests 96] [--concurrency 8 32]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.load_mix import Point, drive  # noqa: E402
from bench.node_overhead import prepare, start_node  # noqa: E402

CONDITIONS = ("0%", "0% A/A", "25%", "100%")
OUTCOMES = ("compared", "error", "dropped_busy", "dropped_budget")


def shadow_counts(url: str) -> dict[str, float]:
    import httpx
    from django.conf import settings

    headers = {"Authorization": f"Bearer {settings.LORAHUB_INTERNAL_TOKEN}"}
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    counts = dict.fromkeys(OUTCOMES, 0.0)
    for line in text.splitlines():
        if line.startswith("shadow_requests_total{"):
            outcome = line.split('outcome="')[1].split('"')[0]
            counts[outcome] = float(line.rsplit(" ", 1)[1])
    return counts


def set_shadow(url: str, percent: int) -> None:
    """Point the alias's shadow at support@2 (or clear it) and wait until the node follows."""
    import httpx
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from apps.registry import aliases
    from apps.registry.models import AdapterVersion
    from apps.tenants.auth import principal_for_user
    from apps.tenants.models import Tenant

    tenant = Tenant.objects.get(slug="acme")
    principal = principal_for_user(get_user_model().objects.get(username="otto"))  # operator
    shadow = (
        AdapterVersion.objects.filter(adapter__tenant=tenant, adapter__adapter_id="support")
        .order_by("created_at")
        .last()
    )
    aliases.set_shadow(
        principal=principal,
        tenant=tenant,
        name="support",
        version_id=shadow.pk if percent else None,
        percent=percent,
    )
    headers = {"Authorization": f"Bearer {settings.LORAHUB_INTERNAL_TOKEN}"}
    deadline = time.monotonic() + 10
    while True:
        state = httpx.get(
            f"{url}/internal/alias?tenant=acme&alias=support", headers=headers, timeout=10
        ).json()
        if state["shadow_percent"] == percent:
            return
        if time.monotonic() > deadline:
            raise SystemExit("the node did not follow the shadow change")
        time.sleep(0.1)


def wait_for_copies(url: str, before: dict[str, float], seconds: float = 60) -> dict[str, float]:
    """The copies' outcomes since ``before``, once the count stops moving."""
    deadline = time.monotonic() + seconds
    last: dict[str, float] = {}
    while time.monotonic() < deadline:
        now = shadow_counts(url)
        if now == last:
            break
        last = now
        time.sleep(1.0)
    return {k: last.get(k, 0.0) - before.get(k, 0.0) for k in OUTCOMES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lorahub-bench-shadow-"))
    env, key, alias = prepare(work)
    env["LORAHUB_INTERNAL_TOKEN"] = secrets.token_hex(16)  # this run's node only
    from django.conf import settings

    settings.LORAHUB_INTERNAL_TOKEN = env["LORAHUB_INTERNAL_TOKEN"]
    from apps.demo import corpus
    from apps.tenants.models import Quota

    # the benchmark's load, not the tenant's request rate, is what is measured
    Quota.objects.filter(tenant__slug="acme").update(requests_per_minute=1_000_000)

    prompts = [corpus.completion_prompt(q) for q in corpus.UNSEEN_PROMPTS]
    proc, url = start_node(env)
    results: dict[tuple[int, str], list[Point]] = {}
    copies: dict[tuple[int, str], list[dict[str, float]]] = {}
    try:
        warm = [(alias, prompts[i % len(prompts)]) for i in range(16)]
        set_shadow(url, 100)
        asyncio.run(drive(url, key, warm, 4))  # loads both versions
        for rep in range(args.reps):
            order = CONDITIONS[rep % len(CONDITIONS) :] + CONDITIONS[: rep % len(CONDITIONS)]
            for concurrency in args.concurrency:
                for condition in order:
                    set_shadow(url, int(condition.split("%")[0]))
                    jobs = [(alias, prompts[i % len(prompts)]) for i in range(args.requests)]
                    before = shadow_counts(url)
                    point = asyncio.run(drive(url, key, jobs, concurrency))
                    results.setdefault((concurrency, condition), []).append(point)
                    copies.setdefault((concurrency, condition), []).append(
                        wait_for_copies(url, before)
                    )
                    print(
                        f"rep {rep + 1} C={concurrency} shadow {condition:7s} "
                        f"{point.rps:6.2f} req/s  p95 {point.p(0.95):8.1f} ms",
                        flush=True,
                    )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    report(results, copies, args)


def report(results, copies, args) -> None:
    print()
    print(
        f"caller TTFT and req/s with a shadow ({args.reps} repetitions, {args.requests} "
        "requests each; ratios against 0 % per repetition | median)"
    )
    header = (
        f"{'C':>3} {'shadow':8} {'req/s':>7} {'p50 ms':>8} {'p95 ms':>8}  "
        f"{'req/s ratio':28} {'p95 ratio':28} {'copies dropped':>15}"
    )
    print(header)
    print("-" * len(header))
    for concurrency in args.concurrency:
        base = results[(concurrency, "0%")]
        for condition in CONDITIONS:
            points = results[(concurrency, condition)]
            rps = statistics.median(p.rps for p in points)
            p50 = statistics.median(p.p(0.5) for p in points)
            p95 = statistics.median(p.p(0.95) for p in points)
            rps_ratio = [a.rps / b.rps for a, b in zip(points, base, strict=True)]
            p95_ratio = [a.p(0.95) / b.p(0.95) for a, b in zip(points, base, strict=True)]
            offered = sum(sum(c.values()) for c in copies[(concurrency, condition)])
            dropped = sum(
                c["dropped_busy"] + c["dropped_budget"] for c in copies[(concurrency, condition)]
            )
            share = f"{dropped / offered:.0%} of {offered:.0f}" if offered else "-"
            errors = sum(p.errors for p in points)
            print(
                f"{concurrency:>3} {condition:8} {rps:7.2f} {p50:8.1f} {p95:8.1f}  "
                f"{cell(rps_ratio):28} {cell(p95_ratio):28} {share:>15}"
                + (f"  ({errors} caller errors)" if errors else "")
            )
    print()
    print(
        "The 0% A/A row is the noise floor: 0 % against itself, measured the same way. A "
        "shadow's cost is within the noise when its ratios fall inside the A/A row's range."
    )


def cell(xs: list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in xs) + f" | {statistics.median(xs):.2f}"


if __name__ == "__main__":
    main()
