"""Throughput and TTFT under mixed-adapter load: the serving node vs. stock vLLM's OpenAI server.

Both serve the same demo model with the same LoRA limits (the node's default cache config:
4 device slots, 16 host slots, rank 16), the same engine settings and seed, and the same
adapter weights; stock vLLM gets them as static ``--lora-modules``, the node through its
registry (uploaded, validated, signed, aliased; a throwaway SQLite control plane). A second,
identical stock server (``stock-b``) runs beside them: stock-b / stock is the A/A ratio, the
noise floor printed beside every node / stock ratio (on this 2-core machine three repetitions
of the same server against itself move by 10-40 %). All three run for the whole benchmark;
one is measured at a time (the others are idle), and the order rotates per repetition, so
each server goes first once in three (measured with an outside script at C=16 over 8 pairs:
whichever server ran first in a pair had the lower throughput in all 8, so a fixed order
biases every ratio).

Each point: ``--requests`` streamed completions (max_tokens 16 with ignore_eos, so every
request makes the same work) from C concurrent clients, C in 1, 8, 32, over
  (a) 3 models that fit in max_loras: two adapter aliases and the base model, in turn;
  (b) 12 adapter aliases with Zipf(1.0) popularity: more adapters than device slots.
The same request sequence goes to all three. Printed per point: req/s, completion tokens/s,
TTFT p50/p95/p99 (client side: request sent to the first streamed token), node/stock and
stock-b/stock ratios per repetition, their medians, and the A/A range.

Also printed: the CPU time each server's processes spent per request (psutil, user + system),
split into the front process (the node's uvicorn process, or stock vLLM's API server) and
the engine's processes (EngineCore and its worker). On a 2-core machine every point saturates
the CPU, so req/s and TTFT move with how the cores happen to be shared; the front process's
CPU per request is what the node adds over stock. It moves less with that sharing, though
single repetitions still differ by up to a third (it also counts each process's idle work,
which weighs most at C=1).

Usage: .venv/bin/python bench/load_mix.py [--reps 3] [--requests 192] [--only a|b]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.node_overhead import free_port, pct, prepare, stop_all, wait_ready  # noqa: E402

CONCURRENCY = (1, 8, 32)
MAX_TOKENS = 16
ZIPF_ALIASES = 12
SERVERS = ("node", "stock", "stock-b")  # stock-b: the same stock server again, for A/A


@dataclass
class Point:
    rps: float
    tps: float
    ttft: list[float]
    errors: int
    front_cpu_ms: float = float("nan")  # CPU ms per request: the HTTP front process
    engine_cpu_ms: float = float("nan")  # CPU ms per request: EngineCore and its worker

    def p(self, q: float) -> float:
        return pct(self.ttft, q) if self.ttft else float("nan")


def publish_mix(count: int) -> dict[str, Path]:
    """``count`` extra adapters (distinct weights) published for tenant acme, each behind an
    alias of its own name; returns alias -> the folder stock vLLM loads the same weights from."""
    from django.conf import settings
    from django.contrib.auth.models import User

    from apps.demo.assets import build_extra_adapters
    from apps.demo.management.commands.seed_demo import publish_folder
    from apps.registry import aliases
    from apps.registry.models import VersionState
    from apps.tenants.auth import principal_for_user
    from apps.tenants.models import Quota, Tenant

    acme = Tenant.objects.get(slug="acme")
    # the benchmark's load, not a tenant's quota, is what is measured
    Quota.objects.filter(tenant=acme).update(
        requests_per_minute=1_000_000, max_warm_adapters=32, max_adapters=100
    )
    owner = principal_for_user(User.objects.get(username="alice"))
    reviewer = principal_for_user(User.objects.get(username="rita"))
    folders = build_extra_adapters(demo_dir=Path(settings.LORAHUB_DEMO_DIR), count=count)
    mix = {}
    for i, folder in enumerate(folders):
        name = f"mix-{i:02d}"
        row = publish_folder(acme, owner, reviewer, name, "1", folder)
        assert row.state == VersionState.APPROVED, row.rejection_reason
        aliases.set_alias(principal=owner, tenant=acme, name=name, version_id=row.pk, reason="")
        mix[name] = folder
    return mix


async def one(client, url: str, key: str, model: str, prompt: str) -> tuple[float | None, int]:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first, tokens = None, 0
    async with client.stream(
        "POST", f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        if response.status_code != 200:
            await response.aread()
            return None, 0
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if first is None and any(c.get("text") for c in event["choices"]):
                first = (time.perf_counter() - started) * 1000
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return first, tokens


async def drive(url: str, key: str, jobs: list[tuple[str, str]], concurrency: int) -> Point:
    import httpx

    queue = list(reversed(jobs))
    ttfts: list[float] = []
    tokens = errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def worker() -> None:
            nonlocal tokens, errors
            while queue:
                model, prompt = queue.pop()
                first, made = await one(client, url, key, model, prompt)
                if first is None:
                    errors += 1
                else:
                    ttfts.append(first)
                    tokens += made

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return Point(rps=len(ttfts) / wall, tps=tokens / wall, ttft=ttfts, errors=errors)


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(front, engine): CPU seconds used so far by process ``pid`` and by its descendants."""
    import psutil

    front = psutil.Process(pid)
    times = front.cpu_times()
    engine = 0.0
    for child in front.children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        engine += t.user + t.system
    return times.user + times.system, engine


