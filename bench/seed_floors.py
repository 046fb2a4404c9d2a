"""What fetching a seed-scale adapter costs at each tier on this machine: the floors every
seed-scale figure is read against (issue 53).

- **L4** (S3): moto in a network namespace of its own, its link shaped with tc's tbf
  (``--rate-mbit``, default 10 Gbit/s) and every request's first byte delayed
  (``--first-byte-ms``, default 30, like a real GET): first byte of a small GET, and MB/s of a
  whole adapter (``tests/harness/shaped_s3.py``).
- **L3** (local disk), cold and warm: the adapter's files dropped from the page cache with
  ``posix_fadvise(POSIX_FADV_DONTNEED)`` (after ``fsync``, so no dirty page stays) before a
  cold read; read again at once for a warm one.
- **L2** (host → engine): vLLM's own add of the adapter from a warm disk (``AsyncLLM``'s
  ``add_lora``), with ``--engine``: the engine starts on the seed base (tens of seconds). And
  what an add does to requests already generating: the longest gap between a running
  stream's tokens while an add is under way, against the median gap (the seed's
  "synchronous on the primary thread"); and the same while a request for an adapter not yet
  in the engine runs, its first step loading it (the node's way, ``CacheManager.board``).

Needs the profile: ``manage.py build_demo_assets --profile seed``. Needs root (``ip netns``).

Usage: .venv/bin/python bench/seed_floors.py [--adapters 6] [--engine]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SEED_DIR = ROOT / "var" / "seed"


def drop_from_page_cache(folder: Path) -> None:
    """Make the next read of ``folder``'s files come from the disk, not memory."""
    for path in folder.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_folder(folder: Path) -> tuple[float, float]:
    """Seconds to the first byte of the weights and to the last byte of every file."""
    started = time.perf_counter()
    first = None
    for path in sorted(folder.iterdir(), key=lambda p: p.suffix != ".safetensors"):
        with path.open("rb", buffering=0) as f:
            while chunk := f.read(8 << 20):
                if first is None:
                    first = time.perf_counter() - started
                del chunk
    return first or 0.0, time.perf_counter() - started


def disk_floors(folders: list[Path]) -> dict[str, float]:
    cold, warm, first = [], [], []
    for folder in folders:
        mb = sum(p.stat().st_size for p in folder.iterdir()) / (1 << 20)
        drop_from_page_cache(folder)
        f, seconds = read_folder(folder)
        cold.append(mb / seconds)
        first.append(f * 1000)
        _, seconds = read_folder(folder)
        warm.append(mb / seconds)
    return {
        "cold MB/s": statistics.median(cold),
        "cold first byte ms": statistics.median(first),
        "warm MB/s": statistics.median(warm),
    }


def s3_floors(rate_mbit: int, first_byte_ms: float, size_mb: int) -> dict[str, float]:
    from tests.harness.shaped_s3 import ShapedS3

    with ShapedS3(rate_mbit=rate_mbit, first_byte_ms=first_byte_ms) as s3:
        found = s3.floors(size_mb=size_mb, tries=3)
    return {"first byte ms": found["first_byte_ms"], "MB/s": found["mb_per_s"]}


def engine_floors(folders: list[Path], ranks: dict[str, int]) -> dict[str, float]:
    return asyncio.run(_engine_floors(folders, max(ranks.values())))


async def _stream(llm, request_id: str, arrivals: list[float]) -> None:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=120, temperature=0, ignore_eos=True)
    async for _ in llm.generate("a seed-scale request", params, request_id):
        arrivals.append(time.perf_counter())


async def _add(llm, request, arrivals: list[float], adding: list[float]) -> None:
    while len(arrivals) < 40:  # the stream is well under way
        await asyncio.sleep(0.005)
    adding.append(time.perf_counter())
    await llm.add_lora(request)
    adding.append(time.perf_counter())


async def _cold_request(llm, request) -> None:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    name = f"cold-{request.lora_int_id}"
    async for _ in llm.generate("a cold one", params, name, lora_request=request):
        pass


async def _add_then_request(llm, request, arrivals: list[float], adding: list[float]) -> None:
    """The node's way before: ``add_lora``, awaited, then the request (one token)."""
    while len(arrivals) < 40:
        await asyncio.sleep(0.005)
    adding.append(time.perf_counter())
    await llm.add_lora(request)
    await _cold_request(llm, request)
    adding.append(time.perf_counter())


async def _load_in_step(llm, request, arrivals: list[float], adding: list[float]) -> None:
    """The node's way now (``CacheManager.board``): no add; the request's first step loads
    the adapter."""
    while len(arrivals) < 40:
        await asyncio.sleep(0.005)
    adding.append(time.perf_counter())
    await _cold_request(llm, request)
    adding.append(time.perf_counter())


