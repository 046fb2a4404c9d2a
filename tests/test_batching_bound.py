"""The step model behind bench/batching_bound.py: what it concludes about admission orders
is only as good as these rules (pure logic, no engine)."""

from __future__ import annotations

import random

import pytest

from bench import batching_bound as bb

COST = bb.StepCost(base_ms=8.0, per_request_ms=0.5)


def test_the_step_costs_are_recovered_from_one_adapter_points():
    tokens = 16
    points = {c: 1000 * c / (tokens * COST(c)) for c in (8, 32)}  # req/s at batch c
    found = bb.StepCost.from_ceiling(points, tokens)
    assert found.base_ms == pytest.approx(8.0)
    assert found.per_request_ms == pytest.approx(0.5)
    flat = bb.StepCost.from_ceiling({8: points[8]}, tokens)  # one point: no growth
    assert (flat.per_request_ms, flat(8)) == (0.0, pytest.approx(COST(8)))


@pytest.mark.parametrize("name", list(bb.SCHEDULERS))
def test_one_adapter_fills_the_batch_and_distinct_ones_are_capped_at_the_slots(name):
    scheduler = bb.SCHEDULERS[name]
    one = bb.simulate(["a"] * 400, 8, scheduler, COST, slots=4, tokens=16)
    assert one.mean_batch == pytest.approx(8, abs=0.1)
    # 8 requests a step, 16 steps each: 8 requests per 16 steps of 12 ms
    assert one.req_per_s == pytest.approx(1000 * 8 / (16 * COST(8)), rel=0.02)
    distinct = bb.simulate([f"x{i}" for i in range(400)], 8, scheduler, COST, slots=4, tokens=16)
    assert distinct.mean_batch == pytest.approx(4, abs=0.1)


@pytest.mark.parametrize("name", list(bb.SCHEDULERS))
def test_no_step_runs_more_adapters_than_slots_and_every_request_finishes(name):
    rng = random.Random(3)
    sequence = [f"a{min(int(rng.paretovariate(1.0)), 60)}" for _ in range(500)]
    steps: list[list[str]] = []
    scheduler = bb.SCHEDULERS[name]

    def watched(outstanding, now, slots, state):
        batch = scheduler(outstanding, now, slots, state)
        steps.append([r.adapter for r in batch])
        return batch

    bb.simulate(sequence, 16, watched, COST, slots=4, tokens=16)
    assert max(len(set(adapters)) for adapters in steps) == 4
    assert all(steps)  # no empty step while work is left
    assert sum(len(batch) for batch in steps) == 500 * 16  # each request ran its 16 steps


def test_the_gate_lets_a_starving_adapter_in_within_its_bound_while_hot_ones_keep_the_slots():
    # four hot adapters keep every slot busy, and there is always a request for one of them
    # to join; a cold one arrives fifth: once it has waited past the gate's bound (4x a
    # request's time in the engine here), joiners stop until it has a slot
    hot = ["h0", "h1", "h2", "h3"]
    sequence = hot + ["cold"] + [hot[i % 4] for i in range(2000)]
    admitted: list[float] = []
    batches: list[int] = []

    def watched(outstanding, now, slots, state):
        batch = bb.gate(outstanding, now, slots, state)
        if not admitted:
            batches.append(len({r.adapter for r in batch}))
        if any(r.adapter == "cold" for r in batch):
            admitted.append(now)
        return batch

    bb.simulate(sequence, 16, watched, COST, slots=4, tokens=16)
    in_engine = 16 * COST(16)  # a request's time in the engine at a full batch
    assert admitted and admitted[0] <= bb.STARVATION_HOLDS * in_engine + in_engine
    assert set(batches) == {4}  # meanwhile no slot idled
