"""Admission as pure logic: the queue refuses when slots and queue are full, a request leaves
the queue when it gets a slot, and whatever way a request ends it gives back what it held."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from apps.serving.node import openai_protocol as oai
from apps.serving.node.admission import Admission, RateLimiter


def test_the_queue_refuses_only_when_every_slot_is_busy_and_the_queue_is_full():
    overloaded: list[int] = []

    async def scenario() -> None:
        admission = Admission(
            max_concurrent=1, max_queue=1, on_overloaded=lambda: overloaded.append(1)
        )
        with admission.queue() as first:
            async with first.slot():  # the one slot is busy; nobody waits
                assert admission.waiting == 0
                with admission.queue():  # one may wait
                    assert admission.waiting == 1
                    with pytest.raises(oai.ApiError) as refused, admission.queue():
                        pass
                    assert refused.value.status == 503
                    assert refused.value.code == "overloaded"
                assert admission.waiting == 0
            with admission.queue():  # the slot is free again: admitted even past the queue
                pass

    asyncio.run(scenario())
    assert overloaded == [1]


def test_a_request_cancelled_while_waiting_for_a_slot_gives_back_its_place():
    async def scenario() -> None:
        admission = Admission(max_concurrent=1, max_queue=4)
        with admission.queue() as holder:
            async with holder.slot():

                async def wait_for_slot() -> None:
                    with admission.queue() as ticket:
                        async with ticket.slot():
                            pytest.fail("got a slot that was never freed")

                waiter = asyncio.create_task(wait_for_slot())
                await asyncio.sleep(0.01)
                assert admission.waiting == 1
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter
                assert admission.waiting == 0
        # the slot is free: a new request takes it without waiting
        with admission.queue() as ticket:
            async with asyncio.timeout(5), ticket.slot():
                assert admission.waiting == 0

    asyncio.run(scenario())


def test_a_stream_that_takes_over_what_a_request_holds_gives_it_back_when_it_ends():
    """The request path's hand-over: ``AsyncExitStack.pop_all`` moves the slot to the stream."""

    async def scenario() -> None:
        admission = Admission(max_concurrent=1, max_queue=0)
        async with contextlib.AsyncExitStack() as holding:
            ticket = holding.enter_context(admission.queue())
            await holding.enter_async_context(ticket.slot())
            stream_holds = holding.pop_all()
        # the handler is done; the stream still holds the slot
        with pytest.raises(oai.ApiError), admission.queue():
            pass
        await stream_holds.aclose()
        with admission.queue() as again:  # given back
            async with again.slot():
                pass

    asyncio.run(scenario())


def test_a_tenant_s_rate_refills_over_the_minute():
    now = [0.0]
    rate = RateLimiter(clock=lambda: now[0])
    assert all(rate.allow(1, 60) for _ in range(60))  # a burst of a minute's worth
    assert not rate.allow(1, 60)
    assert rate.allow(2, 60)  # another tenant has its own bucket
    now[0] = 1.0  # one request per second comes back
    assert rate.allow(1, 60)
    assert not rate.allow(1, 60)
    assert not rate.allow(3, 0)  # a rate of zero admits nothing


def test_over_its_rate_a_tenant_gets_429_naming_its_rate():
    admission = Admission(max_concurrent=1, max_queue=1)
    admission.check_rate(tenant_id=1, tenant_slug="acme", rpm=1)
    with pytest.raises(oai.ApiError) as refused:
        admission.check_rate(tenant_id=1, tenant_slug="acme", rpm=1)
    assert refused.value.status == 429
    assert "tenant 'acme' is over its rate of 1 requests per minute" in str(refused.value.body())


def test_a_seat_charges_the_output_it_may_make_and_gives_back_what_it_did_not():
    async def scenario() -> None:
        admission = Admission(max_concurrent=1, max_queue=4)
        with admission.queue(7) as ticket:
            async with ticket.slot(reserve=100):
                assert admission.fair.counter(7) == 200  # 100 output tokens, weight 2
                ticket.charge(prompt=10, completion=30)
                assert admission.fair.counter(7) == 210  # the prompt; the output was reserved
            assert admission.fair.counter(7) == 70  # 10 + 2 x 30: the rest given back

    asyncio.run(scenario())


def test_a_tenant_arriving_beside_a_flood_shares_the_seats_that_free_from_then_on():
    """Charged only as they stream, long generations would leave the newcomer's counter
    behind for seconds and give it every seat that frees; reserved at the seat, the seats
    alternate at once."""

    async def scenario() -> list[str]:
        admission = Admission(max_concurrent=2, max_queue=16)
        granted: list[str] = []
        release: dict[str, asyncio.Event] = {}

        async def request(tenant: int, name: str) -> None:
            with admission.queue(tenant) as ticket:
                async with ticket.slot(reserve=256):
                    granted.append(name)
                    release[name] = asyncio.Event()
                    await release[name].wait()
                    ticket.charge(completion=256)  # it generated all it could

        tasks = [asyncio.create_task(request(1, f"noisy{i}")) for i in range(5)]
        await asyncio.sleep(0.01)
        tasks += [asyncio.create_task(request(2, f"late{i}")) for i in range(3)]
        await asyncio.sleep(0.01)
        for _ in range(6):  # one seat frees at a time
            release[granted[len(granted) - 2]].set()
            await asyncio.sleep(0.01)
        for event in release.values():
            event.set()
        await asyncio.gather(*tasks)
        return granted

    order = asyncio.run(scenario())
    assert order[:2] == ["noisy0", "noisy1"]
    tenants = [name.rstrip("0123456789") for name in order[2:8]]
    assert tenants == ["late", "noisy", "late", "noisy", "late", "noisy"], order
