"""Noisy neighbours: one tenant floods the engine; what do the others get? The serving node
(fair admission, apps/serving/fairness.py) vs. stock vLLM's OpenAI server, with a second
stock server as the A/A column.

Three tenants, each with adapters of its own (published through a throwaway SQLite control
plane for the node; static ``--lora-modules`` of the same weights for stock vLLM):
- **quiet** (standard): 2 concurrent callers, a short prompt, ``max_tokens`` 32, one adapter;
- **noisy** (standard): 32 concurrent callers, a long prompt, ``max_tokens`` 256, four
  adapters, a rate limit it never reaches;
- **batch** (the batch tier, weight ¼): 16 concurrent callers like noisy's, one adapter,
  arriving ``--seconds`` into the flood.

Per server, one at a time (the others idle), the order rotated per repetition so each goes
first once in three: quiet alone, noisy alone (``--seconds`` each), then the flood (noisy and
quiet from the start, batch from ``--seconds``, then 10 s for every seat to turn over and two
10 s windows). Every streamed token event counts as one token (vLLM streams one per step and
request). Printed per server: quiet's TTFT p50/p95 and tokens/s alone and under the flood (the
ratio; p95 also before and after batch arrives), noisy's tokens/s under the flood against
alone, the total tokens/s, and each tenant's share of the tokens in the two windows, against
its weighted share among the backlogged tenants.

The reference, on the stock server after its own phases: quiet's p95 TTFT beside a full batch
of noisy's (max_num_seqs - 2 callers), with a seat always free and its requests first in
vLLM's priority order (they send ``priority: -1``) — the best any admission can do for
quiet's first token on this engine without cutting running streams.

All servers get the same engine arguments (``EngineSettings``: max_num_seqs is the node's
seats plus its fair-share headroom, the priority policy, max_num_batched_tokens; 8 device
slots, so that six adapters fit: the cache is not what is measured here).
``--headroom-variant`` adds node-h0: the node with as many ordinary seats and no headroom (its
fair order and the priority inside the engine only).

Usage: .venv/bin/python bench/noisy_neighbour.py [--reps 3] [--seconds 20] [--headroom-variant]
"""

from __future__ import annotations

import argparse
import asyncio
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

from bench.load_mix import SERVERS, rotation  # noqa: E402
from bench.node_overhead import free_port, pct, prepare, stop_all, wait_ready  # noqa: E402

WINDOW_S = 10.0
# Shares are read from this long after the batch tenant arrives: a generation of noisy's lasts
# ~8 s under the flood, so by then every seat has turned over once since it came.
SETTLE_S = 10.0


@dataclass(frozen=True)
class Load:
    tenant: str
    callers: int
    max_tokens: int
    models: tuple[str, ...]
    long: bool


LOADS = {
    "quiet": Load("quiet", 2, 32, ("quiet-0",), long=False),
    "noisy": Load("noisy", 32, 256, ("noisy-0", "noisy-1", "noisy-2", "noisy-3"), long=True),
    "batch": Load("batch", 16, 256, ("batch-0",), long=True),
}
PRIORITY = {"quiet": 1, "noisy": 1, "batch": 0}  # Tenant.priority: standard, standard, batch


@dataclass
class Seen:
    """What one tenant's callers saw in a phase."""

    ttft: list[float] = field(default_factory=list)  # ms
    sent: list[float] = field(default_factory=list)  # when each of those requests was sent
    gaps: list[float] = field(default_factory=list)  # ms between a stream's tokens: a step
    tokens: list[float] = field(default_factory=list)  # arrival time of each token event
    errors: int = 0


def publish(work: Path) -> tuple[dict[str, str], dict[str, Path]]:
    """The three tenants, their keys, adapters and aliases; returns tenant -> key and
    alias -> the folder stock vLLM loads the same weights from."""
    from django.conf import settings
    from django.contrib.auth.models import User

    from apps.demo.assets import build_extra_adapters
    from apps.demo.management.commands.seed_demo import publish_folder
    from apps.registry import aliases
    from apps.registry.models import VersionState
    from apps.tenants import services as tenants
    from apps.tenants.auth import principal_for_user
    from apps.tenants.choices import TenantRole
    from apps.tenants.models import Quota

    alice = User.objects.get(username="alice")
    owner, reviewer = (
        principal_for_user(alice),
        principal_for_user(User.objects.get(username="rita")),
    )
    extra = build_extra_adapters(demo_dir=Path(settings.LORAHUB_DEMO_DIR), count=6)
    keys, folders = {}, {}
    for slug, load in LOADS.items():
        tenant = tenants.create_tenant(slug=slug, name=slug, priority=PRIORITY[slug])
        tenants.add_member(tenant=tenant, user=alice, role=TenantRole.ADMIN)
        owner = principal_for_user(alice)  # with the new membership
        # the benchmark's load, not a tenant's rate, is what is measured
        Quota.objects.update_or_create(
            tenant=tenant, defaults={"requests_per_minute": 1_000_000, "max_warm_adapters": 8}
        )
        for name in load.models:
            folder = extra[len(folders)]
            row = publish_folder(tenant, owner, reviewer, name, "1", folder)
            assert row.state == VersionState.APPROVED, row.rejection_reason
            aliases.set_alias(
                principal=owner, tenant=tenant, name=name, version_id=row.pk, reason=""
            )
            folders[name] = folder
        keys[slug] = tenants.issue_api_key(tenant=tenant, name="bench", actor=None)[1]
    return keys, folders


