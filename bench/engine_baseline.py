"""Engine baseline on the demo model: start-up time, and TTFT for base vs. adapter requests.

Prints one table. The base-model row is the baseline; adapter rows are reported as ratios to it.
Usage: .venv/bin/python bench/engine_baseline.py [--requests 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lorahub.settings")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(engine, prompts, sampling, adapter, n):
    from bench.direct import complete

    ttft, total = [], []
    for i in range(n):
        result = await complete(engine, prompts[i % len(prompts)], sampling, adapter=adapter)
        ttft.append(result.ttft_ms)
        total.append(result.total_ms)
    return ttft, total


async def main(n: int) -> None:
    import django

    django.setup()
    from django.conf import settings

    from apps.demo import corpus
    from apps.demo.assets import build_demo_assets
    from apps.serving.node.engine import AdapterHandle, Engine, EngineSettings
    from bench.direct import Sampling, complete

    demo = build_demo_assets(demo_dir=settings.LORAHUB_DEMO_DIR).demo_dir
    engine = Engine(EngineSettings.from_django_settings())
    started = time.perf_counter()
    engine.start()
    startup = time.perf_counter() - started
    prompts = [corpus.completion_prompt(q) for q in corpus.DEMO_PROMPTS]
    sampling = Sampling(max_tokens=16)
    await measure(engine, prompts, sampling, None, 5)  # warm-up

    rows = []
    base_ttft, base_total = await measure(engine, prompts, sampling, None, n)
    rows.append(("base model", base_ttft, base_total))
    cold = []
    for i, name in enumerate(("support-v1", "support-v2", "legal-v1")):
        handle = AdapterHandle(lora_id=i + 1, name=name, path=demo / "adapters" / name)
        first = await complete(engine, prompts[0], sampling, adapter=handle)
        cold.append(first.ttft_ms)
        ttft, total = await measure(engine, prompts, sampling, handle, n)
        rows.append((f"{name} (hot)", ttft, total))
    rows.append(("first use of an adapter", cold, cold))
    engine.shutdown()

    base_median = statistics.median(base_ttft)
    print(f"\nengine start-up: {startup:.1f} s   requests per row: {n}   max_tokens: 16\n")
    print(f"{'request':<26}{'TTFT p50 ms':>12}{'p95':>9}{'p99':>9}{'x base':>9}{'total p50':>11}")
    for label, ttft, total in rows:
        print(
            f"{label:<26}{statistics.median(ttft):>12.2f}{pct(ttft, 0.95):>9.2f}"
            f"{pct(ttft, 0.99):>9.2f}{statistics.median(ttft) / base_median:>9.2f}"
            f"{statistics.median(total):>11.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=50)
    asyncio.run(main(parser.parse_args().requests))
