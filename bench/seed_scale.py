"""Serving at the seeds' scale: ``bench/many_adapters.py --profile seed``.

The seed profile (``manage.py build_demo_assets --profile seed``): a 1024-wide, 8-layer base
and 200 adapters of rank 64-128 on every projection, 36-71 MB each. The registry's object
store is S3 with the seeds' costs (``tests/harness/shaped_s3.py``: moto in a network namespace
of its own, its link shaped with ``tc … tbf``, a first-byte delay per request; the floors it
achieved are printed first). Four servers run for the whole benchmark, measured one at a
time, the order rotated per repetition:

- **node**: lorahub, every adapter published through the registry (uploaded, validated,
  signed, approved, aliased) and **not** landed: its first use of each comes from S3 (L4);
  prefetch from rising demand off (the default);
- **node-prefetch**: a second node on the same registry with ``LORAHUB_NODE_PREFETCH_RISING=1``
  and a disk of its own;
- **node-wide**: a third, its device-slot gate as wide as the host slots with nothing pinned
  (``LORAHUB_NODE_GATE_WIDE=1``, ``gate.GateRule.wide``): the A/B of who decides which
  adapters share a step, the node's gate or vLLM's scheduler (a317d0f's run measured the
  wide gate as **node** and the default as **node-narrow**);
- **stock-disk**: stock vLLM with its ``lora_filesystem_resolver`` over the same adapters on
  local disk (stock's best case: nothing to fetch);
- **stock-s3**: stock vLLM with ``bench/s3_resolver.py``, a resolver plugin that downloads an
  adapter from the same shaped S3 (the registry's own objects) on its first use and keeps the
  copy on local disk for good (what a vLLM user with adapters in S3 writes);
- **stock-disk-b**: stock-disk again, the A/A noise floor.

Same engine for all six: the seed base, max_loras 4, max_cpu_loras 16, rank cap 128,
float32, 256 MiB of KV space, the node's max_num_seqs and step budget, and the same engine
plugin (``lorahub_lora_fix``: the negative-index fix, adds that take no device slot, and the
engine probe) on every server.

**Inside the engine** (the probe, ``apps/serving/node/engine_probe.py``): per point, the step
boundaries each engine load cost its request (1: loaded by the step that runs it), device-slot
activations outside a step per load, the steps that carried a load (p50 and max ms beside the
mean step), and for the nodes the loads that waited for a request to end before making room.

**Load**: the Azure conversation trace mapped to the N aliases by Zipf(1.0) with 20 % of the
ranking reshuffled every 10 trace minutes (``workload.workload``), ``--requests``
arrivals per point from C = 8 and 32 streaming clients (closed loop), prompts of a few
tokens and max_tokens 2 with ``ignore_eos`` (why: ``MAX_TOKENS``). Per point: req/s; TTFT
p50/p95/p99 of every request, of the **hot** ones (their adapter already in the engine) and of the
**cold** ones (an engine load of their adapter began between their send and their first
token, as a probe plugin in vLLM's worker records: the same rule on every server); engine
loads and S3 downloads per 1,000 requests, and the bytes fetched from S3 per 1,000 (node:
``adapter_fetched_bytes_total``; stock-s3: its resolver's own count). The disks are not
emptied between points: the first repetition meets S3 for every adapter it uses, later ones
find most on disk (the node's L3 and stock-s3's folder both keep what they fetched).

**Ceiling**: right after stock-disk at each point, the same server with every request on the
sequence's hottest adapter: no loads at all, so no cache can make a server faster than it;
ceiling / stock-disk bounds what any cache gains on this engine.

**Cold load under hot traffic** (``many_adapters.hot_with_cold``): 16 streams on the 4
hottest adapters, with and without a request for a cold adapter every 2 s.

**Replay agreement**: the node's request log over its points, replayed under the default
policy with the node's capacities and the per-tier costs the node measured
(``costs_from_log``: fitted to the loads' bytes and times), beside the live hit rate and TTFT.

Needs root (``ip netns``), the seed profile (built here if missing, ~30 s, 8.8 GB) and ~30 GB
of disk for S3's objects, the node's L3 and stock-s3's folder, all under a temporary folder
removed at the end.

Usage: .venv/bin/python bench/many_adapters.py --profile seed [--adapters 200] [--reps 3]
       [--requests 300] [--cold-s 20] [--rate-mbit 10000] [--first-byte-ms 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import s3_resolver  # noqa: E402
from bench.load_mix import cell, rotation  # noqa: E402
from bench.node_overhead import free_port, pct  # noqa: E402

SEED_DIR = ROOT / "var" / "seed"
SERVERS = ("node", "node-prefetch", "node-wide", "stock-disk", "stock-s3", "stock-disk-b")
CONCURRENCY = (8, 32)
# Tiny requests: vLLM's CPU LoRA path (punica's torch ops) gathers a copy of the adapter's
# weights for every token it computes (``lora_a_weights[indices]``: 36-71 MB per token here),
# so a request of the other benches' size (~65 prompt tokens + 16) costs seconds of engine
# time whatever the batch, and that arithmetic hides every load. A GPU reads an adapter's
# weights once per step. A request of a few tokens keeps compute and loads nearer the GPU's
# proportions (the ceiling column says how far the engine still bounds every server).
MAX_TOKENS = 2
PROMPTS = ["Q:", "Hi", "Why", "How"]
RANK_CAP = 128
KV_MB = 256
BUCKET = "lorahub"


@dataclass
class Load:
    name: str
    began: float  # wall clock
    ms: float


@dataclass
class Server:
    name: str
    url: str
    key: str
    proc: subprocess.Popen
    load_dir: Path
    downloads: Path | None = None  # stock-s3: its resolver's download log

    def loads(self) -> list[Load]:
        out = []
        for path in self.load_dir.glob("*.loads"):
            for line in path.read_text().splitlines():
                name, began, ms = line.split("\t")
                out.append(Load(name, float(began), float(ms)))
        return out

    def engine(self) -> dict:
        """What lorahub's engine probe counted in this server's worker so far (every server
        loads it with the LoRA fix's plugin: ``apps/serving/node/engine_probe.py``)."""
        total: dict = {"boundaries": {}}
        for path in self.load_dir.glob("*.engine"):
            for _ in range(50):  # a snapshot being rewritten reads empty: read it again
                try:
                    counts = json.loads(path.read_text())
                    break
                except ValueError:
                    time.sleep(0.002)
            else:
                continue
            for key, value in counts.items():
                if key == "boundaries":
                    for n, loads in value.items():
                        total["boundaries"][n] = total["boundaries"].get(n, 0) + loads
                else:
                    total[key] = total.get(key, 0) + value
        return total

    def load_steps(self) -> list[float]:
        """The ms of every engine step that carried an adapter load."""
        return [
            float(line)
            for path in self.load_dir.glob("*.loadsteps")
            for line in path.read_text().split()
        ]

    def waited_on_release(self) -> int | None:
        """The node's loads that found every version in the engine held (stock: None)."""
        if not self.name.startswith("node"):
            return None
        import httpx
        from django.conf import settings

        token = settings.LORAHUB_INTERNAL_TOKEN
        state = httpx.get(
            f"{self.url}/internal/cache", headers={"Authorization": f"Bearer {token}"}
        ).json()
        return int(state["loads_waited_on_release"])

    def metric(self, name: str, **labels: str) -> float:
        """The node's samples called ``name`` with these labels, summed."""
        import httpx
        from django.conf import settings
        from prometheus_client.parser import text_string_to_metric_families

        token = settings.LORAHUB_INTERNAL_TOKEN
        text = httpx.get(f"{self.url}/metrics", headers={"Authorization": f"Bearer {token}"}).text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )

    def s3(self) -> tuple[int, int]:
        """(downloads, bytes) from S3 so far."""
        if self.name.startswith("node"):
            return (
                int(self.metric("adapter_load_latency_ms_count", source_tier="L4")),
                int(self.metric("adapter_fetched_bytes_total")),
            )
        if self.downloads is None or not self.downloads.exists():
            return 0, 0
        rows = [line.split() for line in self.downloads.read_text().splitlines()]
        return len(rows), sum(int(r[1]) for r in rows)


