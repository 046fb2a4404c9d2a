"""Hundreds of adapters on one node vs. stock vLLM with its filesystem LoRA resolver.

The alternative a vLLM user has for many adapters is stock vLLM's own
``lora_filesystem_resolver`` plugin: every adapter in a directory, resolved by name on first
use, its CPU cache LRU over ``max_cpu_loras``. Three servers run for the whole benchmark,
measured one at a time, the order rotated per repetition (each goes first once in three):

- **node**: lorahub (``manage.py runnode``) with its tiers and default policy; all N versions
  published through the registry and landed in its local disk tier (L3) before the run, so
  neither side fetches from S3;
- **stock**: vLLM's OpenAI server, ``VLLM_PLUGINS=lora_filesystem_resolver,lorahub_lora_fix``
  (the same LoRA correctness plugin the node's engine loads), ``VLLM_LORA_RESOLVER_CACHE_DIR``
  over a folder holding the same N adapters (the same weights, linked), runtime LoRA
  updating on;
- **stock-b**: the same stock server again: stock-b / stock is the A/A noise floor.

Same engine limits for all three: max_loras 4, max_cpu_loras 16, rank cap 16, float32, the
same KV space and max_num_seqs, the same seed.

**Load (c)**: N = 200 demo adapters (``build_demo_assets --extra``). The request sequence is
the Azure LLM conversation trace (``../shared/traces/``, 19,366 arrivals over one hour)
mapped by the replay's documented scheme (``apps/serving/replay/traces.from_csv``, seed 7):
each arrival names adapter k by Zipf(1.0) over a ranking of which 20 % is reshuffled every
10 minutes of trace time. ``--requests`` arrivals are taken evenly across the hour (every
k-th), so one point walks through all six popularity epochs; trace key k is alias
``many-{k:03d}``. The sequence is played by C streaming clients (closed loop, C = 8 and 32:
the trace's hour is compressed to what the server sustains), max_tokens 16 with
``ignore_eos`` so every request makes the same work. The same sequence goes to every server.

Measured per point: req/s, output tokens/s, TTFT p50/p95/p99 (client side, first streamed
token), engine loads (adapter weights read from disk into the engine's CPU cache) per 1,000
requests and their mean time, and load time per request. Loads are counted the same way on
all three servers, inside vLLM's worker, by a probe plugin this script writes to its
temporary folder (``vllm.general_plugins`` entry point on PYTHONPATH; nothing is installed).

**Cold load under hot traffic**: 16 streams on the 4 hottest adapters for ``--cold-s``
seconds, with and without one request for a cold adapter (on disk only, never asked before
in the phase) every 2 s; the hot requests' TTFT p95 with the cold loads over without.

**Ceiling**: right after stock at each point, stock again with every request of the sequence
on its hottest adapter: no loads, no slot changes, the fullest batches. No way of scheduling
the 200 adapters on the same engine does better, so ceiling / stock bounds any gain over stock.
A loose bound: it removes the adapters' diversity, which no scheduler can. **Step model**: from
the ceiling's two points, ``bench/batching_bound.py`` models the engine and prints what each
admission order (vLLM's, the node's gate, an idealized one) does on the same sequence.

**Replay agreement**: after the run, ``manage.py replay``'s engine (``apps/serving/replay``)
replays the node's own request log under the default policy with the node's capacities, its
disk prewarmed with every version as the bench's was (``--warm-disk``), and the load costs the
node measured; its per-tier hit rates and TTFT beside the node's. The
replay holds each version while its logged requests run (from arrival to last byte), and is
printed once more without holds. The log's export is kept in
``var/bench/many_adapters-requests.jsonl``, with the command that replays it again.

Usage: .venv/bin/python bench/many_adapters.py [--adapters 200] [--reps 3] [--requests 300]
       [--cold-s 20] [--only c|cold]
       .venv/bin/python bench/many_adapters.py --profile seed …: the seeds' scale, adapters
       of 36-71 MB fetched from a shaped S3, against stock vLLM over disk and over S3
       (``bench/seed_scale.py``)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPORT = ROOT / "var" / "bench" / "many_adapters-requests.jsonl"  # the node's log, last run
sys.path.insert(0, str(ROOT))

from bench import load_mix  # noqa: E402
from bench.load_mix import SERVERS, cell, cpu_seconds, one, ratios, rotation  # noqa: E402
from bench.node_overhead import free_port, pct, prepare, wait_ready  # noqa: E402
from bench.workload import ranking, workload  # noqa: E402

CONCURRENCY = (8, 32)
MAX_TOKENS = 16
HOT = 4
COLD_EVERY_S = 2.0
COLD_STREAMS = 16
PROBE_PLUGIN = "bench_load_probe"

PROBE_MODULE = '''
"""Counts and times adapter loads inside vLLM's worker (bench/many_adapters.py)."""
import json
import os
import time


