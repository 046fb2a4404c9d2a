"""The serving node's added latency: TTFT through the node vs. straight through vLLM.

One run, same machine, same demo model, same prompt, same hot adapter:
  1. a node process (``manage.py runnode``) answers N streamed completions over HTTP; TTFT is
     measured by the client from sending the request to the first streamed token;
  2. the node is stopped and an in-process engine answers the same N requests through vLLM's
     Python API; TTFT is from the call to the first token.
The ratio of the medians is the node's overhead (auth, alias resolution, admission,
placement, HTTP and SSE). Target: <= 1.10x, or <= 5 ms added, whichever is larger.

Uses its own SQLite database and local object store in a temporary folder, so it needs no
services. Usage: .venv/bin/python bench/node_overhead.py [--requests 60]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(url: str, path: str, proc: subprocess.Popen, what: str) -> None:
    """Until ``url + path`` answers 200 (a server starting its engine: minutes at most)."""
    import httpx

    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start")
        time.sleep(0.5)


def stop_all(procs) -> None:
    """SIGTERM to every server process, then wait for each (a minute at most)."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=60)


def start_node(env: dict[str, str], log: Path | None = None) -> tuple[subprocess.Popen, str]:
    """A node process (``manage.py runnode``) on ``env``'s control plane, once it is ready;
    its output goes to ``log`` (default: nowhere). Returns the process and its URL."""
    port = free_port()
    out = log.open("wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runnode", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, "/healthz", proc, "the node")
    except BaseException:
        proc.terminate()
        raise
    return proc, url


def prepare(work: Path, **extra: str) -> tuple[dict[str, str], str, str]:
    """A throwaway control plane: tenant, key, the support-v1 demo adapter approved + aliased.
    ``extra``: more settings (environment variables) for it and the servers it starts."""
    env = {
        **os.environ,
        "LORAHUB_VAR_DIR": str(work),
        "LORAHUB_DEMO_DIR": str(ROOT / "var" / "demo"),
        "LORAHUB_SIGNING_KEY_FILE": str(work / "signing.pem"),
        "LORAHUB_NODE_CACHE_DIR": str(work / "node-cache"),
        "DJANGO_SETTINGS_MODULE": "lorahub.settings",
    }
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "LORAHUB_S3_ENDPOINT", "LORAHUB_EVENTS_URL"):
        env.pop(name, None)
    env.update(extra)
    os.environ.clear()
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("build_demo_assets")
    call_command("init_signing_key")
    call_command("seed_demo", stdout=open(os.devnull, "w"))  # noqa: SIM115
    from apps.tenants import services as tenant_services
    from apps.tenants.models import Tenant

    _, key = tenant_services.issue_api_key(
        tenant=Tenant.objects.get(slug="acme"), name=f"bench-{time.time_ns()}", actor=None
    )
    return env, key, "support"


def through_node(env: dict[str, str], key: str, alias: str, prompt: str, n: int) -> list[float]:
    import httpx

    proc, url = start_node(env)
    try:
        body = {"model": alias, "prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True}
        headers = {"Authorization": f"Bearer {key}"}
        ttfts = []
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            for i in range(n + 5):
                started = time.perf_counter()
                with client.stream("POST", "/v1/completions", json=body) as response:
                    first = None
                    for line in response.iter_lines():
                        if first is None and line.startswith("data: {") and '"text":""' not in line:
                            first = (time.perf_counter() - started) * 1000
                    tier = response.headers.get("x-lorahub-cache-tier")
                if i >= 5:  # the first requests load the adapter and warm up
                    assert tier == "L1", tier
                    ttfts.append(first)
        return ttfts
    finally:
        proc.terminate()
        proc.wait(timeout=60)


async def direct(prompt: str, n: int, adapter_dir: Path) -> list[float]:
    from apps.serving.node.engine import AdapterHandle, Engine, EngineSettings
    from bench.direct import Sampling, complete

    engine = Engine(EngineSettings.from_django_settings())
    engine.start()
    handle = AdapterHandle(lora_id=1, name="support-v1", path=adapter_dir)
    sampling = Sampling(max_tokens=8)
    ttfts = []
    try:
        for i in range(n + 5):
            result = await complete(engine, prompt, sampling, adapter=handle)
            if i >= 5:
                ttfts.append(result.ttft_ms)
    finally:
        engine.shutdown()
    return ttfts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=60)
    n = parser.parse_args().requests
    with tempfile.TemporaryDirectory(prefix="lorahub-bench-") as tmp:
        env, key, alias = prepare(Path(tmp))
        from apps.demo import corpus

        prompt = corpus.completion_prompt(corpus.UNSEEN_PROMPTS[0])
        node = through_node(env, key, alias, prompt, n)
        engine = asyncio.run(direct(prompt, n, ROOT / "var" / "demo" / "adapters" / "support-v1"))
    rows = [("vLLM Python API (baseline)", engine), ("through the node (HTTP+SSE)", node)]
    base = statistics.median(engine)
    print(f"\nTTFT, hot adapter, {n} requests each, max_tokens=8, one request at a time\n")
    print(f"{'path':<30}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'x baseline':>12}")
    for label, values in rows:
        print(
            f"{label:<30}{statistics.median(values):>9.2f}{pct(values, 0.95):>9.2f}"
            f"{pct(values, 0.99):>9.2f}{statistics.median(values) / base:>12.2f}"
        )
    added = statistics.median(node) - base
    target = max(base * 0.10, 5.0)
    print(
        f"\nadded by the node (median): {added:.2f} ms; target <= {target:.2f} ms "
        f"(1.10x or 5 ms, whichever is larger): {'met' if added <= target else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