@dataclass
class Point:
    rps: float
    ttft: list[float] = field(default_factory=list)
    cold: list[bool] = field(default_factory=list)
    errors: int = 0
    loads: int = 0
    s3_downloads: int = 0
    s3_bytes: int = 0
    # inside the engine (lorahub's engine probe, the same on every server)
    boundaries: dict = field(default_factory=dict)  # loads by the boundaries they cost
    engine_loads: int = 0
    activations_outside: int = 0  # device-slot copies no scheduled request asked for
    load_steps: list[float] = field(default_factory=list)  # ms of steps that carried a load
    step_ms: float = 0.0  # the mean step
    waited_on_release: int | None = None  # node: loads that waited for a request to end

    def boundaries_per_load(self) -> float:
        n = sum(self.boundaries.values())
        return sum(int(k) * v for k, v in self.boundaries.items()) / n if n else float("nan")

    def extra_per_load(self) -> float:
        return self.activations_outside / self.engine_loads if self.engine_loads else 0.0

    def p(self, q: float, which: bool | None = None) -> float:
        xs = [t for t, c in zip(self.ttft, self.cold, strict=True) if which is None or c == which]
        return pct(xs, q) if xs else float("nan")

    def per_1k(self, n: float) -> float:
        return 1000 * n / max(len(self.ttft) + self.errors, 1)


