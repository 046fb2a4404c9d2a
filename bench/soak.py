"""Soak: a real node under sustained mixed traffic, alias churn and a registry outage.

Streaming clients (asyncio, loopback, concurrency 32) call 18 aliases of 6 tenants (premium,
standard, batch), Zipf-popular, over more adapter versions than the engine holds (L2: 4
slots). Every 10 s one alias moves and one canary changes; in the middle the S3 server hangs
for 30 s (SIGSTOP), then returns. The run is bounded (``--duration``, 600 s) and stops by
itself.

Reports: requests sent / answered / by status, lost (connection failed) and hung (no answer
within ``--hang-s``), which must be 0; TTFT p50/p95/p99 per cache tier, per tenant priority
and per phase (before, during and after the outage) and per minute; node RSS (the node and its
engine core) after the warm-up and at the end; loads and evictions from the node's metrics.

Real parts: PostgreSQL (a database of its own, made afresh), Redis (broadcasts), moto's S3
server, the node process (uvicorn + vLLM on the demo model).

Usage: .venv/bin/python bench/soak.py [--duration 600] [--concurrency 32] [--outage-s 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATABASE = "lorahub_soak"
DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{DATABASE}"
EVENTS_URL = "redis://127.0.0.1:6379/13"
TOKEN = "soak-internal-token"  # noqa: S105 (a throwaway node of this run)
S3 = {
    "LORAHUB_S3_BUCKET": "lorahub-soak",
    "LORAHUB_S3_ACCESS_KEY": "soak",
    "LORAHUB_S3_SECRET_KEY": "soak-secret",
    "LORAHUB_S3_REGION": "us-east-1",
}
NODE_CONFIG = """
base_model: lorahub-demo-tiny
base_model_revision: r1
adapter_cache:
  gpu_hot: {max_adapters: 2, max_lora_rank: 16}
  cpu_warm: {max_adapters: 4}
  load_queue:
    sla:
      premium:  {deadline_ms: 10000, on_overload: wait}
      standard: {deadline_ms: 3000, on_overload: degrade}
      batch:    {deadline_ms: 3000, on_overload: reject}
"""
TENANTS = [("p1", 2), ("p2", 2), ("s1", 1), ("s2", 1), ("b1", 0), ("b2", 0)]
ALIASES_PER_TENANT = 3
PRIORITY = {2: "premium", 1: "standard", 0: "batch"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def fresh_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as db:
        db.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        db.execute(f"CREATE DATABASE {DATABASE}")


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"process exited ({proc.returncode}) before listening on {port}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listened on {port} within {timeout} s")


@dataclass(frozen=True)
class Target:
    tenant: str
    priority: int
    alias: str
    key: str


@dataclass
class Outcome:
    at: float  # when it was sent, in seconds since the start of the load
    target: Target
    status: int  # 0: the connection failed (lost); -1: no answer in time (hung)
    code: str = ""  # the error's code, for an answer that is not a 200
    tier: str = ""
    adapter: str = ""  # X-Lorahub-Adapter: adapter@version
    degraded: bool = False
    ttft_ms: float | None = None
    done_at: float = 0.0  # when its answer ended


def setup_world(work: Path) -> tuple[list[Target], dict[str, dict[str, int]]]:
    """Tenants, keys and aliases; two approved versions per alias (v1, v2), and a third for
    each tenant's alias a0 that nobody calls before the outage (cold: only in the registry)."""
    from unittest import mock

    from django.conf import settings

    from apps.demo import corpus
    from apps.demo.assets import build_demo_assets
    from apps.registry import aliases, keys
    from apps.registry import services as registry
    from apps.tenants import services as tenant_services
    from apps.tenants.auth import principal_for_key
    from apps.tenants.choices import PlatformRole
    from tests.helpers import publish

    demo = build_demo_assets(demo_dir=settings.LORAHUB_DEMO_DIR).demo_dir
    keys.write_new_private_key(work / "signing-key.pem")
    config = json.loads((demo / "base-model" / "config.json").read_text())
    registry.register_base_model(
        name=corpus.BASE_MODEL_NAME,
        revision=corpus.BASE_MODEL_REVISION,
        model_config=config,
        max_lora_rank=16,
    )
    reviewer = tenant_services.ensure_user(username="soak-reviewer", password="x" * 16)
    tenant_services.grant_platform_role(user=reviewer, role=PlatformRole.REVIEWER)
    sources = [demo / "adapters" / name for name in ("support-v1", "support-v2", "legal-v1")]
    targets, versions = [], {}
    with mock.patch.object(registry, "send_validation"):  # validated here, by publish
        for n, (slug, priority) in enumerate(TENANTS):
            tenant = tenant_services.create_tenant(slug=slug, name=slug, priority=priority)
            row, key = tenant_services.issue_api_key(tenant=tenant, name="soak", actor=None)
            for a in range(ALIASES_PER_TENANT):
                name = f"a{a}"
                pair = {
                    v: publish(tenant, name, v, sources[(n + a + i) % 3], reviewer)
                    for i, v in enumerate(("v1", "v2", "v3") if a == 0 else ("v1", "v2"))
                }
                aliases.set_alias(
                    principal=principal_for_key(row),
                    tenant=tenant,
                    name=name,
                    version_id=pair["v1"],
                )
                versions[f"{slug}/{name}"] = pair
                targets.append(Target(slug, priority, name, key))
    return targets, versions