def register():
    out = os.environ.get("BENCH_LOAD_DIR")
    if not out:
        return
    from vllm.lora import worker_manager

    manager = worker_manager.WorkerLoRAManager
    if getattr(manager._load_adapter, "_bench_probe", False):
        return
    inner = manager._load_adapter

    def _load_adapter(self, lora_request):
        began, started = time.time(), time.perf_counter()
        try:
            return inner(self, lora_request)
        finally:
            ms = (time.perf_counter() - started) * 1000
            with open(os.path.join(out, f"{os.getpid()}.loads"), "a") as fh:
                fh.write(f"{lora_request.lora_name}\\t{began:.4f}\\t{ms:.3f}\\n")

    _load_adapter._bench_probe = True
    manager._load_adapter = _load_adapter

    # engine steps: how many, how many requests in each, the worker's time in them
    from vllm.v1.worker import gpu_model_runner

    runner = gpu_model_runner.GPUModelRunner
    totals = [0, 0, 0.0]  # steps, requests over those steps, ms computing
    path = os.path.join(out, f"{os.getpid()}.steps")

    def timed(inner, counts):
        def call(self, *args, **kwargs):
            started = time.perf_counter()
            try:
                return inner(self, *args, **kwargs)
            finally:
                totals[2] += (time.perf_counter() - started) * 1000
                if counts:
                    output = args[0] if args else kwargs.get("scheduler_output")
                    scheduled = len(output.num_scheduled_tokens) if output is not None else 0
                    if scheduled:
                        totals[0] += 1
                        totals[1] += scheduled
                with open(path, "w") as fh:  # a snapshot, read between points
                    fh.write(f"{totals[0]} {totals[1]} {totals[2]:.3f}")
                if counts and scheduled:
                    engine_counts(started)

        return call

    def engine_counts(started):
        """lorahub's engine probe (``apps/serving/node/engine_probe.py``, in the LoRA fix's
        plugin every server loads): a snapshot of its counts, and the ms of each step that
        carried a load."""
        try:
            from apps.serving.node import engine_probe
        except ImportError:
            return
        if engine_probe._state.get("step_loaded"):
            with open(os.path.join(out, f"{os.getpid()}.loadsteps"), "a") as fh:
                fh.write(f"{(time.perf_counter() - started) * 1000:.3f}\\n")
        with open(os.path.join(out, f"{os.getpid()}.engine"), "w") as fh:
            json.dump(engine_probe.counts(), fh)

    runner.execute_model = timed(runner.execute_model, True)
    if hasattr(runner, "sample_tokens"):
        runner.sample_tokens = timed(runner.sample_tokens, False)