# --- the world -------------------------------------------------------------------------


def seed_adapters(count: int) -> list[Path]:
    if not (SEED_DIR / "BUILD.json").exists():
        subprocess.run(
            [sys.executable, "manage.py", "build_demo_assets", "--profile", "seed"],
            cwd=ROOT,
            check=True,
        )
    folders = sorted((SEED_DIR / "adapters").iterdir())[:count]
    if len(folders) < count:
        sys.exit(f"the seed profile has {len(folders)} adapters; build more with --adapters")
    return folders


def cache_config(work: Path) -> Path:
    """The node's YAML with the seed's rank cap (everything else as shipped)."""
    text = (ROOT / "lorahub" / "cache.yaml").read_text()
    path = work / "cache.yaml"
    path.write_text(text.replace("max_lora_rank: 16", f"max_lora_rank: {RANK_CAP}"))
    return path


def prepare(work: Path, endpoint: str) -> tuple[dict[str, str], str]:
    """A throwaway control plane whose registry is the shaped S3, serving the seed base;
    returns (env, API key)."""
    from bench.node_overhead import prepare as control_plane

    env, key, _ = control_plane(
        work,
        LORAHUB_BASE_MODEL_DIR=str(SEED_DIR / "base-model"),
        LORAHUB_CACHE_CONFIG=str(cache_config(work)),
        LORAHUB_ENGINE_KV_CACHE_MB=str(KV_MB),
        LORAHUB_S3_ENDPOINT=endpoint,
        LORAHUB_S3_BUCKET=BUCKET,
        LORAHUB_S3_ACCESS_KEY="testing",
        LORAHUB_S3_SECRET_KEY="testing",
    )
    from apps.registry import services as registry_services
    from apps.serving.node.engine import EngineSettings

    engine = EngineSettings.from_django_settings()
    registry_services.register_base_model(  # the node does this at start; uploads need it now
        name=engine.served_model_name,
        revision=engine.base_model_revision,
        model_config=json.loads((SEED_DIR / "base-model" / "config.json").read_text()),
        max_lora_rank=RANK_CAP,
    )
    return env, key