def measured(url: str, key: str, jobs: list[tuple[str, str]], concurrency: int, pid: int) -> Point:
    """``drive`` with the server's CPU time per request."""
    front, engine = cpu_seconds(pid)
    point = asyncio.run(drive(url, key, jobs, concurrency))
    front_after, engine_after = cpu_seconds(pid)
    done = max(len(point.ttft), 1)
    point.front_cpu_ms = (front_after - front) * 1000 / done
    point.engine_cpu_ms = (engine_after - engine) * 1000 / done
    return point


def workloads(base: str, mix: list[str], n: int) -> dict[str, list[tuple[str, str]]]:
    from apps.demo import corpus

    prompts = [corpus.completion_prompt(q) for q in corpus.UNSEEN_PROMPTS]
    rng = random.Random(11)
    weights = [1 / (rank + 1) for rank in range(len(mix))]
    three = ["support", mix[0], base]
    return {
        "a: 3 models": [(three[i % 3], prompts[i % len(prompts)]) for i in range(n)],
        f"b: {len(mix)} Zipf aliases": [
            (rng.choices(mix, weights)[0], prompts[i % len(prompts)]) for i in range(n)
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--requests", type=int, default=192, help="per point (C=1: a third)")
    parser.add_argument("--only", choices=("a", "b"), help="run one of the two loads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lorahub-load-mix-") as tmp:
        env, key, _ = prepare(Path(tmp))
        mix = publish_mix(ZIPF_ALIASES)
        from django.conf import settings

        from apps.serving.node.engine import EngineSettings

        engine = EngineSettings.from_django_settings()
        demo = Path(settings.LORAHUB_DEMO_DIR)
        modules = {"support": demo / "adapters" / "support-v1", **mix}
        ports = {name: free_port() for name in SERVERS}
        urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        logs = Path(tmp)
        stock_env = {k: v for k, v in os.environ.items() if not k.startswith("LORAHUB_")}
        procs = {
            "node": subprocess.Popen(
                [sys.executable, "manage.py", "runnode", "--port", str(ports["node"])],
                cwd=ROOT,
                env=env,
                stdout=(logs / "node.log").open("wb"),
                stderr=subprocess.STDOUT,
            ),
            **{
                name: subprocess.Popen(
                    engine.stock_server_argv(ports[name], modules),
                    cwd=ROOT,
                    env=stock_env,
                    stdout=(logs / f"{name}.log").open("wb"),
                    stderr=subprocess.STDOUT,
                )
                for name in ("stock", "stock-b")
            },
        }
        try:
            for name, proc in procs.items():
                health = "/healthz" if name == "node" else "/health"
                wait_ready(urls[name], health, proc, name)
            servers = {
                name: (urls[name], key if name == "node" else "none", procs[name].pid)
                for name in SERVERS
            }
            results = run(args, engine, servers, sorted(mix))
        finally:
            stop_all(procs.values())
    report(results, args, engine)


def rotation(rep: int, servers: tuple[str, ...] = SERVERS) -> list[str]:
    """The servers in the order repetition ``rep`` measures them: each goes first once in
    every ``len(servers)`` repetitions."""
    k = rep % len(servers)
    return [*servers[k:], *servers[:k]]


def run(args, engine, servers: dict[str, tuple[str, str, int]], mix: list[str]):
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    loads = workloads(engine.served_model_name, mix, args.requests)
    if args.only:
        loads = {name: jobs for name, jobs in loads.items() if name.startswith(args.only)}
    for name, (url, secret, _) in servers.items():  # warm-up: every model once, cold loads
        for model in sorted({m for jobs in loads.values() for m, _ in jobs}):
            asyncio.run(drive(url, secret, [(model, next(iter(loads.values()))[0][1])], 1))
        print(f"warmed up {name}", flush=True)
    results: dict[tuple[str, int, str], list[Point]] = {}
    for rep in range(args.reps):
        order = rotation(rep)
        for load, jobs in loads.items():
            for c in CONCURRENCY:
                subset = jobs[: max(c, len(jobs) // 3)] if c == 1 else jobs
                for name in order:
                    url, secret, pid = servers[name]
                    point = measured(url, secret, subset, c, pid)
                    results.setdefault((load, c, name), []).append(point)
                    print(
                        f"rep {rep + 1} {load:<20} C={c:<3} {name:<7} {point.rps:6.1f} req/s "
                        f"TTFT p50 {point.p(0.5):7.1f} p95 {point.p(0.95):7.1f} ms  CPU/req "
                        f"front {point.front_cpu_ms:5.2f} engine {point.engine_cpu_ms:5.1f} ms"
                        + (f"  {point.errors} errors" if point.errors else ""),
                        flush=True,
                    )
    return results


def report(results, args, engine) -> None:
    print(
        f"\nStreamed completions, max_tokens={MAX_TOKENS} (ignore_eos), {args.requests} "
        f"requests per point (C=1: {args.requests // 3}), {args.reps} repetitions, "
        f"max_loras={engine.max_loras}, max_cpu_loras={engine.max_cpu_loras}\n"
    )
    head = (
        f"{'load':<20}{'C':>4}{'server':>8}{'req/s':>8}{'tok/s':>8}"
        f"{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'err':>5}{'front cpu':>11}{'engine cpu':>11}"
    )
    print(head)
    for (load, c, name), points in results.items():
        rps = statistics.median(p.rps for p in points)
        tps = statistics.median(p.tps for p in points)
        p50, p95, p99 = (statistics.median(p.p(q) for p in points) for q in (0.5, 0.95, 0.99))
        front = statistics.median(p.front_cpu_ms for p in points)
        engine_cpu = statistics.median(p.engine_cpu_ms for p in points)
        print(
            f"{load:<20}{c:>4}{name:>8}{rps:>8.1f}{tps:>8.0f}{p50:>9.1f}{p95:>9.1f}{p99:>9.1f}"
            f"{sum(p.errors for p in points):>5}{front:>9.2f}ms{engine_cpu:>9.1f}ms"
        )
    print(
        "\nper repetition and median, against stock (throughput: higher is better; TTFT: lower "
        "is better). A/A is stock-b / stock: a ratio of node / stock inside the A/A range "
        "[min, max] is no different from stock in this run\n"
    )
    print(
        f"{'load':<20}{'C':>4}  {'metric':<10}{'node / stock':<26}{'A/A stock-b / stock':<26}"
        f"{'A/A range':<14}"
    )
    loads = sorted({(load, c) for load, c, _ in results})
    for load, c in loads:
        stock = results[(load, c, "stock")]
        for metric, value in (
            ("req/s", lambda p: p.rps),
            ("TTFT p95", lambda p: p.p(0.95)),
            ("front CPU", lambda p: p.front_cpu_ms),
        ):
            node = ratios(results[(load, c, "node")], stock, value)
            aa = ratios(results[(load, c, "stock-b")], stock, value)
            spread = f"[{min(aa):.2f}, {max(aa):.2f}]"
            print(f"{load:<20}{c:>4}  {metric:<10}{cell(node):<26}{cell(aa):<26}{spread:<14}")


def ratios(these: list[Point], stock: list[Point], value) -> list[float]:
    return [value(a) / value(b) for a, b in zip(these, stock, strict=True)]


def cell(xs: list[float], digits: int = 2) -> str:
    """Each repetition's value, then their median."""
    return " ".join(f"{x:.{digits}f}" for x in xs) + f" | {statistics.median(xs):.{digits}f}"


if __name__ == "__main__":
    main()
