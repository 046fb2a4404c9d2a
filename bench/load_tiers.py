"""Adapter load time per source tier, split into steps, each against its floor (same run).

* L4→L3: fetch (GET from the S3 server, write, fsync) and verify (sha256 of every file, the
  manifest signature, the BLAKE3 seal) — floor: a bare GET of the same bytes.
* L3→L2: the sealed-file check and the engine add (vLLM reads, parses and installs the
  adapter in its host cache) — floor: reading the same files and parsing the safetensors.
* L2→L1: activation in a device slot, seen as the extra TTFT of a warm adapter's first
  request over a hot one's.
* The integrity check at the size of a real adapter (rank-16 q/k/v/o for Llama-3-8B, bf16,
  27.3 MB): the seal check plus read+parse against read+parse alone.
* Hot-request TTFT while cold loads run, against hot TTFT with none running.

Real parts: moto's S3 server over HTTP, the vLLM engine on the demo model, the node's own
``CacheManager``. Usage: .venv/bin/python bench/load_tiers.py [--repeats 20] [--hot 150]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lorahub.settings")

BIG = "llama3-8b-r16"  # the synthetic full-size adapter: disk tier and floors only


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def med(values: list[float]) -> float:
    return statistics.median(values)


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_big_adapter(folder: Path) -> None:
    """27.3 MB: rank 16 on q/k/v/o of all 32 layers of Llama-3-8B, bf16 (seeded)."""
    import json

    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(1)
    tensors = {}
    for layer in range(32):
        for module, out in (("q", 4096), ("k", 1024), ("v", 1024), ("o", 4096)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}_proj"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(16, 4096, generator=gen).bfloat16()
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, 16, generator=gen).bfloat16()
    save_file(tensors, folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").write_text(json.dumps({"r": 16, "peft_type": "LORA"}))


def read_and_parse(folder: Path) -> None:
    from safetensors.torch import load

    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        if path.suffix == ".safetensors":
            load(data)


async def main(repeats: int, hot_samples: int) -> None:
    import django

    django.setup()
    from django.conf import settings

    from apps.demo import corpus
    from apps.demo.assets import build_demo_assets
    from apps.registry import signing
    from apps.registry.signing import sha256_file
    from apps.registry.storage import S3Store
    from apps.serving.cache import download
    from apps.serving.cache.manager import CacheManager, Limits
    from apps.serving.cache.policies import LRU
    from apps.serving.node.engine import Engine, EngineSettings
    from bench.direct import Sampling, complete
    from tests.helpers import signed_version  # how a node sees a signed version

    demo = build_demo_assets(demo_dir=settings.LORAHUB_DEMO_DIR).demo_dir
    work = Path(tempfile.mkdtemp(prefix="lorahub-bench-"))
    write_big_adapter(work / BIG)
    port = free_port()
    # The S3 server is another machine in production; here it shares this machine's cores,
    # so it runs at nice 19 to keep its own CPU use out of the engine's latency.
    moto = subprocess.Popen(
        [
            "nice",
            "-n",
            "10",
            sys.executable,
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    engine = None
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        store = S3Store(
            endpoint=f"http://127.0.0.1:{port}",
            bucket="lorahub-bench",
            region="us-east-1",
            access_key="bench",
            secret_key="bench",
        )
        store.ensure_bucket()
        key = signing.load_private_key(signing.generate_private_key_pem())
        keys: dict[str, str] = {}
        sources = {
            name: demo / "adapters" / name for name in ("support-v1", "support-v2", "legal-v1")
        }
        sources[BIG] = work / BIG
        versions = {}
        for n, (name, folder) in enumerate(sources.items(), start=1):
            prefix = f"bench/{name}"
            versions[name], keys = signed_version(
                store,
                folder,
                prefix,
                key,
                tenant_slug="bench",
                alias=name,
                adapter_id=name,
                version_id=n,
                rank=16,
            )

        engine = Engine(
            EngineSettings(
                model_dir=demo / "base-model",
                served_model_name=corpus.BASE_MODEL_NAME,
                base_model_revision=corpus.BASE_MODEL_REVISION,
                max_loras=2,
                max_cpu_loras=4,
                max_lora_rank=16,
            )
        )
        engine.start()
        download.start()
        placement = CacheManager(
            engine=engine,
            store=store,
            root=work / "cache",
            public_keys=lambda: keys,
            policy=LRU(),
            limits=Limits(),
        )
        rows: list[tuple[str, str, list[float], list[float] | None]] = []

        # --- L4 -> L3 ------------------------------------------------------------------
        for name, resolved in versions.items():
            fetch, verify, floor = [], [], []
            for _ in range(repeats):
                placement.evict_from_disk(resolved)
                timings = placement.land(resolved).timings
                fetch.append(timings["fetch_ms"])
                verify.append(timings["verify_ms"])
                floor.append(
                    timed(
                        lambda r=resolved: [
                            store.client.get_object(
                                Bucket=store.bucket, Key=f"{r.storage_prefix}/{f}"
                            )["Body"].read()
                            for f, _, _ in r.files
                        ]
                    )
                )
            rows.append((f"L4→L3 {name}", "fetch  (floor: bare GET)", fetch, floor))
            rows.append((f"L4→L3 {name}", "verify (sha256+sig+seal)", verify, None))

        # --- the integrity check at full size: seal check vs read+parse --------------------
        big = versions[BIG]
        folder = placement.disk.folder(big)
        floor = [timed(lambda: read_and_parse(folder)) for _ in range(repeats)]
        sealed = [timed(lambda: placement.disk.check(big)) for _ in range(repeats)]
        stat_only = [
            timed(lambda: placement.disk.check(big, hash_bytes=False)) for _ in range(repeats)
        ]
        check_plus = [s + f for s, f in zip(sealed, floor, strict=True)]
        rows.append((f"L3 check {BIG}", "seal+read+parse (floor: read+parse)", check_plus, floor))
        rows.append((f"L3 check {BIG}", "seal check alone (BLAKE3)", sealed, None))
        rows.append((f"L3 check {BIG}", "stat-only seal", stat_only, None))
        sha = [
            timed(lambda: [sha256_file(folder / f) for f, _, _ in big.files])
            for _ in range(repeats)
        ]
        rows.append((f"L3 check {BIG}", "sha256 every load (rejected)", sha, floor))

        # --- L3 -> L2 --------------------------------------------------------------------
        prompts = [corpus.completion_prompt(q) for q in corpus.DEMO_PROMPTS]
        sampling = Sampling(max_tokens=4)
        await complete(engine, prompts[0], sampling)  # warm-up
        for name in ("support-v1", "support-v2", "legal-v1"):
            resolved = versions[name]
            check, add, floor = [], [], []
            for _ in range(repeats):
                await placement.unload(resolved.version_id)
                placed = await placement.activate(resolved)
                check.append(placed.timings["check_ms"])
                add.append(placed.timings["add_ms"])
                folder = placement.disk.folder(resolved)
                floor.append(timed(lambda f=folder: read_and_parse(f)))
            rpc = []
            for _ in range(repeats):
                started = time.perf_counter()
                await engine.list_adapters()  # one round trip to the engine core
                rpc.append((time.perf_counter() - started) * 1000)
            floor_rpc = [f + r for f, r in zip(floor, rpc, strict=True)]
            rows.append((f"L3→L2 {name}", "seal check (floor: read+parse)", check, floor))
            rows.append((f"L3→L2 {name}", "engine add (floor: read+parse+RPC)", add, floor_rpc))

        # --- L2 -> L1: activation in a device slot -----------------------------------------
        handles = {}
        for name in ("support-v1", "support-v2", "legal-v1"):
            handles[name] = (await placement.activate(versions[name])).handle
        first, hot = [], []
        for i in range(repeats):
            for name in ("support-v1", "support-v2"):  # these two now hold both slots
                await complete(engine, prompts[i % 6], sampling, adapter=handles[name])
            cold = await complete(engine, prompts[i % 6], sampling, adapter=handles["legal-v1"])
            again = await complete(engine, prompts[i % 6], sampling, adapter=handles["legal-v1"])
            first.append(cold.ttft_ms)
            hot.append(again.ttft_ms)
        rows.append(("L2→L1 legal-v1", "first TTFT (floor: hot TTFT)", first, hot))

        # --- hot TTFT while cold loads run -------------------------------------------------
        hot_handle = handles["support-v1"]

        async def hot_ttfts(n: int) -> list[float]:
            out = []
            for i in range(n):
                result = await complete(engine, prompts[i % 6], sampling, adapter=hot_handle)
                out.append(result.ttft_ms)
            return out

        # Quiet and busy samples alternate, so both see the same machine (it is shared).
        quiet: list[float] = []
        busy: list[float] = []
        loads = 0
        names = ("support-v2", "legal-v1")
        while len(busy) < hot_samples:
            quiet += await hot_ttfts(2)
            resolved = versions[names[loads % 2]]
            await placement.unload(resolved.version_id)
            await asyncio.to_thread(placement.evict_from_disk, resolved)
            load = asyncio.create_task(placement.activate(resolved))  # L4 -> L3 -> L2
            loads += 1
            i = 0
            while not load.done():
                result = await complete(engine, prompts[i % 6], sampling, adapter=hot_handle)
                if not load.done():  # it ran entirely while the load did
                    busy.append(result.ttft_ms)
                i += 1
            await load
            await asyncio.sleep(0.02)
        rows.append(("hot TTFT", f"during {loads} cold loads (floor: quiet)", busy, quiet))

        print(f"\nAdapter load time by tier — {repeats} repeats, medians and p95 in ms")
        print(
            f"{'tier / adapter':<26} {'step':<38} {'p50':>8} {'p95':>8} {'floor':>8} {'x floor':>8}"
        )
        for tier, step, values, base in rows:
            floor_p50 = f"{med(base):8.2f}" if base else f"{'':>8}"
            ratio = f"{med(values) / med(base):7.2f}x" if base else f"{'':>8}"
            print(
                f"{tier:<26} {step:<38} {med(values):8.2f} {pct(values, 0.95):8.2f} "
                f"{floor_p50} {ratio}"
            )
        busy_p95, quiet_p95 = pct(busy, 0.95), pct(quiet, 0.95)
        print(
            f"\nhot TTFT during cold loads: p50 {med(busy) / med(quiet):.2f}x, "
            f"p95 {busy_p95 / quiet_p95:.2f}x of quiet (target <= 1.2x)"
        )
    finally:
        if engine is not None:
            engine.shutdown()
        moto.terminate()
        moto.wait(timeout=10)
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--hot", type=int, default=150, help="hot requests per TTFT sample")
    args = parser.parse_args()
    asyncio.run(main(args.repeats, args.hot))