def publish(folders: list[Path]) -> dict[str, int]:
    """Each seed adapter published as alias seed-NNN, version 1; alias -> version id."""
    from django.contrib.auth.models import User

    from apps.demo.management.commands.seed_demo import publish_folder
    from apps.registry import aliases
    from apps.registry.models import VersionState
    from apps.tenants.auth import principal_for_user
    from apps.tenants.models import Quota, Tenant

    acme = Tenant.objects.get(slug="acme")
    Quota.objects.filter(tenant=acme).update(  # the load, not a quota, is measured
        requests_per_minute=1_000_000,
        max_adapters=len(folders) + 10,
        max_hot_adapters=4,
        max_warm_adapters=64,
        max_hot_memory_mb=100_000,
    )
    owner = principal_for_user(User.objects.get(username="alice"))
    reviewer = principal_for_user(User.objects.get(username="rita"))
    ids = {}
    started = time.perf_counter()
    for folder in folders:
        row = publish_folder(acme, owner, reviewer, folder.name, "1", folder)
        assert row.state == VersionState.APPROVED, row.rejection_reason
        aliases.set_alias(principal=owner, tenant=acme, name=folder.name, version_id=row.pk)
        ids[folder.name] = row.pk
    megabytes = sum(f.stat().st_size for d in folders for f in d.iterdir()) / 2**20
    print(
        f"published {len(folders)} adapters ({megabytes:,.0f} MB) to S3 through the registry "
        f"in {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    return ids


def start_servers(work: Path, env: dict[str, str], key: str, folders: list[Path], endpoint: str):
    from django.conf import settings

    from apps.serving.node.engine import LORA_FIX_PLUGIN, EngineSettings
    from bench.many_adapters import PROBE_PLUGIN, probe_path, stock_folder

    engine = EngineSettings.from_django_settings()
    resolver_dir = stock_folder(
        work / "resolver", {f.name: f for f in folders}, Path(engine.model_dir)
    )
    # many_adapters.py's probe in vLLM's worker: each load's LoRA name, start and ms
    paths = f"{probe_path(work)}:{s3_resolver.plugin_path(work)}"
    servers = {}
    for name in SERVERS:
        port, load_dir = free_port(), work / f"loads-{name}"
        load_dir.mkdir()
        log = (work / f"{name}.log").open("wb")
        downloads = None
        if name.startswith("node"):
            run_env = {
                **env,
                "BENCH_LOAD_DIR": str(load_dir),
                "PYTHONPATH": paths,
                "LORAHUB_INTERNAL_TOKEN": settings.LORAHUB_INTERNAL_TOKEN,
                "LORAHUB_NODE_PREFETCH_RISING": "1" if name == "node-prefetch" else "0",
                # the gate as wide as the host slots, beside the default's device slots
                "LORAHUB_NODE_GATE_WIDE": "1" if name == "node-wide" else "0",
            }
            if name != "node":  # a second node: its own name in the registry, its own disk
                run_env.update(
                    LORAHUB_NODE_NAME=name, LORAHUB_NODE_CACHE_DIR=str(work / f"{name}-cache")
                )
            argv = [sys.executable, "manage.py", "runnode", "--port", str(port)]
        else:
            run_env = {k: v for k, v in os.environ.items() if not k.startswith("LORAHUB_")}
            run_env.update(
                VLLM_ALLOW_RUNTIME_LORA_UPDATING="True", BENCH_LOAD_DIR=str(load_dir),
                PYTHONPATH=paths,
            )  # fmt: skip
            if name == "stock-s3":
                downloads = work / "stock-s3-downloads.txt"
                run_env.update(
                    VLLM_PLUGINS=f"{s3_resolver.PLUGIN},{LORA_FIX_PLUGIN},{PROBE_PLUGIN}",
                    LH_S3_RESOLVER_ENDPOINT=endpoint, LH_S3_RESOLVER_BUCKET=BUCKET,
                    LH_S3_RESOLVER_PREFIX="tenants/acme/adapters/", LH_S3_RESOLVER_SUFFIX="/1",
                    LH_S3_RESOLVER_CACHE_DIR=str(work / "stock-s3-cache"),
                    LH_S3_RESOLVER_STATS=str(downloads),
                    AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                )  # fmt: skip
            else:
                run_env.update(
                    VLLM_PLUGINS=f"lora_filesystem_resolver,{LORA_FIX_PLUGIN},{PROBE_PLUGIN}",
                    VLLM_LORA_RESOLVER_CACHE_DIR=str(resolver_dir),
                )
            argv = engine.stock_server_argv(port, {})
        proc = subprocess.Popen(  # a session of its own: it ends whole (``stop``)
            argv, cwd=ROOT, env=run_env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        servers[name] = Server(
            name, url, key if name.startswith("node") else "none", proc, load_dir, downloads
        )
    return engine, servers


def stop(servers) -> None:
    """SIGTERM to each server's whole process group, then SIGKILL to what is left after
    three minutes (a node stopped while its engine starts waits for the engine first)."""
    import signal

    for server in servers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 180
    for server in servers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.proc.pid, signal.SIGKILL)  # the engine's processes, if any
        server.proc.wait()


def ready(server: Server, timeout_s: float = 1200) -> None:
    """Until the server answers its health check: four engines starting at once on two
    cores take minutes."""
    import httpx

    path = "/healthz" if server.name.startswith("node") else "/health"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{server.url}{path}", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if server.proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{server.name} did not start; see its log in the work folder")
        time.sleep(1)


# --- driving ---------------------------------------------------------------------------


