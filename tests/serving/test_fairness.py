"""The engine's fair share as rules (``apps/serving/fairness.py``): a simulated engine
on a step clock, each running request making one token per step."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from apps.serving.fairness import FairQueue
from apps.tenants.shares import weight_of


@dataclass
class Engine:
    """Seats of a fair queue and the requests in them, one output token per step."""

    fair: FairQueue
    weights: dict[str, float]
    served: dict[str, int] = field(default_factory=dict)  # output tokens per tenant
    running: list[list] = field(default_factory=list)  # [tenant, tokens left]
    ids: itertools.count = field(default_factory=itertools.count)

    def send(self, tenant: str, n: int = 1) -> None:
        for _ in range(n):
            self.fair.arrive(tenant, next(self.ids), weight=self.weights[tenant])

    def step(self, *, length: int = 8, prompt: int = 0, refill: set[str] = frozenset()) -> None:
        while (chosen := self.fair.next()) is not None:
            self.fair.charge(chosen[0], prompt=prompt)
            self.running.append([chosen[0], length])
        for request in self.running:
            request[1] -= 1
            self.fair.charge(request[0], completion=1)
            self.served[request[0]] = self.served.get(request[0], 0) + 1
        for request in [r for r in self.running if r[1] == 0]:
            self.running.remove(request)
            self.fair.done(request[0])
            if request[0] in refill:  # a backlogged tenant sends again at once
                self.send(request[0])


def shares(served: dict[str, int]) -> dict[str, float]:
    total = sum(served.values())
    return {tenant: n / total for tenant, n in served.items()}


def test_backlogged_tenants_get_tokens_in_proportion_to_their_weights():
    weights = {"premium": weight_of(2), "standard": weight_of(1), "batch": weight_of(0)}
    engine = Engine(FairQueue(8), weights)
    for tenant in weights:
        engine.send(tenant, 20)  # each always has more waiting than it can run
    for _ in range(2000):
        engine.step(refill=set(weights))
    total_weight = sum(weights.values())
    for tenant, share in shares(engine.served).items():
        assert share == pytest.approx(weights[tenant] / total_weight, rel=0.10), tenant


def test_an_operator_weight_scales_the_tier_s_share():
    weights = {"a": weight_of(1, 300), "b": weight_of(1, 100)}
    engine = Engine(FairQueue(4), weights)
    for tenant in weights:
        engine.send(tenant, 10)
    for _ in range(2000):
        engine.step(refill=set(weights))
    assert shares(engine.served)["a"] == pytest.approx(0.75, rel=0.10)


def test_a_tenant_that_was_idle_banks_nothing():
    """Busy alone for a long time, then joined: the newcomer's counter is lifted to the busy
    tenant's, so it shares from then on instead of having the engine to itself."""
    weights = {"busy": 1.0, "late": 1.0}
    engine = Engine(FairQueue(4), weights)
    engine.send("busy", 8)
    for _ in range(500):
        engine.step(refill={"busy"})
    engine.send("late", 8)
    assert engine.fair.counter("late") >= engine.fair.counter("busy") - 1e-9
    engine.served.clear()
    for _ in range(400):
        engine.step(refill={"busy", "late"})
    assert shares(engine.served)["late"] == pytest.approx(0.5, rel=0.10)


def test_a_tenant_alone_gets_every_seat_whatever_its_weight():
    engine = Engine(FairQueue(6, headroom=2), {"batch": weight_of(0)})
    engine.send("batch", 20)
    engine.step()
    assert engine.fair.running == 6  # the ordinary seats, all of them
    assert engine.fair.waiting("batch") == 14


def test_ties_go_to_the_request_that_waited_longest():
    fair = FairQueue(1)
    fair.arrive("b", "b1")
    fair.arrive("a", "a1")
    assert fair.next() == ("b", "b1")


def test_ties_go_first_to_the_tenant_running_least_of_its_share():
    """A tenant back from idle is lifted to the least counter among the waiting, a tie it
    would otherwise lose to every request that waited longer."""
    fair = FairQueue(2)
    for item in ("a1", "a2", "a3"):
        fair.arrive("a", item)
    assert [fair.next(), fair.next()] == [("a", "a1"), ("a", "a2")]
    fair.arrive("b", "b1")  # lifted to a's counter; a3 has waited longer
    fair.done("a")
    assert fair.next() == ("b", "b1")  # a runs 1 of its fair 1 seat, b none of its


def test_the_least_served_tenant_takes_the_next_seat():
    fair = FairQueue(1)
    fair.arrive("a", "a1")
    fair.arrive("a", "a2")
    fair.arrive("b", "b1")  # waits behind a2, with the same counter (lifted to a's)
    assert fair.next() == ("a", "a1")
    fair.charge("a", prompt=10, completion=5)
    fair.done("a")
    assert fair.next() == ("b", "b1")  # a has been served since, b has not


def flooded(fair: FairQueue, requests: int) -> FairQueue:
    """``fair`` with tenant noisy's ``requests`` sent and seated as far as they go."""
    for i in range(requests):
        fair.arrive("noisy", f"n{i}")
    while fair.next() is not None:
        pass
    return fair


def test_a_flooding_tenant_leaves_headroom_seats_to_the_others():
    fair = flooded(FairQueue(4, headroom=1), 10)
    assert fair.running_of("noisy") == 4  # alone: every ordinary seat, not the headroom
    fair.arrive("quiet", "q1")
    assert fair.next() == ("quiet", "q1")  # at once, without waiting for a noisy seat
    fair.arrive("quiet", "q2")
    assert fair.next() is None  # the headroom is full: the next one waits its turn
    fair.done("noisy")
    assert fair.next() == ("quiet", "q2")  # least served


def test_a_request_that_gives_up_leaves_the_queue():
    fair = FairQueue(1)
    fair.arrive("a", "a1")
    fair.arrive("a", "a2")
    assert fair.leave("a", "a2")
    assert not fair.leave("a", "a9")
    assert fair.waiting("a") == 1


@pytest.mark.parametrize("weight", [0, -1.0])
def test_a_weight_that_is_not_positive_is_refused(weight):
    with pytest.raises(ValueError, match="weight must be above 0"):
        FairQueue(1).arrive("a", "a1", weight=weight)


def test_a_tenant_s_standing_is_how_much_of_its_share_it_runs():
    """The priority of its requests inside the engine: within its share before above it."""
    fair = flooded(FairQueue(4, headroom=2), 6)
    fair.arrive("quiet", "q1")
    assert fair.standing("quiet") == 0  # nothing running yet: first inside the engine
    assert fair.standing("noisy") == 20  # 4 seats of a fair 2 (two tenants with work)
    assert fair.next() == ("quiet", "q1")  # a headroom seat
    assert fair.standing("quiet") == 5  # 1 of its 2