def prompts() -> dict[bool, str]:
    from apps.demo import corpus

    short = corpus.completion_prompt(corpus.UNSEEN_PROMPTS[0])
    long = corpus.completion_prompt(" ".join(corpus.UNSEEN_PROMPTS[:6]) * 4)  # 225 tokens
    return {False: short, True: long}


async def caller(
    client, url: str, key: str, load: Load, prompt: str, seen: Seen, end: float, priority: int
):
    i = 0
    while time.perf_counter() < end:
        model = load.models[i % len(load.models)]
        i += 1
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": load.max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
        if priority:  # stock vLLM's own field (the node refuses it)
            body["priority"] = priority
        started, first = time.perf_counter(), None
        last = started
        try:
            async with asyncio.timeout(max(end - time.perf_counter(), 0.01)):
                async with client.stream(
                    "POST", f"{url}/v1/completions", json=body,
                    headers={"Authorization": f"Bearer {key}"},
                ) as response:  # fmt: skip
                    if response.status_code != 200:
                        await response.aread()
                        seen.errors += 1
                        await asyncio.sleep(0.1)
                        continue
                    async for line in response.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        if any(c.get("text") for c in json.loads(line[6:])["choices"]):
                            now = time.perf_counter()
                            seen.tokens.append(now)
                            if first is None:
                                first = now
                                seen.ttft.append((now - started) * 1000)
                                seen.sent.append(started)
                            else:
                                seen.gaps.append((now - last) * 1000)
                            last = now
        except TimeoutError:
            return  # the phase ended under this request: it is not counted as finished


async def phase(
    url: str,
    keys: dict[str, str],
    plan: dict[str, float],
    seconds: float,
    callers: dict[str, int] | None = None,
    priority: dict[str, int] | None = None,
):
    """``plan``: tenant -> when (s after the start) its callers begin; ``callers``: a tenant's
    number of callers where not its load's; ``priority``: what a tenant's requests ask of
    vLLM's priority policy (stock only). Returns what each saw, and the start time."""
    import httpx

    texts = prompts()
    seen = {tenant: Seen() for tenant in plan}
    start = time.perf_counter()
    end = start + seconds
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def begin(tenant: str, delay: float) -> None:
            await asyncio.sleep(delay)
            load = LOADS[tenant]
            key = keys.get(tenant, "none")
            await asyncio.gather(
                *(
                    caller(
                        client,
                        url,
                        key,
                        load,
                        texts[load.long],
                        seen[tenant],
                        end,
                        (priority or {}).get(tenant, 0),
                    )
                    for _ in range((callers or {}).get(tenant, load.callers))
                )
            )

        await asyncio.gather(*(begin(t, d) for t, d in plan.items()))
    return seen, start


def tps(seen: Seen, start: float, seconds: float, since: float = 0.0) -> float:
    return sum(1 for t in seen.tokens if t >= start + since) / (seconds - since)


