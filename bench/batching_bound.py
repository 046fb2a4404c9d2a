"""How much an admission order can gain over vLLM's own when a batch may hold at most
``max_loras`` adapters: a step model of the engine, run on a bench's own request sequence.

``bench/many_adapters.py`` measures the node and stock vLLM side by side; this asks what any
scheduler could do on the same sequence. The model: C closed-loop clients take the sequence in
order; every request needs ``tokens`` engine steps (its prefill gives the first token); a step
advances every request it runs by one token and costs ``base_ms + per_request_ms * batch``;
a step runs requests of at most ``slots`` adapters. Loads cost nothing (measured: about 1 ms
per load on this machine, on both sides). Three schedulers:

- **vLLM**: its V1 scheduler, first come first served; a waiting request whose adapter would
  be one too many for the batch is skipped, the next one looked at;
- **gate**: the node's ``DeviceGate`` (``apps/serving/cache/gate.py``): requests for adapters in
  the batch join it; a free slot goes to the adapter with the most requests waiting, or to
  one waiting past the starvation bound, and then the adapter that frees its slot first
  takes no newcomers until it has;
- **best groups**: at every step, the ``slots`` adapters with the most requests outstanding,
  pausing every other request for free. vLLM cannot pause a running request; it stands for
  the best an admission order could hope for.

The step costs come from a run's one-adapter points (``ceiling``: every request on one
adapter, so the batch is the concurrency): two concurrencies give the base and per-request
cost. ``bench/many_adapters.py`` prints this table after its own, calibrated from that run;
alone: ``.venv/bin/python bench/batching_bound.py --ceiling 8:37.3 32:68.2`` (req/s of the
one-adapter points at C=8 and C=32).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from apps.serving.cache.gate import HOLD_EWMA, STARVATION_HOLDS, STARVATION_S  # noqa: E402


@dataclass(frozen=True)
class StepCost:
    base_ms: float
    per_request_ms: float

    def __call__(self, batch: int) -> float:
        return self.base_ms + self.per_request_ms * batch

    @classmethod
    def from_ceiling(cls, points: dict[int, float], tokens: int) -> StepCost:
        """From one-adapter points, concurrency -> req/s: at concurrency C the batch is C
        and a step takes ``1000 C / (tokens * req/s)`` ms; a line through the lowest and the
        highest concurrency (one point: a cost per step that does not grow with the batch)."""
        step = {c: 1000 * c / (tokens * rps) for c, rps in points.items()}
        low, high = min(step), max(step)
        slope = (step[high] - step[low]) / (high - low) if high > low else 0.0
        slope = max(slope, 0.0)
        return cls(base_ms=max(step[low] - slope * low, 0.0), per_request_ms=slope)


@dataclass
class Request:
    arrived_ms: float
    adapter: str
    left: int  # steps still to run
    admitted_ms: float | None = None  # in the batch since (None: waiting)
    ttft_ms: float | None = None  # arrival to the end of its first step


@dataclass(frozen=True)
class Outcome:
    req_per_s: float
    mean_batch: float
    ttft_p95_ms: float


# A scheduler picks, before each step, which outstanding requests the step runs.
Scheduler = Callable[[list[Request], float, int, "SchedulerState"], list[Request]]


@dataclass
class SchedulerState:
    """What a scheduler keeps between steps: the gate's mean time in the engine."""

    hold_ms: float | None = None

    def starvation_ms(self) -> float:
        return max(STARVATION_S * 1000, STARVATION_HOLDS * (self.hold_ms or 0.0))


def vllm(outstanding: list[Request], now: float, slots: int, _: SchedulerState) -> list[Request]:
    batch = [r for r in outstanding if r.admitted_ms is not None]
    adapters = {r.adapter for r in batch}
    for request in outstanding:  # in arrival order
        if request.admitted_ms is None and (request.adapter in adapters or len(adapters) < slots):
            adapters.add(request.adapter)
            request.admitted_ms = now
            batch.append(request)
    return batch


def gate(
    outstanding: list[Request], now: float, slots: int, state: SchedulerState
) -> list[Request]:
    batch = [r for r in outstanding if r.admitted_ms is not None]
    adapters = {r.adapter for r in batch}
    waiting: dict[str, list[Request]] = {}
    for request in outstanding:
        if request.admitted_ms is None:
            waiting.setdefault(request.adapter, []).append(request)

    def admit(adapter: str) -> None:
        for request in waiting.pop(adapter):
            request.admitted_ms = now
            batch.append(request)
        adapters.add(adapter)

    def next_adapter() -> str | None:
        outside = {a: q for a, q in waiting.items() if a not in adapters}
        if not outside:
            return None
        starving = [
            (q[0].arrived_ms, a)
            for a, q in outside.items()
            if now - q[0].arrived_ms >= state.starvation_ms()
        ]
        if starving:
            return min(starving)[1]
        return max(outside, key=lambda a: (len(outside[a]), -outside[a][0].arrived_ms))

    choice = next_adapter()
    starving = (
        choice is not None
        and now - waiting[choice][0].arrived_ms >= state.starvation_ms()
        and len(adapters) >= slots
    )
    draining = None  # while one starves, the adapter that frees first takes no newcomers
    if starving:
        newest: dict[str, float] = {}
        for request in batch:
            newest[request.adapter] = max(
                newest.get(request.adapter, 0.0), request.admitted_ms or 0.0
            )
        draining = min(newest, key=lambda a: newest[a])
    for adapter in [a for a in waiting if a in adapters and a != draining]:
        admit(adapter)
    while len(adapters) < slots and (choice := next_adapter()) is not None:
        admit(choice)
    return batch