def go_cold(versions: dict[str, dict[str, int]]) -> str:
    """Every tenant's alias a0 moves to its v3, which no node has fetched yet."""
    from apps.registry import aliases
    from apps.tenants.auth import principal_for_key
    from apps.tenants.models import ApiKey, Tenant

    moved = []
    for label, pair in sorted(versions.items()):
        if "v3" in pair:
            slug, name = label.split("/")
            tenant = Tenant.objects.get(slug=slug)
            key = ApiKey.objects.filter(tenant=tenant, name="soak").get()
            aliases.set_canary(
                principal=principal_for_key(key), tenant=tenant, name=name, version_id=None
            )
            aliases.set_alias(
                principal=principal_for_key(key), tenant=tenant, name=name, version_id=pair["v3"]
            )
            moved.append(label)
    return f"{len(moved)} aliases to a cold v3 ({', '.join(moved)})"


def churn(versions: dict[str, dict[str, int]], step: int) -> str:
    """One alias moves to its other version; one canary is set (10 %) or cleared."""
    from apps.registry import aliases
    from apps.registry.models import Alias
    from apps.tenants.auth import principal_for_key
    from apps.tenants.models import ApiKey, Tenant

    names = sorted(versions)
    moved, canaried = names[step % len(names)], names[(step * 7 + 3) % len(names)]
    done = []
    for label, what in ((moved, "move"), (canaried, "canary")):
        slug, name = label.split("/")
        tenant = Tenant.objects.get(slug=slug)
        principal = principal_for_key(ApiKey.objects.filter(tenant=tenant, name="soak").get())
        alias = Alias.objects.get(tenant=tenant, name=name)
        pair = versions[label]
        other = pair["v2"] if alias.version_id == pair["v1"] else pair["v1"]
        if what == "move":
            if alias.canary_version_id:
                aliases.set_canary(principal=principal, tenant=tenant, name=name, version_id=None)
            aliases.set_alias(principal=principal, tenant=tenant, name=name, version_id=other)
            done.append(f"move {label}")
        elif alias.canary_version_id:
            aliases.set_canary(principal=principal, tenant=tenant, name=name, version_id=None)
            done.append(f"clear canary {label}")
        else:
            aliases.set_canary(
                principal=principal, tenant=tenant, name=name, version_id=other, percent=10
            )
            done.append(f"canary {label}")
    return ", ".join(done)