def measure(url: str, keys: dict[str, str], seconds: float, free_seat: int = 0) -> dict:
    """The three phases; with ``free_seat`` (the engine's max_num_seqs), a fourth: the flood
    with noisy's callers cut so that a seat is always free for quiet's two, and quiet's
    requests first in vLLM's priority order — the best quiet's first token can do beside a
    full batch when no running stream is cut (the reference)."""
    quiet_alone, start = asyncio.run(phase(url, keys, {"quiet": 0}, seconds))
    noisy_alone, n_start = asyncio.run(phase(url, keys, {"noisy": 0}, seconds))
    flood_s = seconds + SETTLE_S + 2 * WINDOW_S
    flood, f_start = asyncio.run(
        phase(url, keys, {"noisy": 0, "quiet": 0, "batch": seconds}, flood_s)
    )
    windows = []
    t = f_start + seconds + SETTLE_S
    while t + WINDOW_S <= f_start + flood_s + 1e-6:
        counts = {k: sum(1 for x in s.tokens if t <= x < t + WINDOW_S) for k, s in flood.items()}
        windows.append(counts)
        t += WINDOW_S
    half = f_start + seconds
    sent = list(zip(flood["quiet"].ttft, flood["quiet"].sent, strict=True))
    before, after = [v for v, t in sent if t < half], [v for v, t in sent if t >= half]
    row: dict = {}
    if free_seat:
        callers = {"noisy": free_seat - LOADS["quiet"].callers}
        plan = {"noisy": 0, "quiet": 0}
        reference, _ = asyncio.run(phase(url, keys, plan, seconds, callers, {"quiet": -1}))
        row["quiet free-seat p95"] = pct(reference["quiet"].ttft, 0.95)
    return row | {
        "quiet alone p50": pct(quiet_alone["quiet"].ttft, 0.5),
        "quiet alone p95": pct(quiet_alone["quiet"].ttft, 0.95),
        "step in flood p50": pct(flood["noisy"].gaps, 0.5),
        "quiet flood p50": pct(flood["quiet"].ttft, 0.5),
        "quiet flood p95": pct(flood["quiet"].ttft, 0.95),
        "quiet flood p95 1st half": pct(before, 0.95),
        "quiet flood p95 2nd half": pct(after, 0.95),
        "quiet alone tok/s": tps(quiet_alone["quiet"], start, seconds),
        "quiet flood tok/s": tps(flood["quiet"], f_start, flood_s),
        "noisy alone tok/s": tps(noisy_alone["noisy"], n_start, seconds),
        "noisy flood tok/s": tps(flood["noisy"], f_start, flood_s),
        "total flood tok/s": sum(tps(s, f_start, flood_s) for s in flood.values()),
        "windows": windows,
        "errors": sum(s.errors for s in (*quiet_alone.values(), *noisy_alone.values(),
                                         *flood.values())),
    }  # fmt: skip


def start_servers(
    work: Path, env: dict[str, str], folders: dict[str, Path], servers: tuple[str, ...]
):
    from apps.serving.node.engine import EngineSettings

    engine = EngineSettings.from_django_settings()
    ports = {name: free_port() for name in servers}
    stock_env = {k: v for k, v in os.environ.items() if not k.startswith("LORAHUB_")}
    # node-h0: the node with no headroom and as many ordinary seats (the same max_num_seqs):
    # fair order and priority inside the engine only
    no_headroom = {
        **env,
        "LORAHUB_NODE_MAX_CONCURRENT": str(engine.max_num_seqs),
        "LORAHUB_NODE_FAIR_HEADROOM": "0",
        "LORAHUB_NODE_CACHE_DIR": str(work / "node-cache-h0"),
        "LORAHUB_NODE_NAME": "node-h0",
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, "manage.py", "runnode", "--port", str(ports[name])],
            cwd=ROOT, env=env if name == "node" else no_headroom,
            stdout=(work / f"{name}.log").open("wb"), stderr=subprocess.STDOUT,
        )
        for name in servers
        if name.startswith("node")
    } | {
        **{
            name: subprocess.Popen(
                engine.stock_server_argv(ports[name], folders), cwd=ROOT, env=stock_env,
                stdout=(work / f"{name}.log").open("wb"), stderr=subprocess.STDOUT,
            )
            for name in ("stock", "stock-b")
        },
    }  # fmt: skip
    return engine, procs, {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20, help="each phase alone; flood 2x")
    parser.add_argument(
        "--headroom-variant",
        action="store_true",
        help="also node-h0: no headroom seats, as many ordinary ones (priority inside only)",
    )
    args = parser.parse_args()
    servers = (*SERVERS, "node-h0") if args.headroom_variant else SERVERS
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="lorahub-noisy-") as tmp:
        work = Path(tmp)
        config = (ROOT / "lorahub" / "cache.yaml").read_text()
        (work / "cache.yaml").write_text(config.replace("max_adapters: 4 ", "max_adapters: 8 "))
        os.environ["LORAHUB_CACHE_CONFIG"] = str(work / "cache.yaml")
        env, _, _ = prepare(work)
        keys, folders = publish(work)
        engine, procs, urls = start_servers(work, env, folders, servers)
        results: dict[str, list[dict]] = {name: [] for name in servers}
        try:
            for name, proc in procs.items():
                node = name.startswith("node")
                wait_ready(urls[name], "/healthz" if node else "/health", proc, name)
            for name in servers:  # warm-up: every adapter once
                asyncio.run(phase(urls[name], keys if name.startswith("node") else {},
                                  {"batch": 0}, 3))  # fmt: skip
                asyncio.run(phase(urls[name], keys if name.startswith("node") else {},
                                  {"noisy": 0}, 3))  # fmt: skip
            for rep in range(args.reps):
                for name in rotation(rep, servers):
                    free_seat = engine.max_num_seqs if name == "stock" else 0
                    row = measure(urls[name], keys if name.startswith("node") else {},
                                  args.seconds, free_seat)  # fmt: skip
                    results[name].append(row)
                    print(f"rep {rep + 1} {name:<8}" + "  ".join(
                        f"{k} {v:.1f}" for k, v in row.items() if isinstance(v, float)
                    ), flush=True)  # fmt: skip
        finally:
            stop_all(procs.values())
    report(results, args, engine, servers)