def best_groups(
    outstanding: list[Request], now: float, slots: int, _: SchedulerState
) -> list[Request]:
    groups: dict[str, list[Request]] = {}
    for request in outstanding:
        groups.setdefault(request.adapter, []).append(request)
    chosen = sorted(groups, key=lambda a: (len(groups[a]), -groups[a][0].arrived_ms))[-slots:]
    batch = [r for a in chosen for r in groups[a]]
    for request in batch:
        if request.admitted_ms is None:
            request.admitted_ms = now
    return batch


SCHEDULERS: dict[str, Scheduler] = {"vLLM": vllm, "gate": gate, "best groups": best_groups}


def simulate(
    sequence: Sequence[str],
    concurrency: int,
    scheduler: Scheduler,
    cost: StepCost,
    *,
    slots: int = 4,
    tokens: int = 16,
) -> Outcome:
    """Run ``sequence`` through the model with ``concurrency`` closed-loop clients."""
    pending = iter(sequence)
    outstanding: list[Request] = []
    now, done, batch_sum, steps = 0.0, 0, 0, 0
    state = SchedulerState()
    ttfts: list[float] = []

    def take() -> None:
        adapter = next(pending, None)
        if adapter is not None:
            outstanding.append(Request(arrived_ms=now, adapter=adapter, left=tokens))

    for _ in range(concurrency):
        take()
    while outstanding:
        batch = scheduler(outstanding, now, slots, state)
        batch_sum, steps = batch_sum + len(batch), steps + 1
        now += cost(len(batch))
        for request in batch:
            request.left -= 1
            if request.ttft_ms is None:
                request.ttft_ms = now - request.arrived_ms
                ttfts.append(request.ttft_ms)
            if request.left == 0:
                outstanding.remove(request)
                done += 1
                held = now - (request.admitted_ms or now)
                state.hold_ms = (
                    held
                    if state.hold_ms is None
                    else (state.hold_ms + HOLD_EWMA * (held - state.hold_ms))
                )
                take()
    ttfts.sort()
    return Outcome(
        req_per_s=1000 * done / now if now else 0.0,
        mean_batch=batch_sum / steps if steps else 0.0,
        ttft_p95_ms=ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))] if ttfts else 0.0,
    )


def table(
    sequence: Sequence[str],
    concurrencies: Sequence[int],
    cost: StepCost,
    *,
    slots: int,
    tokens: int,
    measured: dict[int, dict[str, float]] | None = None,
) -> list[str]:
    """The model's req/s, mean batch and TTFT p95 per scheduler, against vLLM's, per
    concurrency; with ``measured`` (concurrency -> server -> req/s), the run's own beside
    them (vLLM's row is stock's, the gate's the node's, one adapter's the ceiling's)."""
    lines = [
        f"step model: {cost.base_ms:.1f} ms + {cost.per_request_ms:.2f} ms per request in the "
        f"batch; {tokens} steps a request; at most {slots} adapters a step; "
        f"{len(set(sequence))} adapters in {len(sequence)} requests; loads free",
        f"{'C':>4}  {'scheduler':<13}{'req/s':>7}{'batch':>7}{'p95 ms':>8}{'req/s / vLLM':>14}"
        f"{'p95 / vLLM':>12}" + (f"{'measured req/s':>16}{'/ stock':>9}" if measured else ""),
    ]
    servers = {"vLLM": "stock", "gate": "node", "one adapter": "ceiling"}
    for c in concurrencies:
        outcomes = {
            name: simulate(sequence, c, scheduler, cost, slots=slots, tokens=tokens)
            for name, scheduler in SCHEDULERS.items()
        }
        outcomes["one adapter"] = simulate(
            ["one"] * len(sequence), c, vllm, cost, slots=slots, tokens=tokens
        )
        base = outcomes["vLLM"]
        for name, outcome in outcomes.items():
            line = (
                f"{c:>4}  {name:<13}{outcome.req_per_s:>7.1f}{outcome.mean_batch:>7.1f}"
                f"{outcome.ttft_p95_ms:>8.0f}{outcome.req_per_s / base.req_per_s:>14.2f}"
                f"{outcome.ttft_p95_ms / base.ttft_p95_ms:>12.2f}"
            )
            got = (measured or {}).get(c, {})
            if servers.get(name) in got and "stock" in got:
                line += f"{got[servers[name]]:>16.1f}{got[servers[name]] / got['stock']:>9.2f}"
            lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ceiling",
        nargs="+",
        required=True,
        metavar="C:REQ_PER_S",
        help="one-adapter points of a many_adapters.py run, e.g. 8:37.3 32:68.2",
    )
    parser.add_argument("--adapters", type=int, default=200)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--slots", type=int, default=4, help="max_loras")
    parser.add_argument("--tokens", type=int, default=16, help="max_tokens")
    args = parser.parse_args()
    points = {int(c): float(rps) for c, rps in (p.split(":") for p in args.ceiling)}
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lorahub.settings")
    import django

    django.setup()
    from bench.workload import workload

    names = [f"many-{i:03d}" for i in range(args.adapters)]
    sequence = workload(names, args.requests, args.seed)
    cost = StepCost.from_ceiling(points, args.tokens)
    print("\n".join(table(sequence, sorted(points), cost, slots=args.slots, tokens=args.tokens)))


if __name__ == "__main__":
    main()