async def one_request(client, url: str, target: Target, started: float, hang_s: float) -> Outcome:
    import httpx

    began = time.perf_counter()
    outcome = Outcome(at=time.monotonic() - started, target=target, status=0)
    body = {
        "model": target.alias,
        "prompt": "Question: how do I reset my password?\nAnswer:",
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {target.key}"}
    try:
        async with asyncio.timeout(hang_s):
            async with client.stream("POST", url, json=body, headers=headers) as response:
                outcome.status = response.status_code
                outcome.tier = response.headers.get("x-lorahub-cache-tier", "")
                outcome.adapter = response.headers.get("x-lorahub-adapter", "")
                outcome.degraded = response.headers.get("x-lorahub-degraded") == "1"
                if response.status_code != 200:
                    await response.aread()
                    outcome.code = response.json().get("error", {}).get("code", "")
                    outcome.done_at = time.monotonic() - started
                    return outcome
                async for line in response.aiter_lines():
                    if outcome.ttft_ms is None and line.startswith("data: {"):
                        outcome.ttft_ms = (time.perf_counter() - began) * 1000
    except TimeoutError:
        outcome.status = -1
    except httpx.HTTPError:
        outcome.status = 0
    outcome.done_at = time.monotonic() - started
    return outcome


def node_rss(pid: int) -> tuple[float, float]:
    """MB: the node process, and its children (the engine core, download workers)."""
    import psutil

    node = psutil.Process(pid)
    children = sum(c.memory_info().rss for c in node.children(recursive=True))
    return node.memory_info().rss / 1048576, children / 1048576


def node_metrics(url: str) -> dict[str, float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    found: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            tier = sample.labels.get("tier") or sample.labels.get("source_tier") or ""
            if sample.name in ("adapter_eviction_count_total", "adapter_load_latency_ms_count"):
                found[f"{sample.name}[{tier}]"] += sample.value
            elif sample.name in ("request_stats_dropped_total", "node_overload_rejections_total"):
                found[sample.name] += sample.value
    return found


async def load(args, url: str, targets: list[Target], versions, moto, node_pid: int) -> dict:
    import httpx

    weights = [1 / (rank + 1) for rank in range(len(targets))]  # Zipf, alpha 1
    order = random.Random(7).sample(targets, len(targets))
    outcomes: list[Outcome] = []
    changes: list[str] = []
    started = time.monotonic()
    outage_at = args.duration / 2 - args.outage_s / 2
    phase = {"outage_start": outage_at, "outage_end": outage_at + args.outage_s}
    rss: dict[str, tuple[float, float]] = {}
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=args.concurrency * 2)
    # each request has its own deadline (--hang-s): what passes it counts as hung
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:  # noqa: S113

        async def worker(n: int) -> None:
            rng = random.Random(1000 + n)
            while not stop.is_set():
                target = rng.choices(order, weights)[0]
                outcomes.append(
                    await one_request(client, f"{url}/v1/completions", target, started, args.hang_s)
                )

        async def control() -> None:
            step = 0
            stopped = False
            while not stop.is_set():
                await asyncio.sleep(1)
                now = time.monotonic() - started
                if not stopped and phase["outage_start"] <= now < phase["outage_end"]:
                    os.kill(moto.pid, signal.SIGSTOP)
                    stopped = True
                    changes.append(f"{now:6.1f} s  S3 hangs (SIGSTOP)")
                    done = await asyncio.to_thread(go_cold, versions)
                    changes.append(f"{now:6.1f} s  {done}")
                if stopped and now >= phase["outage_end"]:
                    os.kill(moto.pid, signal.SIGCONT)
                    stopped = False
                    phase["outage_end"] = now
                    changes.append(f"{now:6.1f} s  S3 answers again (SIGCONT)")
                if now >= args.warmup_s and "warm" not in rss:
                    rss["warm"] = node_rss(node_pid)
                if now // 10 > step:
                    step = int(now // 10)
                    done = await asyncio.to_thread(churn, versions, step)
                    changes.append(f"{now:6.1f} s  {done}")
                if now >= args.duration:
                    stop.set()
            if stopped:
                os.kill(moto.pid, signal.SIGCONT)

        await asyncio.gather(control(), *(worker(n) for n in range(args.concurrency)))
    rss["end"] = node_rss(node_pid)
    return {"outcomes": outcomes, "changes": changes, "phase": phase, "rss": rss}


def report(result: dict, metrics_before: dict, metrics_after: dict, args) -> None:
    outcomes: list[Outcome] = result["outcomes"]
    phase = result["phase"]
    statuses = Counter(o.status for o in outcomes)
    lost, hung = statuses.pop(0, 0), statuses.pop(-1, 0)
    answered = sum(statuses.values())
    print(f"\n## soak: {args.duration} s, concurrency {args.concurrency}, {len(outcomes)} sent")
    print(f"answered {answered}, lost {lost}, hung {hung} (both must be 0)")
    codes = Counter((o.status, o.code) for o in outcomes if o.status > 0)
    by_status = ", ".join(
        f"{status}{' ' + code if code else ''}: {n}" for (status, code), n in sorted(codes.items())
    )
    degraded = sum(o.degraded for o in outcomes)
    print(f"by status: {by_status}; of the 200s, {degraded} answered by the base model (degraded)")

    def row(label: str, rows: list[Outcome]) -> str:
        ttft = [o.ttft_ms for o in rows if o.ttft_ms is not None and o.status == 200]
        errors = sum(1 for o in rows if o.status != 200)
        return (
            f"| {label} | {len(rows)} | {errors} | {pct(ttft, 0.5):.0f} | {pct(ttft, 0.95):.0f}"
            f" | {pct(ttft, 0.99):.0f} |"
        )

    head = "| {} | requests | not 200 | TTFT p50 ms | p95 | p99 |\n|---|---|---|---|---|---|"
    print("\nper cache tier (X-Lorahub-Cache-Tier)\n" + head.format("tier"))
    tiers = defaultdict(list)
    for o in outcomes:
        tiers[o.tier or "(none)"].append(o)
    for tier in sorted(tiers):
        print(row(tier, tiers[tier]))

    def phase_of(o: Outcome) -> str:
        if o.at < phase["outage_start"]:
            return "1 before"
        return "2 outage" if o.at < phase["outage_end"] else "3 after"

    print("\nduring the outage, by status and code")
    during = Counter((o.status, o.code) for o in outcomes if phase_of(o) == "2 outage")
    print(", ".join(f"{s}{' ' + c if c else ''}: {n}" for (s, c), n in sorted(during.items())))
    first_v3 = {}
    for o in sorted(outcomes, key=lambda o: o.done_at):
        if o.status == 200 and o.adapter.endswith("@v3") and not o.degraded:
            first_v3.setdefault(o.target.tenant, o.done_at - phase["outage_end"])
    if first_v3:
        print(
            "the cold v3s, first answer done (s after S3 answered again): "
            + ", ".join(f"{t} {at:+.1f}" for t, at in sorted(first_v3.items()))
        )
    print("\nper tenant priority and phase\n" + head.format("priority, phase"))
    groups = defaultdict(list)
    for o in outcomes:
        groups[(o.target.priority, phase_of(o))].append(o)
    for (priority, name), rows in sorted(groups.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        print(row(f"{PRIORITY[priority]}, {name[2:]}", rows))

    print("\nper minute\n" + head.format("minute"))
    minutes = defaultdict(list)
    for o in outcomes:
        minutes[int(o.at // 60)].append(o)
    for minute, rows in sorted(minutes.items()):
        print(row(f"{minute}-{minute + 1}", rows))

    warm, end = result["rss"].get("warm"), result["rss"]["end"]
    if warm:
        growth = (sum(end) - sum(warm)) / sum(warm) * 100
        print(
            f"\nnode RSS after {args.warmup_s} s warm-up: {warm[0]:.0f} MB node + {warm[1]:.0f} MB "
            f"engine core/workers; at the end: {end[0]:.0f} + {end[1]:.0f} MB "
            f"({growth:+.1f} %, target ≤ +10 %)"
        )
    delta = {k: metrics_after.get(k, 0) - metrics_before.get(k, 0) for k in metrics_after}
    loads = ", ".join(
        f"{k.split('[')[1][:-1]} {v:.0f}" for k, v in sorted(delta.items()) if "load_latency" in k
    )
    evictions = ", ".join(
        f"{k.split('[')[1][:-1]} {v:.0f}" for k, v in sorted(delta.items()) if "eviction" in k
    )
    print(f"loads by source tier: {loads or 'none'}; evictions by tier: {evictions or 'none'}")
    print(
        f"overload 503s {delta.get('node_overload_rejections_total', 0):.0f}, "
        f"statistics dropped {delta.get('request_stats_dropped_total', 0):.0f}"
    )
    ttft_all = [o.ttft_ms for o in outcomes if o.ttft_ms is not None and o.status == 200]
    print(
        f"throughput {answered / args.duration:.1f} req/s; TTFT of all 200s "
        f"p50 {statistics.median(ttft_all) if ttft_all else 0:.0f} ms"
    )
    print("\nevents:\n" + "\n".join(result["changes"][:6]))
    print(f"... ({len(result['changes'])} in all)")
    outage = [c for c in result["changes"] if "S3" in c]
    print("\n".join(outage))


def main() -> None:
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=600)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--outage-s", type=float, default=30)
    parser.add_argument("--warmup-s", type=float, default=60)
    parser.add_argument("--hang-s", type=float, default=120, help="no answer by then: hung")
    args = parser.parse_args()
    if args.duration < 2 * args.outage_s or args.warmup_s >= args.duration:
        parser.error("--duration must be at least twice --outage-s and longer than --warmup-s")

    work = Path(tempfile.mkdtemp(prefix="lorahub-soak-"))
    port, node_port = free_port(), free_port()
    env = {
        "DATABASE_URL": DATABASE_URL,
        "LORAHUB_S3_ENDPOINT": f"http://127.0.0.1:{port}",
        **S3,
        "LORAHUB_EVENTS_URL": EVENTS_URL,
        "LORAHUB_SIGNING_KEY_FILE": str(work / "signing-key.pem"),
        "CELERY_BROKER_URL": "",
    }
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lorahub.settings")
    fresh_database()
    moto = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    node = None
    try:
        wait_port(port, moto)
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        print(
            "publishing 42 versions (6 tenants x 3 aliases x v1/v2, and a v3 each)...", flush=True
        )
        targets, versions = setup_world(work)
        (work / "cache.yaml").write_text(NODE_CONFIG)
        node_env = {
            **os.environ,
            "LORAHUB_CACHE_CONFIG": str(work / "cache.yaml"),
            "LORAHUB_NODE_CACHE_DIR": str(work / "cache"),
            "LORAHUB_NODE_NAME": "soak-node",
            "LORAHUB_INTERNAL_TOKEN": TOKEN,
        }
        with (work / "node.log").open("wb") as log:
            node = subprocess.Popen(
                [sys.executable, "manage.py", "runnode", "--port", str(node_port)],
                cwd=ROOT,
                env=node_env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{node_port}"
        wait_port(node_port, node)
        import httpx

        deadline = time.monotonic() + 300
        while httpx.get(f"{url}/healthz", timeout=5).status_code != 200:
            if node.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the node did not become ready; see {work / 'node.log'}")
            time.sleep(0.5)
        print(
            f"node ready; load for {args.duration:.0f} s (node log: {work / 'node.log'})",
            flush=True,
        )
        before = node_metrics(url)
        result = asyncio.run(load(args, url, targets, versions, moto, node.pid))
        report(result, before, node_metrics(url), args)
    finally:
        if node is not None:
            node.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.kill(moto.pid, signal.SIGCONT)
        moto.terminate()
        moto.wait()


if __name__ == "__main__":
    main()