async def _one(client, server: Server, model: str, prompt: str):
    """(sent at, wall clock; TTFT ms or None)."""
    body = {
        "model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True,
        "temperature": 0, "stream": True,
    }  # fmt: skip
    import httpx

    sent, started = time.time(), time.perf_counter()
    headers = {"Authorization": f"Bearer {server.key}"}
    try:
        async with client.stream(
            "POST", f"{server.url}/v1/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                await response.aread()
                return sent, None
            first = None
            async for line in response.aiter_lines():
                if first is None and line.startswith("data: {"):
                    event = json.loads(line[6:])
                    if any(c.get("text") for c in event["choices"]):
                        first = (time.perf_counter() - started) * 1000
    except httpx.TimeoutException:  # an error of the point, named, not the end of the bench
        print(f"{server.name}: {model} had no answer in {client.timeout.read:.0f} s", flush=True)
        return sent, None
    return sent, first


async def _drive(server: Server, models: list[str], prompts: list[str], concurrency: int):
    import httpx

    queue = list(reversed(list(enumerate(models))))
    done: list[tuple[str, float, float]] = []  # model, sent, ttft
    errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def worker() -> None:
            nonlocal errors
            while queue:
                i, model = queue.pop()
                sent, first = await _one(client, server, model, prompts[i % len(prompts)])
                if first is None:
                    errors += 1
                else:
                    done.append((model, sent, first))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return done, errors, wall


def loaded_for(model: str, load_name: str) -> bool:
    """Whether an engine load (by vLLM's LoRA name) was of ``model``'s adapter: stock names it
    by the alias, the node as ``tenant/alias@version``."""
    return load_name == model or load_name.split("/")[-1].split("@")[0] == model


def measure(server: Server, models: list[str], prompts: list[str], concurrency: int) -> Point:
    before, s3_before = len(server.loads()), server.s3()
    engine_before, steps_before = server.engine(), len(server.load_steps())
    waited_before = server.waited_on_release()
    done, errors, wall = asyncio.run(_drive(server, models, prompts, concurrency))
    time.sleep(0.2)  # the probe's last lines
    loads = server.loads()
    s3_after = server.s3()
    point = Point(rps=len(done) / wall, errors=errors)
    point.loads = len(loads) - before
    engine_after = server.engine()

    def grew(key: str) -> float:
        return engine_after.get(key, 0) - engine_before.get(key, 0)

    point.boundaries = {
        n: v - engine_before["boundaries"].get(n, 0)
        for n, v in engine_after["boundaries"].items()
        if v - engine_before["boundaries"].get(n, 0)
    }
    point.engine_loads = int(grew("loads_in_step") + grew("loads_between_steps"))
    point.activations_outside = int(grew("activations_outside_steps"))
    point.load_steps = server.load_steps()[steps_before:]
    point.step_ms = grew("step_ms") / grew("steps") if grew("steps") else float("nan")
    if waited_before is not None:
        point.waited_on_release = (server.waited_on_release() or 0) - waited_before
    point.s3_downloads, point.s3_bytes = (a - b for a, b in zip(s3_after, s3_before, strict=True))
    for model, sent, ttft in done:
        end = sent + ttft / 1000
        cold = any(
            loaded_for(model, load.name) and sent - 0.05 <= load.began <= end for load in loads
        )
        point.ttft.append(ttft)
        point.cold.append(cold)
    return point


def say(rep: int, c: int, label: str, point: Point) -> None:
    print(
        f"rep {rep + 1} C={c:<3} {label:<12} {point.rps:5.1f} req/s TTFT p95 "
        f"{point.p(0.95):7.0f} ms (hot {point.p(0.95, False):6.0f}, cold "
        f"{point.p(0.95, True):6.0f} over {sum(point.cold)}), {point.loads} loads, "
        f"{point.s3_downloads} from S3 ({point.s3_bytes / 2**20:,.0f} MB); "
        f"{point.boundaries_per_load():.2f} boundaries per load, "
        f"{point.extra_per_load():.2f} extra activations per load"
        + (f", {point.waited_on_release} waited on a release" if label.startswith("node") else "")
        + (f"  {point.errors} errors" if point.errors else ""),
        flush=True,
    )


def run(args, servers: dict[str, Server], names: list[str], ids: dict[str, int]) -> dict:
    from bench import load_mix
    from bench.many_adapters import evict_from_engine, hot_with_cold
    from bench.workload import ranking, workload

    load_mix.MAX_TOKENS = MAX_TOKENS  # hot_with_cold's requests: this benchmark's size
    prompts = PROMPTS
    models = workload(names, args.requests, args.seed)
    hottest = ranking(models, names)[0]
    for server in servers.values():  # the first request of each: the engine's first steps
        asyncio.run(_drive(server, [hottest] * 4, prompts, 2))
    results: dict = {"c": {}, "cold": {}}
    if args.only != "cold":
        for rep in range(args.reps):
            for c in CONCURRENCY:
                for name in rotation(rep, SERVERS):
                    runs = [(name, models)]
                    if name == "stock-disk":  # the ceiling, right after it on the same server
                        runs.append(("ceiling", [hottest] * len(models)))
                    for label, sequence in runs:
                        point = measure(servers[name], sequence, prompts, c)
                        results["c"].setdefault((c, label), []).append(point)
                        say(rep, c, label, point)
        from apps.telemetry.models import RequestLog
        from bench.many_adapters import replay_agreement

        time.sleep(3)  # the nodes' statistics writers flush every second
        # the node's L3 loads: their only timed work before the engine is the seal check
        results["l3_checks"] = list(
            RequestLog.objects.filter(tier="L3", load_work_ms__isnull=False)
            .filter(node="node-1")
            .values_list("load_work_ms", flat=True)
        )
        # the replay is of the node with the default settings: the prefetching one's log goes
        RequestLog.objects.exclude(node="node-1").delete()
        results["replay"] = replay_agreement(warm_disk=False)
    if args.only != "c":
        ranked = ranking(models, names)
        hot, tail = ranked[:4], ranked[::-1]
        per_phase = int(args.cold_s / 2.0) + 1
        for rep in range(args.reps):
            for name in rotation(rep, SERVERS):
                server = servers[name]
                start = (rep * len(SERVERS) + SERVERS.index(name)) * per_phase % len(tail)
                cold = [m for m in (tail * 2)[start : start + per_phase] if m not in hot]
                if name.startswith("node"):
                    evict_from_engine(server, [ids.get(m) for m in cold])  # type: ignore[arg-type]
                phases = ("quiet", "cold") if rep % 2 == 0 else ("cold", "quiet")
                for phase in phases:
                    got = asyncio.run(
                        hot_with_cold(
                            server,  # type: ignore[arg-type]
                            hot, cold if phase == "cold" else [], prompts, args.cold_s,
                        )
                    )  # fmt: skip
                    results["cold"].setdefault((name, phase), []).append(got)
                    print(
                        f"rep {rep + 1} cold-under-hot {name:<12} {phase:<5} hot p95 "
                        f"{pct(got[0], 0.95):7.1f} ms over {len(got[0])}"
                        + (f", cold p50 {pct(got[1], 0.5):.0f} ms" if got[1] else ""),
                        flush=True,
                    )
    return results


# --- report ----------------------------------------------------------------------------


def report(results: dict, args, floors: dict, sizes: list[float]) -> None:
    med = statistics.median
    print(
        f"\nSeed scale: {args.adapters} adapters of {min(sizes):.0f}-{max(sizes):.0f} MB "
        f"(median {med(sizes):.0f}); S3 shaped to {args.rate_mbit} Mbit/s with a "
        f"{args.first_byte_ms:.0f} ms first byte, achieved: first byte "
        f"{floors['first_byte_ms']:.0f} ms, {floors['mb_per_s']:.0f} MB/s; {args.requests} "
        f"requests per point, max_tokens {MAX_TOKENS}, {args.reps} repetitions rotated; "
        "medians of the repetitions\n"
    )
    if results["c"]:
        head = ("C", "server", "req/s", "p50", "p95", "p99", "hot p95", "cold p50", "cold p95",
                "cold %", "loads/1k", "S3/1k", "S3 MB/1k")  # fmt: skip
        print("".join(f"{h:>10}" if i != 1 else f"{h:>14}" for i, h in enumerate(head)))
        for (c, name), points in sorted(
            results["c"].items(), key=lambda kv: (kv[0][0], (*SERVERS, "ceiling").index(kv[0][1]))
        ):
            row = [
                med(p.rps for p in points),
                med(p.p(0.5) for p in points),
                med(p.p(0.95) for p in points),
                med(p.p(0.99) for p in points),
                med(p.p(0.95, False) for p in points),
                med(p.p(0.5, True) for p in points),
                med(p.p(0.95, True) for p in points),
                med(100 * sum(p.cold) / max(len(p.cold), 1) for p in points),
                med(p.per_1k(p.loads) for p in points),
                med(p.per_1k(p.s3_downloads) for p in points),
                med(p.per_1k(p.s3_bytes / 2**20) for p in points),
            ]
            print(f"{c:>10}{name:>14}" + "".join(f"{v:>10.1f}" for v in row))
        print(
            "\nInside the engine (lorahub's engine probe in vLLM's worker, the same plugin on "
            "every server; medians of the repetitions)\n"
        )
        head = ("C", "server", "bnd/load", "extra act", "load steps", "p50 ms", "max ms",
                "step ms", "waited rel")  # fmt: skip
        print("".join(f"{h:>11}" if i != 1 else f"{h:>14}" for i, h in enumerate(head)))
        for (c, name), points in sorted(
            results["c"].items(), key=lambda kv: (kv[0][0], (*SERVERS, "ceiling").index(kv[0][1]))
        ):
            steps = [x for p in points for x in p.load_steps]
            waited = [p.waited_on_release for p in points if p.waited_on_release is not None]
            row = [
                med(p.boundaries_per_load() for p in points),
                med(p.extra_per_load() for p in points),
                med(len(p.load_steps) for p in points),
                pct(steps, 0.5) if steps else float("nan"),
                max(steps, default=float("nan")),
                med(p.step_ms for p in points),
            ]
            print(
                f"{c:>11}{name:>14}"
                + "".join(f"{v:>11.2f}" for v in row[:2])
                + "".join(f"{v:>11.0f}" for v in row[2:])
                + (f"{sum(waited) / max(sum(p.engine_loads for p in points), 1):>10.1%}"
                   if waited else f"{'-':>11}")
            )  # fmt: skip
        print(
            "\nbnd/load: step boundaries from a load's start to the first step of a request "
            "for it, counting that one (1: the step that runs the request loads it); extra "
            "act: device-slot activations outside a step per engine load; load steps: steps "
            "that carried a load, their p50 and max ms beside the mean step; waited rel: the "
            "node's engine loads that waited for a request to end before they could make room"
        )
        print("\nper repetition | median (TTFT p95 and S3 bytes: lower is better)\n")
        print(f"{'C':>4}  {'node / stock-disk p95':<28}{'node-prefetch / stock-disk':<28}"
              f"{'node-wide / stock-disk':<30}{'node / stock-s3 p95':<28}"
              f"{'A/A stock-disk-b / stock-disk p95':<36}{'ceiling / stock-disk p95':<28}"
              "node / stock-s3 S3 bytes")  # fmt: skip
        for c in CONCURRENCY:
            pts = {name: results["c"][(c, name)] for name in (*SERVERS, "ceiling")}

            def r(a: str, b: str, pts: dict = pts, q: float = 0.95, cold=None) -> list[float]:
                return [x.p(q, cold) / y.p(q, cold) for x, y in zip(pts[a], pts[b], strict=True)]

            total_bytes = [sum(p.s3_bytes for p in pts[n]) for n in ("node", "stock-s3")]
            print(
                f"{c:>4}  {cell(r('node', 'stock-disk')):<28}"
                f"{cell(r('node-prefetch', 'stock-disk')):<28}"
                f"{cell(r('node-wide', 'stock-disk')):<30}{cell(r('node', 'stock-s3')):<28}"
                f"{cell(r('stock-disk-b', 'stock-disk')):<36}"
                f"{cell(r('ceiling', 'stock-disk')):<28}"
                f"{total_bytes[0] / max(total_bytes[1], 1):.2f}"
            )
        print("\ncold requests' TTFT p50, per repetition | median (lower is better)\n")
        print(f"{'C':>4}  {'node / stock-disk':<28}{'node-prefetch / stock-disk':<28}"
              f"{'node-wide / stock-disk':<30}"
              f"{'A/A stock-disk-b / stock-disk':<36}")  # fmt: skip
        for c in CONCURRENCY:
            pts = {name: results["c"][(c, name)] for name in SERVERS}

            def cold50(a: str, b: str, pts: dict = pts) -> list[float]:
                return [
                    x.p(0.5, True) / y.p(0.5, True) for x, y in zip(pts[a], pts[b], strict=True)
                ]

            print(
                f"{c:>4}  {cell(cold50('node', 'stock-disk')):<28}"
                f"{cell(cold50('node-prefetch', 'stock-disk')):<28}"
                f"{cell(cold50('node-wide', 'stock-disk')):<30}"
                f"{cell(cold50('stock-disk-b', 'stock-disk')):<36}"
            )
    if results.get("l3_checks"):
        checks = results["l3_checks"]
        print(
            f"\nThe node's check of an L3 copy before a load (stat against the seal it holds; "
            f"{len(checks)} loads): p50 {pct(checks, 0.5):.3f} ms, p99 {pct(checks, 0.99):.3f} "
            f"ms, max {max(checks):.3f} ms"
        )
    if results["cold"]:
        print("\nCold loads under hot traffic: hot TTFT p95 (ms) per repetition | median\n")
        print(f"{'server':<14}{'quiet':<28}{'with cold loads':<28}{'with / quiet':<26}cold p50")
        from bench.many_adapters import cold_rows

        cold_rows(results["cold"], SERVERS, name_width=14, width=28)
    if "replay" in results:
        agreement = results["replay"]
        live, replay = agreement["live"], agreement["replay"]
        print(
            f"\nReplay of the node's log ({agreement['requests']} requests; costs: "
            f"{agreement['costs']['source']})\n"
        )
        print(f"{'':<8}{'hit rate (L1+L2)':>18}{'L3':>8}{'L4':>8}{'TTFT p50':>10}{'p95':>8}")
        for label, tiers, ttft in (
            ("live", live, agreement["live_ttft"]),
            ("replay", replay, agreement["replay_ttft"]),
        ):
            hit = 100 * (tiers.get("L1", 0) + tiers.get("L2", 0))
            print(
                f"{label:<8}{hit:>17.1f}%{100 * tiers.get('L3', 0):>7.1f}%"
                f"{100 * tiers.get('L4', 0):>7.1f}%{ttft['p50']:>10.0f}{ttft['p95']:>8.0f}"
            )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=("seed",), default="seed")
    parser.add_argument("--adapters", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300, help="per point")
    parser.add_argument("--cold-s", type=float, default=20.0, help="seconds per cold phase")
    parser.add_argument("--only", choices=("c", "cold"), help="run one of the two parts")
    parser.add_argument("--seed", type=int, default=7, help="the trace mapping's seed")
    parser.add_argument("--rate-mbit", type=int, default=10_000)
    parser.add_argument("--first-byte-ms", type=float, default=30.0)
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    folders = seed_adapters(args.adapters)
    sizes = [sum(f.stat().st_size for f in d.iterdir()) / 2**20 for d in folders]
    from tests.harness.shaped_s3 import ShapedS3

    with (
        tempfile.TemporaryDirectory(prefix="lorahub-seed-", dir=ROOT / "var") as tmp,
        ShapedS3(rate_mbit=args.rate_mbit, first_byte_ms=args.first_byte_ms) as s3,
    ):
        work = Path(tmp)
        floors = s3.floors(size_mb=round(statistics.median(sizes)))
        print(f"S3 floors: {floors}", flush=True)
        env, key = prepare(work, s3.endpoint)
        from django.conf import settings

        settings.LORAHUB_INTERNAL_TOKEN = env["LORAHUB_INTERNAL_TOKEN"] = os.urandom(16).hex()
        ids = publish(folders)
        _, servers = start_servers(work, env, key, folders, s3.endpoint)
        try:
            started = time.perf_counter()
            for server in servers.values():
                ready(server)
            print(f"servers ready in {time.perf_counter() - started:.0f} s", flush=True)
            results = run(args, servers, [f.name for f in folders], ids)
        finally:
            stop(servers.values())
            keep_logs(work)
        report(results, args, floors, sizes)


def keep_logs(work: Path) -> None:
    """The servers' logs outlive the run's folder (in ``var/seed-logs/``, replaced each run):
    what a failed or slow point left behind can still be read."""
    import shutil

    kept = ROOT / "var" / "seed-logs"
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    for log in work.glob("*.log"):
        shutil.copy(log, kept / log.name)


if __name__ == "__main__":
    main(sys.argv[1:])
