"""Who enters the engine next: the Virtual Token Counter of "Fairness in Serving Large Language
Models" (Sheng et al., OSDI '24), over the node's generation seats. Pure: no clock, no asyncio;
``admission.py`` carries it out, the replay too.

Each tenant has a counter of the service it was given, in weighted tokens divided by its
weight (``apps/tenants/shares.py``; ``charge``: input tokens count ``input_weight``, output
tokens ``output_weight``). When a seat frees, the waiting tenant with the smallest counter
takes it (ties: the tenant running least of its share, then the request that has waited
longest). A tenant that had nothing waiting has
its counter lifted, when its next request arrives, to the smallest counter among the waiting
(or, with nobody waiting, to the counter of the tenant served last): idleness is not banked.
Work-conserving: a seat is never left empty while anyone waits, so a tenant alone gets every
seat.

The engine's batch has ``headroom`` seats beyond ``seats``. A tenant takes one only while it
runs fewer requests than its weighted share of ``seats`` among the tenants with work: a tenant
that floods the node fills the ordinary seats, and another's request still enters the engine's
next step instead of waiting for a long generation to end. vLLM preempts nothing to make room
in a full batch (its priority policy reorders only its own waiting queue), so the room must be
kept before the batch is full. Inside the batch, vLLM's priority policy orders the
prefills waiting for a step's token budget by ``standing`` (how much of its share a tenant
runs), so that a flood of long prompts admitted together does not hold back another tenant's
first token either.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass
class _Tenant:
    weight: float = 1.0
    counter: float = 0.0
    running: int = 0
    waiting: deque[tuple[int, Hashable]] = field(default_factory=deque)


class FairQueue:
    def __init__(
        self,
        seats: int,
        *,
        headroom: int = 0,
        input_weight: float = 1.0,
        output_weight: float = 2.0,
    ) -> None:
        if seats < 1 or headroom < 0:
            raise ValueError(f"seats must be 1 or more and headroom 0 or more: {seats}, {headroom}")
        self.seats, self.headroom = seats, headroom
        self.input_weight, self.output_weight = input_weight, output_weight
        self.running = 0
        self._tenants: dict[Hashable, _Tenant] = {}
        self._order = itertools.count()
        self._last_served: Hashable | None = None

    # --- what the node tells it ---------------------------------------------------------------

    def arrive(self, tenant: Hashable, item: Hashable, *, weight: float = 1.0) -> None:
        """A request of ``tenant`` waits for a seat."""
        if weight <= 0:
            raise ValueError(f"a tenant's weight must be above 0, got {weight}")
        state = self._tenants.setdefault(tenant, _Tenant())
        state.weight = weight
        if not state.waiting:  # back from idle: lifted, so that idleness is not banked
            floor = self._floor(excluding=tenant)
            if floor is not None:
                state.counter = max(state.counter, floor)
        state.waiting.append((next(self._order), item))

    def leave(self, tenant: Hashable, item: Hashable) -> bool:
        """A waiting request gave up (cancelled, timed out); False if it was not waiting."""
        state = self._tenants.get(tenant)
        if state is None:
            return False
        for entry in state.waiting:
            if entry[1] == item:
                state.waiting.remove(entry)
                return True
        return False

    def charge(self, tenant: Hashable, *, prompt: int = 0, completion: int = 0) -> None:
        """Tokens the engine served ``tenant`` (input at prefill, output as generated), or
        reserved for it; a negative count gives back a reservation not used."""
        state = self._tenants.setdefault(tenant, _Tenant())
        served = prompt * self.input_weight + completion * self.output_weight
        state.counter += served / state.weight

    def done(self, tenant: Hashable) -> None:
        """A request of ``tenant`` left its seat."""
        state = self._tenants[tenant]
        state.running -= 1
        self.running -= 1

    def occupy(self) -> None:
        """A seat taken outside the queue (a shadow copy, only when nobody waits)."""
        self.running += 1

    def vacate(self) -> None:
        self.running -= 1

    # --- the decision -------------------------------------------------------------------------

    def next(self) -> tuple[Hashable, Hashable] | None:
        """The request that takes a free seat now (it then runs), or None."""
        backlogged = [(t, s) for t, s in self._tenants.items() if s.waiting]
        if not backlogged or self.running >= self.seats + self.headroom:
            return None
        if self.running >= self.seats:
            backlogged = [(t, s) for t, s in backlogged if s.running < self.fair_seats(t)]
            if not backlogged:
                return None
        tenant, state = min(
            backlogged,
            key=lambda ts: (ts[1].counter, self.standing(ts[0]), ts[1].waiting[0][0]),
        )
        _, item = state.waiting.popleft()
        state.running += 1
        self.running += 1
        self._last_served = tenant
        return tenant, item

    def standing(self, tenant: Hashable) -> int:
        """How much of its fair share of the seats ``tenant`` runs, in tenths (0: none of it,
        10: all of it): the priority of its requests inside the engine, lower first. Seats
        decide which requests run; inside vLLM's batch, prefill still has to wait for the
        step's token budget, and a tenant within its share goes before one above it."""
        return int(10 * self.running_of(tenant) / max(self.fair_seats(tenant), 1e-9))

    def fair_seats(self, tenant: Hashable) -> float:
        """``tenant``'s weighted share of the seats among the tenants with work."""
        active = [s for s in self._tenants.values() if s.waiting or s.running]
        total = sum(s.weight for s in active) or 1.0
        return self.seats * self._tenants[tenant].weight / total

    # --- for the node's pages and the tests ---------------------------------------------------

    def counter(self, tenant: Hashable) -> float:
        state = self._tenants.get(tenant)
        return state.counter if state else 0.0

    def waiting(self, tenant: Hashable | None = None) -> int:
        if tenant is not None:
            state = self._tenants.get(tenant)
            return len(state.waiting) if state else 0
        return sum(len(s.waiting) for s in self._tenants.values())

    def running_of(self, tenant: Hashable) -> int:
        state = self._tenants.get(tenant)
        return state.running if state else 0

    def _floor(self, *, excluding: Hashable) -> float | None:
        waiting = [s.counter for t, s in self._tenants.items() if s.waiting and t != excluding]
        if waiting:
            return min(waiting)
        if self._last_served is not None and self._last_served != excluding:
            return self._tenants[self._last_served].counter
        return None