async def _engine_floors(folders: list[Path], max_rank: int) -> dict[str, float]:
    from vllm import AsyncEngineArgs
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.async_llm import AsyncLLM

    base = SEED_DIR / "base-model"
    args = AsyncEngineArgs(
        model=str(base), tokenizer=str(base), dtype="float32", max_model_len=512,
        kv_cache_memory_bytes=128 << 20, enable_lora=True, max_loras=2,
        max_cpu_loras=len(folders) + 1, max_lora_rank=max_rank, max_num_seqs=8,
        enable_prefix_caching=False,
    )  # fmt: skip
    llm = AsyncLLM.from_engine_args(args)
    try:
        per_mb, stalls, gaps = [], [], []
        ways = {_add_then_request: ([], []), _load_in_step: ([], [])}  # longest step, cold ms
        for i, folder in enumerate(folders, start=1):
            mb = sum(p.stat().st_size for p in folder.iterdir()) / (1 << 20)
            read_folder(folder)  # warm: what is timed is the engine's own add
            three = ((_add, i), (_add_then_request, 1000 + i), (_load_in_step, 2000 + i))
            for way, lora_id in three:
                arrivals: list[float] = []
                adding: list[float] = []
                request = LoRARequest(f"{folder.name}-{lora_id}", lora_id, str(folder))
                await asyncio.gather(
                    _stream(llm, f"s{lora_id}", arrivals), way(llm, request, arrivals, adding)
                )
                pairs = list(itertools.pairwise(arrivals))
                during = [(b - a) * 1000 for a, b in pairs if b >= adding[0] and a <= adding[1]]
                if way is _add:
                    per_mb.append((adding[1] - adding[0]) * 1000 / mb)
                    gaps.append(statistics.median((b - a) * 1000 for a, b in pairs))
                    stalls.append(max(during, default=0.0))
                else:
                    ways[way][0].append(max(during, default=0.0))
                    ways[way][1].append((adding[1] - adding[0]) * 1000)
                await llm.remove_lora(lora_id)
        return {
            "add ms per MB": statistics.median(per_mb),
            "step ms": statistics.median(gaps),
            "longest step during an add ms": statistics.median(stalls),
            "add, then a cold request: its ms": statistics.median(ways[_add_then_request][1]),
            "longest step meanwhile ms": statistics.median(ways[_add_then_request][0]),
            "a cold request loaded by its step: its ms": statistics.median(ways[_load_in_step][1]),
            "longest step then ms": statistics.median(ways[_load_in_step][0]),
        }
    finally:
        llm.shutdown()
        del llm  # now, not in the interpreter's exit (vLLM's __del__ shuts down again)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", type=int, default=6)
    parser.add_argument("--rate-mbit", type=int, default=10_000)
    parser.add_argument("--first-byte-ms", type=float, default=30.0)
    parser.add_argument("--engine", action="store_true")
    args = parser.parse_args()
    build = SEED_DIR / "BUILD.json"
    if not build.exists():
        sys.exit("no seed profile: run manage.py build_demo_assets --profile seed first")
    built = json.loads(build.read_text())
    ranks = dict(zip(sorted(built["sizes"]), built["ranks"], strict=True))  # seed-000 …
    names = sorted(ranks)[: args.adapters]
    folders = [SEED_DIR / "adapters" / name for name in names]
    sizes = [sum(p.stat().st_size for p in f.iterdir()) / (1 << 20) for f in folders]
    print(f"{len(folders)} seed adapters, {min(sizes):.0f}-{max(sizes):.0f} MB")
    rows = {
        f"L4 S3 ({args.rate_mbit} Mbit/s, {args.first_byte_ms:.0f} ms)": s3_floors(
            args.rate_mbit, args.first_byte_ms, round(statistics.median(sizes))
        ),
        "L3 disk": disk_floors(folders),
    }
    if args.engine:
        rows["L2 engine add (vLLM)"] = engine_floors(folders, ranks)
    for tier, figures in rows.items():
        print(f"{tier:<34}" + "  ".join(f"{k} {v:.1f}" for k, v in figures.items()))
    mb = statistics.median(sizes)
    s3 = rows[next(iter(rows))]
    print(
        f"\na median adapter ({mb:.0f} MB): L4 {s3['first byte ms'] + mb / s3['MB/s'] * 1000:.0f} "
        f"ms, L3 cold {mb / rows['L3 disk']['cold MB/s'] * 1000:.0f} ms, L3 warm "
        f"{mb / rows['L3 disk']['warm MB/s'] * 1000:.0f} ms"
        + (
            f", L2 add {mb * rows['L2 engine add (vLLM)']['add ms per MB']:.0f} ms"
            if args.engine
            else ""
        )
    )


if __name__ == "__main__":
    main()
