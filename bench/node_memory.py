"""A node's memory under traffic that invents keys: flat, or it grows with every request.

One node (``manage.py runnode``, the demo model, a throwaway embedded control plane) answers a
few hundred thousand requests from concurrent clients, in two phases:

  A. callers only: real keys of the demo tenants, their real aliases (one token each) — the
     baseline: what the node's memory does under traffic that invents nothing;
  B. the same callers (1 in ``--real-every`` requests) among requests that invent what a
     caller can invent: random API keys (each a lookup miss), random model names on real keys
     of ``--tenants`` tenants (each an alias miss, a 404 never recorded as usage), a flood of
     bad keys from one address (the throttle's window).

The node's own process (the one holding the per-key tables; vLLM's engine core is a child of
its own) is sampled for its resident memory (RSS) at the start of each phase and at every
tenth of it. The table prints each sample and the change over each phase: flat within noise
means bounded by design (docs/security.md, row 19). Phase A's change is the reference for
"noise" in the same run; phase B runs 5x as many requests.

Usage: .venv/bin/python bench/node_memory.py [--requests 300000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.node_overhead import prepare, start_node  # noqa: E402


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def tenants_with_keys(count: int) -> list[str]:
    """``count`` more tenants, each with a key and a quota no bench reaches: their keys."""
    from apps.tenants import services as tenant_services

    keys = []
    for i in range(count):
        tenant = tenant_services.create_tenant(slug=f"bench-{i}", name=f"Bench {i}")
        tenant_services.set_quota(tenant=tenant, actor=None, requests_per_minute=10**6)
        keys.append(tenant_services.issue_api_key(tenant=tenant, name="bench", actor=None)[1])
    return keys


async def drive(
    url: str,
    plan: list[tuple[str, dict]],
    concurrency: int,
    pid: int,
    samples: list[tuple[str, int, float]],
    phase: str,
) -> dict[int, int]:
    """Send every (key, body) of ``plan``; RSS sampled at every tenth. Status counts."""
    import httpx

    statuses: dict[int, int] = {}
    cursor = 0
    tenth = max(1, len(plan) // 10)
    lock = asyncio.Lock()

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal cursor
        while True:
            async with lock:
                if cursor >= len(plan):
                    return
                index = cursor
                cursor += 1
                if index % tenth == 0:
                    samples.append((phase, index, rss_mb(pid)))
            key, body = plan[index]
            try:
                answer = await client.post(
                    "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
                )
                statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
            except httpx.HTTPError:
                statuses[0] = statuses.get(0, 0) + 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    samples.append((phase, len(plan), rss_mb(pid)))
    return statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300_000, help="in all, both phases")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--real-every", type=int, default=40, help="1 real request in N (B)")
    args = parser.parse_args()
    phase_a = args.requests // 6
    phase_b = args.requests - phase_a
    with tempfile.TemporaryDirectory(prefix="lorahub-bench-") as tmp:
        env, key, alias = prepare(Path(tmp))
        import logging

        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line a request otherwise
        from apps.tenants import services as tenant_services
        from apps.tenants.models import Tenant

        for slug in ("acme", "globex"):
            tenant_services.set_quota(
                tenant=Tenant.objects.get(slug=slug), actor=None, requests_per_minute=10**6
            )
        globex_key = tenant_services.issue_api_key(
            tenant=Tenant.objects.get(slug="globex"), name="bench", actor=None
        )[1]
        real = [(key, alias), (globex_key, "legal")]
        others = tenants_with_keys(args.tenants)
        prompt = "Question: where is my invoice?\nAnswer:"

        def real_request(i: int) -> tuple[str, dict]:
            k, model = real[i % len(real)]
            return k, {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}

        plan_a = [real_request(i) for i in range(phase_a)]
        plan_b = []
        for i in range(phase_b):
            kind = i % args.real_every
            if kind == 0:
                plan_b.append(real_request(i))
            elif kind % 3 == 0:  # an invented key
                plan_b.append(
                    (f"lh_{secrets.token_hex(6)}_{secrets.token_hex(16)}", {"model": "x"})
                )
            else:  # a real key, an invented model
                model = f"m-{secrets.token_hex(8)}"
                plan_b.append((others[i % len(others)], {"model": model, "prompt": "x"}))
        proc, url = start_node(env, Path(tmp) / "node.log")
        try:
            samples: list[tuple[str, int, float]] = []
            started = time.monotonic()
            a = asyncio.run(drive(url, plan_a, args.concurrency, proc.pid, samples, "A"))
            a_s = time.monotonic() - started
            b = asyncio.run(drive(url, plan_b, args.concurrency, proc.pid, samples, "B"))
            b_s = time.monotonic() - started - a_s
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    print(f"\nnode RSS (the API process), {args.requests:,} requests, {args.concurrency} clients\n")
    print(f"{'phase':<6}{'sent':>10}{'RSS MB':>10}")
    for phase, sent, mb in samples:
        print(f"{phase:<6}{sent:>10,}{mb:>10.1f}")
    for name, statuses, seconds in (("A", a, a_s), ("B", b, b_s)):
        rows = [s for s in samples if s[0] == name]
        # the first tenth is warm-up (imports, the adapter's first load, connection pools)
        change = rows[-1][2] - rows[1][2]
        total = sum(statuses.values())
        print(
            f"phase {name}: {total:,} requests in {seconds:.0f} s ({total / seconds:.0f}/s), "
            f"statuses {dict(sorted(statuses.items()))}, RSS {rows[1][2]:.1f} -> "
            f"{rows[-1][2]:.1f} MB ({change:+.1f} MB after its first tenth)"
        )


if __name__ == "__main__":
    main()