'''


@dataclass
class Point(load_mix.Point):
    """``load_mix``'s point, with the engine loads the probe counted during it."""

    loads: int = 0
    load_ms: float = 0.0  # the sum over this point's loads
    steps: int = 0  # engine steps that ran requests, during the point
    step_requests: int = 0  # requests in those steps, summed
    step_ms: float = 0.0  # the worker's time computing them (forward and sampling)
    wall_s: float = 0.0

    @property
    def cpu_ms(self) -> float:
        """The server's CPU per request, all its processes."""
        return self.front_cpu_ms + self.engine_cpu_ms

    @property
    def loads_per_1k(self) -> float:
        return 1000 * self.loads / max(len(self.ttft) + self.errors, 1)

    @property
    def mean_load_ms(self) -> float:
        return self.load_ms / self.loads if self.loads else 0.0

    @property
    def load_ms_per_request(self) -> float:
        return self.load_ms / max(len(self.ttft) + self.errors, 1)

    @property
    def batch(self) -> float:
        """Requests in an engine step, on average."""
        return self.step_requests / self.steps if self.steps else 0.0

    @property
    def ms_per_step(self) -> float:
        return self.step_ms / self.steps if self.steps else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s if self.wall_s else 0.0

    @property
    def computing(self) -> float:
        """The share of the point's wall time the worker spent in steps."""
        return self.step_ms / 1000 / self.wall_s if self.wall_s else 0.0


@dataclass
class Server:
    name: str
    url: str
    key: str
    proc: subprocess.Popen
    load_dir: Path
    versions: dict[str, int] = field(default_factory=dict)  # node: alias -> version id

    def loads(self) -> list[float]:
        """Each load's ms (the probe writes: LoRA name, wall-clock start, ms)."""
        out: list[float] = []
        for path in self.load_dir.glob("*.loads"):
            out += [float(line.split("\t")[-1]) for line in path.read_text().splitlines()]
        return out

    def steps(self) -> tuple[int, int, float]:
        """The probe's totals so far: steps, requests in them, ms computing."""
        totals = [0.0, 0.0, 0.0]
        for path in self.load_dir.glob("*.steps"):
            for _ in range(50):  # a snapshot being rewritten reads empty: read it again
                fields = path.read_text().split()
                if len(fields) == 3:
                    totals = [t + float(f) for t, f in zip(totals, fields, strict=True)]
                    break
                time.sleep(0.002)
        return int(totals[0]), int(totals[1]), totals[2]


# --- the world -------------------------------------------------------------------------


def publish(count: int) -> tuple[dict[str, Path], dict[str, int]]:
    """``count`` extra adapters (distinct weights) for tenant acme, each behind an alias of
    its own name. Returns alias -> folder, and alias -> version id."""
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
        requests_per_minute=1_000_000,
        max_adapters=count + 10,
        max_hot_adapters=4,
        max_warm_adapters=64,
        max_hot_memory_mb=100_000,
    )
    owner = principal_for_user(User.objects.get(username="alice"))
    reviewer = principal_for_user(User.objects.get(username="rita"))
    folders = build_extra_adapters(demo_dir=Path(settings.LORAHUB_DEMO_DIR), count=count)
    mix, ids = {}, {}
    started = time.perf_counter()
    for i, folder in enumerate(folders):
        name = f"many-{i:03d}"
        row = publish_folder(acme, owner, reviewer, name, "1", folder)
        assert row.state == VersionState.APPROVED, row.rejection_reason
        aliases.set_alias(principal=owner, tenant=acme, name=name, version_id=row.pk, reason="")
        mix[name], ids[name] = folder, row.pk
    print(f"published {count} adapters in {time.perf_counter() - started:.0f} s", flush=True)
    return mix, ids


def stock_folder(root: Path, mix: dict[str, Path], model_dir: Path) -> Path:
    """The resolver's directory: one folder per alias, the same weights (linked) and a
    config naming the served base model the way the resolver checks it."""
    root.mkdir()
    for name, folder in mix.items():
        target = root / name
        target.mkdir()
        (target / "adapter_model.safetensors").symlink_to(folder / "adapter_model.safetensors")
        config = json.loads((folder / "adapter_config.json").read_text())
        config["base_model_name_or_path"] = str(model_dir)  # what the resolver compares
        (target / "adapter_config.json").write_text(json.dumps(config))
    return root


def probe_path(work: Path) -> Path:
    """A folder for PYTHONPATH holding the load probe and the entry point vLLM finds it by."""
    where = work / "probe"
    dist = where / f"{PROBE_PLUGIN}-0.dist-info"
    dist.mkdir(parents=True)
    (where / f"{PROBE_PLUGIN}.py").write_text(PROBE_MODULE)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PROBE_PLUGIN}\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\n{PROBE_PLUGIN} = {PROBE_PLUGIN}:register\n"
    )
    return where


# --- driving ---------------------------------------------------------------------------


async def drive(server: Server, models: list[str], prompts: list[str], concurrency: int) -> Point:
    """``models`` in order from ``concurrency`` streaming clients (``load_mix.drive``)."""
    jobs = [(model, prompts[i % len(prompts)]) for i, model in enumerate(models)]
    done = await load_mix.drive(server.url, server.key, jobs, concurrency)
    return Point(rps=done.rps, tps=done.tps, ttft=done.ttft, errors=done.errors)


def measured(server: Server, models: list[str], prompts: list[str], concurrency: int) -> Point:
    before_loads, before_steps = server.loads(), server.steps()
    front, engine = cpu_seconds(server.proc.pid)
    started = time.perf_counter()
    point = asyncio.run(drive(server, models, prompts, concurrency))
    point.wall_s = time.perf_counter() - started
    front_after, engine_after = cpu_seconds(server.proc.pid)
    after, after_steps = server.loads(), server.steps()
    point.steps = after_steps[0] - before_steps[0]
    point.step_requests = after_steps[1] - before_steps[1]
    point.step_ms = after_steps[2] - before_steps[2]
    point.loads = len(after) - len(before_loads)
    point.load_ms = sum(after) - sum(before_loads)
    done = max(len(point.ttft), 1)
    point.front_cpu_ms = (front_after - front) * 1000 / done
    point.engine_cpu_ms = (engine_after - engine) * 1000 / done
    return point


async def hot_with_cold(
    server: Server, hot: list[str], cold: list[str], prompts: list[str], seconds: float
) -> tuple[list[float], list[float], int]:
    """16 streams on ``hot`` for ``seconds``; when ``cold`` is not empty, one request for the
    next cold alias every 2 s beside them. Returns (hot TTFTs, cold TTFTs, errors)."""
    import httpx

    hot_ttft: list[float] = []
    cold_ttft: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=COLD_STREAMS + 8)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def stream(k: int) -> None:
            nonlocal errors
            i = k
            while time.perf_counter() < stop:
                first, _ = await one(
                    client, server.url, server.key, hot[i % len(hot)], prompts[i % len(prompts)]
                )
                i += COLD_STREAMS
                if first is None:
                    errors += 1
                else:
                    hot_ttft.append(first)

        async def cold_one(model: str) -> None:
            nonlocal errors
            first, _ = await one(client, server.url, server.key, model, prompts[0])
            if first is None:
                errors += 1
            else:
                cold_ttft.append(first)

        async def colds() -> None:
            pending = []
            for model in cold:
                await asyncio.sleep(COLD_EVERY_S)
                if time.perf_counter() >= stop:
                    break
                pending.append(asyncio.create_task(cold_one(model)))
            await asyncio.gather(*pending)

        await asyncio.gather(*(stream(k) for k in range(COLD_STREAMS)), colds())
    return hot_ttft, cold_ttft, errors


# --- servers ---------------------------------------------------------------------------


def start_servers(work: Path, env: dict[str, str], key: str, mix: dict[str, Path]):
    from django.conf import settings

    from apps.serving.node.engine import LORA_FIX_PLUGIN, EngineSettings

    engine = EngineSettings.from_django_settings()
    resolver_dir = stock_folder(work / "resolver", mix, Path(engine.model_dir))
    probe = probe_path(work)
    ports = {name: free_port() for name in SERVERS}
    servers: dict[str, Server] = {}
    for name in SERVERS:
        load_dir = work / f"loads-{name}"
        load_dir.mkdir()
        log = (work / f"{name}.log").open("wb")
        if name == "node":
            node_env = {
                **env,
                "BENCH_LOAD_DIR": str(load_dir),
                "PYTHONPATH": str(probe),
                "LORAHUB_INTERNAL_TOKEN": settings.LORAHUB_INTERNAL_TOKEN,
            }
            argv = [sys.executable, "manage.py", "runnode", "--port", str(ports[name])]
            proc = subprocess.Popen(
                argv, cwd=ROOT, env=node_env, stdout=log, stderr=subprocess.STDOUT
            )
        else:
            stock_env = {k: v for k, v in os.environ.items() if not k.startswith("LORAHUB_")}
            stock_env.update(
                VLLM_PLUGINS=f"lora_filesystem_resolver,{LORA_FIX_PLUGIN},{PROBE_PLUGIN}",
                VLLM_LORA_RESOLVER_CACHE_DIR=str(resolver_dir),
                VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
                BENCH_LOAD_DIR=str(load_dir),
                PYTHONPATH=str(probe),
            )
            proc = subprocess.Popen(
                engine.stock_server_argv(ports[name], {}),
                cwd=ROOT,
                env=stock_env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{ports[name]}"
        servers[name] = Server(name, url, key if name == "node" else "none", proc, load_dir)
    return engine, servers


def land_everything(server: Server, ids: dict[str, int]) -> None:
    """The node's disk tier holds every version before the run (as stock's folder does)."""
    import httpx
    from django.conf import settings

    headers = {"Authorization": f"Bearer {settings.LORAHUB_INTERNAL_TOKEN}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        for version_id in ids.values():
            answer = client.post("/internal/warm", json={"version_id": version_id, "tier": "L3"})
            answer.raise_for_status()


# --- main ------------------------------------------------------------------------------


def main() -> None:
    if "--profile" in sys.argv:  # the seeds' scale: its own program, servers and world
        seed_scale = str(ROOT / "bench" / "seed_scale.py")
        os.execv(sys.executable, [sys.executable, seed_scale, *sys.argv[1:]])  # noqa: S606
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300, help="per point")
    parser.add_argument("--cold-s", type=float, default=20.0, help="seconds per cold phase")
    parser.add_argument("--only", choices=("c", "cold"), help="run one of the two parts")
    parser.add_argument("--seed", type=int, default=7, help="the trace mapping's seed")
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="lorahub-many-") as tmp:
        work = Path(tmp)
        env, key, _ = prepare(work)
        from django.conf import settings

        settings.LORAHUB_INTERNAL_TOKEN = env["LORAHUB_INTERNAL_TOKEN"] = os.urandom(16).hex()
        mix, ids = publish(args.adapters)
        engine, servers = start_servers(work, env, key, mix)
        servers["node"].versions = ids
        try:
            for server in servers.values():
                health = "/healthz" if server.name == "node" else "/health"
                wait_ready(server.url, health, server.proc, server.name)
            started = time.perf_counter()
            land_everything(servers["node"], ids)
            print(f"node: {len(ids)} versions on disk in {time.perf_counter() - started:.1f} s")
            results = run(args, servers, sorted(mix))
            if args.only != "cold":
                results["replay"] = replay_agreement()
        finally:
            for server in servers.values():
                server.proc.terminate()
            for server in servers.values():
                try:
                    server.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    server.proc.kill()
    report(results, args, engine)


def run(args, servers: dict[str, Server], names: list[str]) -> dict:
    from apps.demo import corpus

    prompts = [corpus.completion_prompt(q) for q in corpus.UNSEEN_PROMPTS]
    models = workload(names, args.requests, args.seed)
    for server in servers.values():  # every adapter once: compiled paths, resolver entries
        started = time.perf_counter()
        asyncio.run(drive(server, names, prompts, 4))
        print(f"warmed up {server.name} in {time.perf_counter() - started:.0f} s", flush=True)
    results: dict = {"c": {}, "cold": {}, "sequence": models}
    # The ceiling: stock with every request of the sequence on its hottest adapter (no loads,
    # no slot changes, the fullest batches). No scheduler of the 200 adapters can beat it on
    # the same engine, so ceiling / stock bounds what any gain over stock can be.
    one_adapter = [ranking(models, names)[0]] * len(models)
    if args.only != "cold":
        for rep in range(args.reps):
            for c in CONCURRENCY:
                for name in rotation(rep):
                    runs = [(name, models)]
                    if name == "stock":  # the ceiling right after stock, on the same server
                        runs.append(("ceiling", one_adapter))
                    for label, sequence in runs:
                        point = measured(servers[name], sequence, prompts, c)
                        results["c"].setdefault((c, label), []).append(point)
                        print(
                            f"rep {rep + 1} C={c:<3} {label:<7} {point.rps:6.1f} req/s TTFT p50 "
                            f"{point.p(0.5):7.1f} p95 {point.p(0.95):7.1f} ms, {point.loads} "
                            f"loads ({point.mean_load_ms:.1f} ms each)"
                            + (f"  {point.errors} errors" if point.errors else ""),
                            flush=True,
                        )
    if args.only != "c":
        ranked = ranking(models, names)
        hot, tail = ranked[:HOT], ranked[::-1]
        per_phase = int(args.cold_s / COLD_EVERY_S) + 1
        for rep in range(args.reps):
            for name in rotation(rep):
                server = servers[name]
                # each cold phase asks for adapters not asked for since their last phase
                # began: on the node they sit in L3 only (evicted below), on stock they fell
                # out of its CPU cache's 16 entries long ago
                start = (rep * len(SERVERS) + SERVERS.index(name)) * per_phase % len(tail)
                cold = [m for m in (tail * 2)[start : start + per_phase] if m not in hot]
                if name == "node":
                    evict_from_engine(server, [server.versions.get(m) for m in cold])
                phases = ("quiet", "cold") if rep % 2 == 0 else ("cold", "quiet")
                for phase in phases:
                    hot_ttft, cold_ttft, errors = asyncio.run(
                        hot_with_cold(
                            server, hot, cold if phase == "cold" else [], prompts, args.cold_s
                        )
                    )
                    results["cold"].setdefault((name, phase), []).append(
                        (hot_ttft, cold_ttft, errors)
                    )
                    print(
                        f"rep {rep + 1} cold-under-hot {name:<7} {phase:<5} hot p95 "
                        f"{pct(hot_ttft, 0.95):7.1f} ms over {len(hot_ttft)}"
                        + (f", cold p50 {pct(cold_ttft, 0.5):.0f} ms" if cold_ttft else "")
                        + (f"  {errors} errors" if errors else ""),
                        flush=True,
                    )
    return results


def evict_from_engine(server: Server, version_ids: list[int | None]) -> None:
    import httpx
    from django.conf import settings

    headers = {"Authorization": f"Bearer {settings.LORAHUB_INTERNAL_TOKEN}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        for version_id in version_ids:
            if version_id is None:
                continue
            for tier in ("L1", "L2"):
                client.post("/internal/evict", json={"version_id": version_id, "tier": tier})


def replay_agreement(*, warm_disk: bool = True) -> dict:
    """The node's request log replayed under the default policy with the node's capacities
    and measured load costs, beside what the node reported. ``warm_disk``: the node's disk
    held every version before the run (this benchmark lands them; the seed profile's does
    not)."""
    import numpy as np

    from apps.serving.cache.policies import POLICIES
    from apps.serving.replay import run as replay_run
    from apps.serving.replay.traces import write_export
    from apps.telemetry.models import RequestLog
    from apps.telemetry.requestlog import costs_from_log, log_rows

    default = POLICIES[0]  # "weighted": the node's default
    time.sleep(3)  # the node's statistics writer flushes every second
    costs = costs_from_log(since_hours=6)
    spec = replay_run.Spec(
        trace=replay_run.TraceSpec(source="db", since_hours=6),
        policies=(default,),
        # the node's disk held all the versions before the run (as the bench landed them)
        capacity=dataclasses.replace(replay_run.capacity_from_config(), warm_disk=warm_disk),
        costs=costs,
    )
    trace = spec.trace.build()
    report = replay_run.execute(spec, trace=trace)
    replayed = report["policies"][default]
    # the same without holds (every version free to leave at any time), to show what they do
    unheld = replay_run.execute(spec, trace=dataclasses.replace(trace, held_s=None))
    # kept for replaying again without the servers (`manage.py replay --file`, printed below)
    EXPORT.parent.mkdir(parents=True, exist_ok=True)
    write_export(log_rows(since_hours=6), EXPORT)
    live = RequestLog.objects.filter(status=200, ttft_ms__isnull=False)
    ttfts = np.array(list(live.values_list("ttft_ms", flat=True)))
    where_time_goes = {}  # the node's own per-request accounting, by tier
    for tier in ("L1", "L2", "L3", "L4"):
        rows = np.array(list(live.filter(tier=tier).values_list("queue_ms", "load_ms", "ttft_ms")))
        if len(rows):
            where_time_goes[tier] = {
                "requests": len(rows),
                "queue_ms": float(rows[:, 0].mean()),
                "load_ms": float(rows[:, 1].mean()),
                "ttft_ms": float(rows[:, 2].mean()),
            }
    return {
        "requests": report["trace"]["requests"],
        "live": report.get("node_tiers", {}),
        "replay": replayed["tier_rates"],
        "live_ttft": {
            "p50": float(np.percentile(ttfts, 50)) if len(ttfts) else float("nan"),
            "p95": float(np.percentile(ttfts, 95)) if len(ttfts) else float("nan"),
        },
        "replay_ttft": replayed["ttft_ms"],
        "unheld": unheld["policies"][default]["tier_rates"],
        "unheld_ttft": unheld["policies"][default]["ttft_ms"],
        "capacity": spec.capacity,
        "node_accounting": where_time_goes,
        "costs": {
            "base_ttft_ms": costs.base_ttft_ms,
            "l3_ms": costs.l3_ms,
            "l4_ms": costs.l4_ms,
            "source": f"{costs.describe()} ({costs.source})",
        },
    }


# --- report ----------------------------------------------------------------------------


def bound(results: dict, engine) -> None:
    """What any admission order could do on this run's sequence: ``bench/batching_bound.py``'s
    step model, its costs from this run's one-adapter points, beside the measured req/s."""
    from bench import batching_bound

    med = statistics.median
    measured = {
        c: {
            label: med(p.rps for p in points)
            for (cc, label), points in results["c"].items()
            if cc == c
        }
        for c in CONCURRENCY
    }
    cost = batching_bound.StepCost.from_ceiling(
        {c: measured[c]["ceiling"] for c in CONCURRENCY}, MAX_TOKENS
    )
    print(
        "\nWhat an admission order could gain on this sequence (bench/batching_bound.py: a step "
        "model, its costs from this run's one-adapter points; loads cost nothing in it)\n"
    )
    lines = batching_bound.table(
        results["sequence"],
        CONCURRENCY,
        cost,
        slots=engine.max_loras,
        tokens=MAX_TOKENS,
        measured=measured,
    )
    print("\n".join(lines))


def median_table(
    points: dict[tuple[int, str], list[Point]],
    columns: list[tuple[str, int, str, Callable[[list[Point]], float]]],
) -> None:
    """One row per (concurrency, server): each column's header, width, format and value."""
    print(f"{'C':>4}{'server':>8}" + "".join(f"{head:>{width}}" for head, width, _, _ in columns))
    for (c, name), mine in sorted(points.items()):
        cells = "".join(f"{value(mine):>{width}{spec}}" for _, width, spec, value in columns)
        print(f"{c:>4}{name:>8}{cells}")


def cold_rows(cold: dict, servers, *, name_width: int, width: int) -> None:
    """Per server: hot TTFT p95 quiet and with cold loads, per repetition | median, their
    ratio, and the cold requests' TTFT p50."""
    for name in servers:
        quiet = [pct(h, 0.95) for h, _, _ in cold[(name, "quiet")]]
        loaded = [pct(h, 0.95) for h, _, _ in cold[(name, "cold")]]
        cold_ttft = [t for _, c, _ in cold[(name, "cold")] for t in c]
        print(
            f"{name:<{name_width}}{cell(quiet, 0):<{width}}{cell(loaded, 0):<{width}}"
            f"{cell([a / b for a, b in zip(loaded, quiet, strict=True)]):<26}"
            f"{pct(cold_ttft, 0.5) if cold_ttft else float('nan'):>12.0f}ms"
        )


def report(results: dict, args, engine) -> None:
    print(
        f"\nLoad (c): {args.adapters} adapters, Azure conversation trace (every "
        f"{19366 // args.requests}th arrival of its hour), Zipf 1.0 with 20 % of the ranking "
        f"reshuffled every 10 trace minutes (seed {args.seed}); {args.requests} streamed "
        f"completions per point, max_tokens={MAX_TOKENS} (ignore_eos), {args.reps} "
        f"repetitions rotated; max_loras={engine.max_loras}, "
        f"max_cpu_loras={engine.max_cpu_loras}, rank cap {engine.max_lora_rank}\n"
    )
    if results["c"]:
        med = statistics.median

        def median_of(attribute: str) -> Callable[[list[Point]], float]:
            return lambda points: med(getattr(p, attribute) for p in points)

        quantiles = [
            (f"p{round(100 * q)} ms", 9, ".1f", lambda ps, q=q: med(p.p(q) for p in ps))
            for q in (0.5, 0.95, 0.99)
        ]
        median_table(
            results["c"],
            [
                ("req/s", 8, ".1f", median_of("rps")),
                ("tok/s", 8, ".0f", median_of("tps")),
                *quantiles,
                ("err", 5, "d", lambda points: sum(p.errors for p in points)),
                ("loads/1k", 10, ".0f", median_of("loads_per_1k")),
                ("ms/load", 9, ".1f", median_of("mean_load_ms")),
                ("load ms/req", 12, ".1f", median_of("load_ms_per_request")),
                ("cpu ms/req", 11, ".1f", median_of("cpu_ms")),
            ],
        )
        print(
            "\nInside the engine (the probe in vLLM's worker; medians): steps that ran "
            "requests, requests in a step, the worker's ms per step (forward and sampling), "
            "and the share of the wall time it spent in steps; CPU per request of the server's "
            "front process (HTTP and, on the node, its whole request path) and of its engine "
            "processes\n"
        )
        median_table(
            results["c"],
            [
                ("steps/s", 9, ".1f", median_of("steps_per_s")),
                ("req/step", 10, ".2f", median_of("batch")),
                ("ms/step", 9, ".2f", median_of("ms_per_step")),
                ("busy", 7, ".0%", median_of("computing")),
                ("front cpu ms/req", 18, ".1f", median_of("front_cpu_ms")),
                ("engine cpu ms/req", 19, ".1f", median_of("engine_cpu_ms")),
            ],
        )
        print(
            "\nper repetition | median, against stock (req/s: higher is better; TTFT and "
            "loads: lower). A/A is stock-b / stock; a node / stock ratio inside the A/A range "
            "is no different from stock in this run\n"
        )
        print(
            f"{'C':>4}  {'metric':<10}{'node / stock':<26}{'A/A stock-b / stock':<26}"
            f"{'A/A range':<14}ceiling / stock (one adapter: no adapter diversity at all)"
        )
        for c in CONCURRENCY:
            stock = results["c"][(c, "stock")]
            for metric, value in (
                ("req/s", lambda p: p.rps),
                ("TTFT p95", lambda p: p.p(0.95)),
                ("loads/1k", lambda p: max(p.loads_per_1k, 1e-9)),
            ):
                node = ratios(results["c"][(c, "node")], stock, value)
                aa = ratios(results["c"][(c, "stock-b")], stock, value)
                ceiling = ratios(results["c"][(c, "ceiling")], stock, value)
                print(
                    f"{c:>4}  {metric:<10}{cell(node):<26}{cell(aa):<26}"
                    f"{f'[{min(aa):.2f}, {max(aa):.2f}]':<14}"
                    + (cell(ceiling) if metric != "loads/1k" else "")
                )
        bound(results, engine)
    if results["cold"]:
        print(
            f"\nCold load under hot traffic: {COLD_STREAMS} streams on the {HOT} hottest "
            f"adapters for {args.cold_s:.0f} s, with and without a request for a cold adapter "
            f"(disk only) every {COLD_EVERY_S:.0f} s; hot TTFT p95 per repetition | median\n"
        )
        print(
            f"{'server':<9}{'quiet p95 ms':<30}{'with cold p95 ms':<30}{'with / quiet':<26}"
            f"{'cold TTFT p50':>14}"
        )
        cold_rows(results["cold"], SERVERS, name_width=9, width=30)
    if "replay" in results:
        agreement = results["replay"]
        print(
            f"\nReplay of the node's own log ({agreement['requests']} requests, default policy, "
            f"the node's capacities; load costs measured by the node: base TTFT "
            f"{agreement['costs']['base_ttft_ms']:.0f} ms, L3 {agreement['costs']['l3_ms']:.0f} "
            f"ms, L4 {agreement['costs']['l4_ms']:.0f} ms)\n"
        )
        print(f"{'':<8}{'L1':>8}{'L2':>8}{'L1+L2':>8}{'L3':>8}{'L4':>8}{'TTFT p50':>10}{'p95':>8}")
        for label, tiers, ttft in (
            ("live", agreement["live"], agreement["live_ttft"]),
            ("replay", agreement["replay"], agreement["replay_ttft"]),
            ("no holds", agreement["unheld"], agreement["unheld_ttft"]),
        ):
            print(
                f"{label:<8}"
                + "".join(f"{100 * tiers.get(t, 0):>7.1f}%" for t in ("L1", "L2"))
                + f"{100 * (tiers.get('L1', 0) + tiers.get('L2', 0)):>7.1f}%"
                + "".join(f"{100 * tiers.get(t, 0):>7.1f}%" for t in ("L3", "L4"))
                + f"{ttft['p50']:>10.0f}{ttft['p95']:>8.0f}"
            )
        capacity, costs = agreement["capacity"], agreement["costs"]
        print(
            f"\n(replay: each version held from its request's arrival to its last byte, as "
            "logged; no holds: any version may leave at any time)\nagain, without the servers: "
            f".venv/bin/python manage.py replay --file "
            f"{EXPORT.relative_to(ROOT)} --policies weighted --l1 {capacity.l1_slots} --l2 "
            f"{capacity.l2_slots} --l2-gb {(capacity.l2_bytes or 0) / 2**30:g} --l3-gb "
            f"{(capacity.l3_bytes or 0) / 2**30:g} --warm-disk "
            f"--ttl-minutes {(capacity.ttl_s or 0) / 60:g} "
            f"--max-pending {capacity.max_pending} --max-loads {capacity.max_loads} "
            f"--max-fetches {capacity.max_fetches} --base-ttft-ms {costs['base_ttft_ms']:.1f} "
            f"--bench-costs --l3-ms {costs['l3_ms']:.1f} --l3-ms-per-mb 0 --l4-ms "
            f"{costs['l4_ms']:.1f} --l4-ms-per-mb 0"
        )
        print(
            "\nWhere the node's requests spent their time (its own log, every request of the "
            "run; means in ms: waiting at the admission gate for a device slot or the load "
            "queue, loading, and TTFT, which includes both)\n"
        )
        print(f"{'tier':<6}{'requests':>9}{'queue':>9}{'load':>9}{'TTFT':>9}")
        for tier, row in agreement["node_accounting"].items():
            print(
                f"{tier:<6}{row['requests']:>9}{row['queue_ms']:>9.1f}{row['load_ms']:>9.1f}"
                f"{row['ttft_ms']:>9.1f}"
            )


if __name__ == "__main__":
    main()