def share_rows(windows: list[dict]) -> list[tuple[str, float, float]]:
    """Per tenant: its share of the tokens over the windows, and its weighted share among
    the backlogged tenants (noisy and batch; quiet asks for less than its share)."""
    from apps.tenants.shares import weight_of

    total = sum(sum(w.values()) for w in windows) or 1
    backlogged = ("noisy", "batch")
    weights = {t: weight_of(PRIORITY[t]) for t in backlogged}
    quiet = sum(w.get("quiet", 0) for w in windows) / total
    rows = [("quiet", quiet, float("nan"))]
    for tenant in backlogged:
        share = sum(w.get(tenant, 0) for w in windows) / total
        rows.append((tenant, share, (1 - quiet) * weights[tenant] / sum(weights.values())))
    return rows


def report(results: dict[str, list[dict]], args, engine, servers: tuple[str, ...]) -> None:
    med = {name: {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "windows"}
           for name, rows in results.items()}  # fmt: skip
    free_seat = med["stock"]["quiet free-seat p95"] / med["stock"]["quiet alone p95"]
    print(
        f"\nNoisy neighbours: {args.reps} repetitions, phases of {args.seconds:.0f} s (flood "
        f"{args.seconds + SETTLE_S + 2 * WINDOW_S:.0f} s), max_num_seqs={engine.max_num_seqs}, "
        f"max_num_batched_tokens={engine.max_num_batched_tokens}, "
        f"max_loras={engine.max_loras}; medians\n"
    )
    head = ("quiet alone p50", "quiet alone p95", "quiet flood p50", "quiet flood p95",
            "quiet flood p95 1st half", "quiet flood p95 2nd half", "step in flood p50",
            "quiet alone tok/s", "quiet flood tok/s", "noisy alone tok/s", "noisy flood tok/s",
            "total flood tok/s", "errors")  # fmt: skip
    print(f"{'':<26}" + "".join(f"{n:>10}" for n in servers))
    for key in head:
        print(f"{key:<26}" + "".join(f"{med[n][key]:>10.1f}" for n in servers))
    print()
    stock_total = med["stock"]["total flood tok/s"]
    for label, value in (
        ("quiet p95 TTFT flood/alone", lambda m: m["quiet flood p95"] / m["quiet alone p95"]),
        # arriving at a random moment, a request waits for the step in progress, then its
        # own: its p95 is at least ~2 steps of the flood's batch, whatever the order
        ("2 flood steps / alone p95", lambda m: 2 * m["step in flood p50"] / m["quiet alone p95"]),
        ("noisy tok/s flood/alone", lambda m: m["noisy flood tok/s"] / m["noisy alone tok/s"]),
        ("total tok/s / stock's", lambda m: m["total flood tok/s"] / stock_total),
    ):
        print(f"{label:<26}" + "".join(f"{value(med[n]):>10.2f}" for n in servers))
    print(
        f"\nreference: quiet's p95 TTFT beside a full batch of noisy's, with a seat always free "
        "and its requests first in vLLM's priority order "
        f"(stock, {engine.max_num_seqs - 2} noisy callers): "
        f"{med['stock']['quiet free-seat p95']:.1f} ms, {free_seat:.2f}x its p95 alone"
    )
    print("\ntoken shares in the flood's second half (batch present), all windows of all reps")
    print(f"{'tenant':<10}" + "".join(f"{n + ' share':>14}{'fair':>7}" for n in servers))
    rows = {n: share_rows([w for r in results[n] for w in r["windows"]]) for n in servers}
    for i, (tenant, _, _) in enumerate(rows["node"]):
        print(
            f"{tenant:<10}"
            + "".join(f"{rows[n][i][1]:>14.3f}{rows[n][i][2]:>7.3f}" for n in servers)
        )
    print("\nper 10 s window (node): " + "; ".join(
        " ".join(f"{t} {c}" for t, c in w.items()) for r in results["node"] for w in r["windows"]
    ))  # fmt: skip


if __name__ == "__main__":
    main()
