"""The cache manager's decisions with a stand-in engine: pure logic, no vLLM.

The stand-in records what the manager asks of the engine and can make an add slow, so that
queueing, deadlines and single-flight are checked deterministically. The real engine runs in
``test_cache_node.py``.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace

import pytest

from apps.registry import signing
from apps.registry.contracts import ResolvedVersion
from apps.registry.storage import LocalStore
from apps.serving.cache import report
from apps.serving.cache.engine_tiers import EngineTiers, Owner, PinLimit
from apps.serving.cache.gate import DeviceGate, GateRule
from apps.serving.cache.landing import AdapterIntegrityError
from apps.serving.cache.manager import CacheManager, Limits, LoadDeadline, LoadQueueFull
from apps.serving.cache.policies import LRU
from apps.serving.cache.policies.base import Resident
from apps.serving.cache.versions import CachedVersion
from apps.serving.node.placement import Placement
from apps.serving.node.record import RequestTrace
from tests.helpers import signed_version
from tests.serving.cache.stand_in import Settings, StandInEngine


@pytest.fixture
def world(tmp_path, demo_dir):
    """A local registry holding support-v1 and a factory of signed versions of it."""
    key = signing.load_private_key(signing.generate_private_key_pem())
    store = LocalStore(tmp_path / "registry")
    base, keys = signed_version(
        store, demo_dir / "adapters" / "support-v1", "tenants/t/adapters/support/v1", key
    )

    def version(n: int, tenant: int = 1) -> ResolvedVersion:
        return replace(base, version_id=n, version=f"v{n}", tenant_id=tenant)

    engine = StandInEngine()
    cache = CacheManager(
        engine=engine,  # type: ignore[arg-type]
        store=store,
        root=tmp_path / "disk",
        public_keys=lambda: keys,
        policy=LRU(),
        limits=Limits(max_pending=2),
    )
    return cache, engine, version


def run(coro):
    return asyncio.run(coro)


def test_concurrent_requests_for_a_cold_version_share_one_fetch_and_one_add(world):
    cache, engine, version = world

    async def scenario():
        engine.add_delay = 0.05
        return await asyncio.gather(*(cache.activate(version(1)) for _ in range(20)))

    placed = run(scenario())
    assert engine.adds == [1]
    assert {p.tier for p in placed} == {"L4"}
    assert set(placed[0].timings) == {"fetch_ms", "verify_ms", "add_ms"}
    # usage counts the load once: for the one request that started it
    assert [p.started for p in placed].count(True) == 1
    assert not run(cache.activate(version(1))).started  # and a hit caused none


def test_a_missed_deadline_raises_but_the_load_carries_on(world):
    cache, engine, version = world

    async def scenario():
        engine.add_delay = 0.2
        with pytest.raises(LoadDeadline):
            await cache.activate(version(1), deadline_s=0.01)
        async with asyncio.timeout(5):  # nobody waits for it any more: it loads all the same
            while not cache.holds(1):
                await asyncio.sleep(0.01)
        return await cache.activate(version(1), deadline_s=0.0)

    found = run(scenario())  # loaded by the first request's load, which went on
    assert found.tier in ("L1", "L2") and found.load_ms == 0
    assert engine.adds == [1]


def test_a_full_load_queue_refuses_or_waits_by_mode(world):
    cache, engine, version = world

    async def scenario():
        engine.gate.clear()  # adds block until released
        first = asyncio.ensure_future(cache.activate(version(1)))
        second = asyncio.ensure_future(cache.activate(version(2)))
        await asyncio.sleep(0.05)
        assert cache.loading() == 2  # max_pending
        with pytest.raises(LoadQueueFull):
            await cache.activate(version(3), wait_for_room=False)
        with pytest.raises(LoadDeadline):
            await cache.activate(version(3), deadline_s=0.05)
        waiting = asyncio.ensure_future(cache.activate(version(3)))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        engine.gate.set()
        await asyncio.gather(first, second)
        return await waiting

    assert run(scenario()).handle.lora_id == 3
    assert sorted(engine.adds) == [1, 2, 3]


def test_requests_for_loaded_versions_never_wait_behind_a_cold_load(world):
    cache, engine, version = world

    async def scenario():
        await cache.activate(version(1))
        engine.gate.clear()
        cold = asyncio.ensure_future(cache.activate(version(2)))
        await asyncio.sleep(0.02)
        # the cold load waits on the gate for ever: any bound shows the hot one did not
        hot = await asyncio.wait_for(cache.activate(version(1)), timeout=5)
        assert not cold.done()
        engine.gate.set()
        await cold
        return hot

    assert run(scenario()).tier in ("L1", "L2")


def test_a_version_in_use_is_never_removed_a_load_waits_for_it_instead(world):
    cache, engine, version = world

    async def scenario():
        for n in (1, 2, 3):  # fill the three host slots, each held by a running request
            await cache.activate(version(n), hold=True)
        fourth = asyncio.ensure_future(cache.activate(version(4)))
        await asyncio.sleep(0.05)
        assert not fourth.done() and engine.removed == []
        cache.release(2)
        # a fetch, a signature check and a landing on disk: 1 s timed out on a CI machine
        # running four lanes on 2 cores
        await asyncio.wait_for(fourth, timeout=15)

    run(scenario())
    assert engine.removed == [2]


def test_a_tenant_at_its_warm_quota_displaces_its_own_version(world):
    cache, engine, version = world
    tight = Owner(tenant_id=1, warm_quota=1)

    async def scenario():
        await cache.activate(version(10, tenant=2), owner=Owner(tenant_id=2))
        await cache.activate(version(1), owner=tight)
        await cache.activate(version(2), owner=tight)

    run(scenario())
    assert engine.removed == [1]
    assert cache.holds(10) and cache.holds(2)


def test_pins_stop_at_max_loras_minus_one_and_at_the_tenants_hot_quota(world):
    cache, engine, version = world
    engine.settings.max_loras = 3

    async def scenario():
        await cache.pin(version(1), owner=Owner(tenant_id=1, hot_quota=1))
        with pytest.raises(PinLimit, match="hot quota"):
            await cache.pin(version(2), owner=Owner(tenant_id=1, hot_quota=1))
        await cache.pin(version(3, tenant=2))
        with pytest.raises(PinLimit, match="max_loras - 1 = 2"):
            await cache.pin(version(4, tenant=3))

    run(scenario())
    assert engine.pinned == [1, 3]


def test_pins_stop_at_the_tenants_hot_memory_quota(world):
    """max_hot_memory_mb bounds the size of a tenant's pinned adapters together."""
    cache, engine, version = world
    engine.settings.max_loras = 4
    size = version(1).size_bytes

    def room(tenant: int) -> Owner:
        return Owner(tenant_id=tenant, hot_memory_bytes=int(1.5 * size))

    async def scenario():
        await cache.pin(version(1), owner=room(1))
        with pytest.raises(PinLimit, match="max_hot_memory_mb"):
            await cache.pin(version(2), owner=room(1))
        await cache.pin(version(3, tenant=2), owner=room(2))  # its own budget

    run(scenario())
    assert engine.pinned == [1, 3]


def test_the_disk_tier_trims_to_its_cap_but_keeps_what_the_engine_holds(world):
    cache, _, version = world
    size = version(1).size_bytes
    cache.limits = Limits(disk_bytes=int(2.5 * size))

    async def scenario():
        await cache.activate(version(1))  # in the engine: stays on disk
        for n in (2, 3, 4):
            await asyncio.to_thread(cache.land, version(n))

    run(scenario())
    on_disk = {row["version_id"] for row in report.residents(cache)["L3"]}
    assert on_disk == {1, 4}  # 2 and 3 were the least recently used outside the engine


# --- the device-slot gate -------------------------------------------------------------------


def test_the_gate_admits_at_most_the_free_device_slots_of_distinct_adapters():
    async def scenario():
        slots = {"n": 1}
        gate = DeviceGate(lambda: slots["n"])
        await gate.enter(1, pinned=False)
        await gate.enter(1, pinned=False)  # the same adapter shares its slot
        await gate.enter(None, pinned=False)  # the base model needs no slot
        await gate.enter(7, pinned=True)  # a pinned one has its own
        blocked = asyncio.ensure_future(gate.enter(2, pinned=False))
        await asyncio.sleep(0.01)
        assert not blocked.done()
        gate.leave(1)
        await asyncio.sleep(0.01)
        assert not blocked.done()  # one request of adapter 1 is still in the batch
        gate.leave(1)
        await asyncio.wait_for(blocked, timeout=1)
        assert gate.active() == {2}

    run(scenario())


def test_a_version_an_alias_stopped_using_leaves_the_disk_first(world):
    cache, _, version = world
    size = version(1).size_bytes

    async def scenario():
        for n in (1, 2, 3):
            await asyncio.to_thread(cache.land, version(n))
        cache.deprecate(3)  # the most recently used, but replaced by its alias
        cache.limits = Limits(disk_bytes=int(2.5 * size))
        cache.trim_disk()

    run(scenario())
    assert {row["version_id"] for row in report.residents(cache)["L3"]} == {1, 2}


def test_two_landings_of_one_version_at_once_make_one_download(world):
    """A request's load and the alias warming can land the same version at the same time; a
    second landing would replace the folder while the engine reads it."""
    cache, _, version = world
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        tiers = sorted(found.found_in for found in pool.map(cache.land, [version(1)] * 4))
    assert tiers == ["L3", "L3", "L3", "L4"]
    assert cache.disk.has(version(1))


def test_a_fresh_load_is_not_evicted_before_the_requests_that_waited_for_it_resume(world):
    """One engine slot, two cold versions. When v1's load lets go of the load slot, v2's
    load (queued on it) runs before v1's waiting request resumes; it must wait for v1 instead
    of evicting it unused, which made the waiter load v1 again, evicting v2, and so on (the
    soak saw 3.5 loads per request)."""
    cache, engine, version = world
    engine.settings = Settings(max_loras=1, max_cpu_loras=1)

    async def until(condition) -> None:
        async with asyncio.timeout(5):
            while not condition():
                await asyncio.sleep(0.01)

    async def scenario():
        engine.gate.clear()  # v1's add waits, holding the load slot
        first = asyncio.ensure_future(cache.activate(version(1), hold=True))
        await until(lambda: engine.entered == [1])
        second = asyncio.ensure_future(cache.activate(version(2), hold=True))
        await until(lambda: 2 in cache.on_disk.members)  # landed; next it queues for the slot
        await asyncio.sleep(0.05)
        engine.gate.set()
        placed = await asyncio.wait_for(first, timeout=5)
        assert not second.done()  # v2 waits for room while v1 is held
        cache.release(placed.handle.lora_id)
        other = await asyncio.wait_for(second, timeout=5)
        return placed, other

    placed, other = run(scenario())
    assert (placed.tier, other.tier) == ("L4", "L4")
    assert engine.adds == [1, 2]  # each loaded once
    assert engine.removed == [1]  # v1 left only after its request was done


def test_a_freed_slot_goes_to_the_adapter_with_the_most_requests_waiting():
    """Adapter-aware admission: with one slot taken by adapter 1, adapter 2 queues first with
    one request, then adapter 3 with three. In arrival order adapter 2 would take the freed
    slot; the gate gives it to adapter 3, whose three requests then run together."""

    async def scenario():
        gate = DeviceGate(lambda: 1)
        await gate.enter(1, pinned=False)
        first = asyncio.ensure_future(gate.enter(2, pinned=False))
        await asyncio.sleep(0)
        crowd = [asyncio.ensure_future(gate.enter(3, pinned=False)) for _ in range(3)]
        for _ in range(100):  # each waiter takes the gate's lock in turn
            if gate.waiting() == {2: 1, 3: 3}:
                break
            await asyncio.sleep(0)
        assert gate.waiting() == {2: 1, 3: 3}
        gate.leave(1)
        await asyncio.wait_for(asyncio.gather(*crowd), timeout=1)
        assert gate.active() == {3} and not first.done()
        for _ in crowd:
            gate.leave(3)
        await asyncio.wait_for(first, timeout=1)
        assert gate.active() == {2} and gate.waiting() == {}

    run(scenario())


def test_an_adapter_waiting_too_long_gets_the_next_slot_even_while_others_stay_busy(
    monkeypatch,
):
    """Requests for the adapter in the slot keep coming, so its slot would never free; once
    adapter 2 has waited STARVATION_S, newcomers for adapter 1 wait and 2 gets the slot."""
    from apps.serving.cache import gate as gate_module

    monkeypatch.setattr(gate_module, "STARVATION_S", 0.1)

    async def scenario():
        gate = DeviceGate(lambda: 1)
        await gate.enter(1, pinned=False)
        starved = asyncio.ensure_future(gate.enter(2, pinned=False))
        await asyncio.sleep(0)
        await gate.enter(1, pinned=False)  # joins the batch: 2 has not waited long yet
        started = time.monotonic()
        while time.monotonic() - started < gate_module.STARVATION_S:  # 2 starts starving
            await asyncio.sleep(0.05)
        held = asyncio.ensure_future(gate.enter(1, pinned=False))
        await asyncio.sleep(0.01)
        assert not held.done(), "a newcomer for the busy adapter kept 2 waiting"
        gate.leave(1)
        gate.leave(1)  # adapter 1's running requests finish; its slot frees
        await asyncio.wait_for(starved, timeout=2)
        assert gate.active() == {2} and not held.done()
        gate.leave(2)
        await asyncio.wait_for(held, timeout=2)

    run(scenario())


def test_a_starving_adapter_stops_the_newcomers_of_the_adapter_that_frees_first_only(
    monkeypatch,
):
    """Two slots, adapters 1 and 2 in the batch, 2 let in last. Adapter 3 starves: adapter 1,
    whose newest request is the oldest, takes no newcomers until its slot frees for 3;
    adapter 2's newcomers keep joining its batch meanwhile."""
    from apps.serving.cache import gate as gate_module

    monkeypatch.setattr(gate_module, "STARVATION_S", 0.1)

    async def scenario():
        gate = DeviceGate(lambda: 2)
        await gate.enter(1, pinned=False)
        await asyncio.sleep(0.01)
        await gate.enter(2, pinned=False)
        starved = asyncio.ensure_future(gate.enter(3, pinned=False))
        await asyncio.sleep(gate_module.STARVATION_S + 0.05)  # 3 starts starving
        for_two = asyncio.ensure_future(gate.enter(2, pinned=False))
        for_one = asyncio.ensure_future(gate.enter(1, pinned=False))
        await asyncio.sleep(0.01)
        assert for_two.done(), "adapter 2's newcomer waited, though 1 frees the slot"
        assert not for_one.done() and not starved.done()
        gate.leave(1)  # adapter 1's one request finishes: its slot goes to the starving 3
        await asyncio.wait_for(starved, timeout=1)
        assert gate.active() == {2, 3} and not for_one.done()
        gate.leave(3)
        await asyncio.wait_for(for_one, timeout=1)
        assert gate.active() == {1, 2}

    run(scenario())


@pytest.mark.parametrize("bounded", [True, False])
def test_an_adapter_passed_over_max_passed_times_is_next_however_short_its_wait(bounded):
    """The clock stands still (no wait ever reaches the bound in seconds): adapter 2 waits
    with one request while later adapters with two each take the freed slot. After
    MAX_PASSED of them, 2 takes the next slot although a newer crowd is bigger — unless the
    bound is off (``max_passed=0``, LORAHUB_NODE_GATE_MAX_PASSED), when the crowd takes it."""
    from apps.serving.cache import gate as gate_module

    async def scenario():
        passed = gate_module.MAX_PASSED if bounded else 0
        gate = DeviceGate(lambda: 1, clock=lambda: 0.0, max_passed=passed)
        await gate.enter(1, pinned=False)
        lonely = asyncio.ensure_future(gate.enter(2, pinned=False))
        await asyncio.sleep(0)
        holder, holding = 1, 1
        for crowd_id in range(3, 4 + gate_module.MAX_PASSED):
            crowd = [asyncio.ensure_future(gate.enter(crowd_id, pinned=False)) for _ in range(2)]
            await asyncio.sleep(0)
            for _ in range(holding):
                gate.leave(holder)
            if crowd_id < 3 + gate_module.MAX_PASSED:
                await asyncio.wait_for(asyncio.gather(*crowd), timeout=1)
                assert not lonely.done(), f"passed over {crowd_id - 2} times, not yet due"
                holder, holding = crowd_id, 2
            elif bounded:
                await asyncio.wait_for(lonely, timeout=1)
                assert gate.active() == {2} and not any(c.done() for c in crowd)
            else:
                await asyncio.wait_for(asyncio.gather(*crowd), timeout=1)
                assert not lonely.done()
                lonely.cancel()

    run(scenario())


def test_the_starvation_bound_follows_how_long_requests_take_in_the_engine(monkeypatch):
    """On a slow engine (each request 1 s in the engine, longer than the 0.5 s floor) an
    adapter becomes starving only after twice that: at 1.5 s of waiting, newcomers for the
    adapter in the slot still join it; at 2.1 s they wait. When requests speed up, the bound
    comes back down to the floor."""
    from apps.serving.cache import gate as gate_module

    now = [0.0]
    monkeypatch.setattr(gate_module, "STARVATION_S", 0.5)
    monkeypatch.setattr(gate_module, "STARVATION_HOLDS", 2.0)

    async def scenario():
        gate = DeviceGate(lambda: 1, clock=lambda: now[0])
        assert gate.starvation_s() == 0.5  # nothing measured yet: the floor
        for _ in range(3):  # requests of adapter 1, one at a time, 1 s each in the engine
            await gate.enter(1, pinned=False)
            now[0] += 1.0
            gate.leave(1)
        assert gate.starvation_s() == pytest.approx(2.0)

        await gate.enter(1, pinned=False)
        waiting = asyncio.ensure_future(gate.enter(2, pinned=False))
        await asyncio.sleep(0)
        now[0] += 1.5  # adapter 2 has waited 1.5 s: over the floor, under two requests' time
        joined = asyncio.ensure_future(gate.enter(1, pinned=False))
        await asyncio.sleep(0)
        assert joined.done() and not waiting.done()
        now[0] += 0.6  # 2.1 s: starving
        held = asyncio.ensure_future(gate.enter(1, pinned=False))
        await asyncio.sleep(0)
        assert not held.done(), "a newcomer for adapter 1 kept the starving adapter waiting"
        gate.leave(1)
        gate.leave(1)  # adapter 1's two requests (held 2.1 s and 0.6 s) leave; 2 takes the slot
        await asyncio.wait_for(waiting, timeout=1)
        assert gate.active() == {2} and not held.done()
        gate.leave(2)
        await asyncio.wait_for(held, timeout=1)
        for _ in range(100):  # the engine speeds up: 0.1 s a request
            now[0] += 0.1
            gate.leave(1)
            await gate.enter(1, pinned=False)
        gate.leave(1)
        assert gate.starvation_s() == 0.5

    run(scenario())


def test_each_version_has_one_record_whose_state_follows_it_through_the_tiers(world):
    """One record per version holds its whole state: landing, loading, in the engine, held,
    pinned, back to disk, deprecated and quarantined read from it, and /internal/cache's
    rows show the record's state."""
    cache, engine, version = world
    states: dict[str, str] = {}

    def state(n: int) -> str:
        record = cache.versions.get(n)
        return str(record.state) if record is not None else "none"

    def row_state(n: int, tier: str) -> str:
        return next(r["state"] for r in report.residents(cache)[tier] if r["version_id"] == n)

    async def scenario():
        states["before"] = state(1)
        engine.gate.clear()  # the add waits: the version is on disk and loading
        load = asyncio.ensure_future(cache.activate(version(1)))
        async with asyncio.timeout(5):
            while engine.entered != [1]:
                await asyncio.sleep(0.01)
        states["loading"] = state(1)
        states["loading row"] = report.residents(cache)["loading"][0]["state"]
        assert cache.busy(1)
        engine.gate.set()
        await load
        states["loaded"] = state(1)
        states["disk row"] = row_state(1, "L3")
        await cache.activate(version(1), hold=True)
        states["held"] = state(1)
        assert cache.busy(1) and cache.in_use(1) == 1
        cache.release(1)
        states["released"] = state(1)
        await cache.pin(version(1))
        states["pinned"] = state(1)
        states["pinned row"] = row_state(1, "L1")
        await cache.unload(1)
        states["removed"] = state(1)
        cache.deprecate(1)
        await cache.activate(version(1))  # loaded again: still deprecated
        states["deprecated row"] = next(
            r["deprecated"] for r in report.residents(cache)["L2"] + report.residents(cache)["L1"]
        )
        with cache.versions.of(1).landing:  # what a landing on another thread holds
            states["landing"] = state(1)
            assert cache.busy(1)
        cache.quarantined = {2}
        states["quarantined"] = state(2)
        with pytest.raises(AdapterIntegrityError):
            await cache.activate(version(2))

    run(scenario())
    assert states == {
        "before": "none",
        "loading": "loading",
        "loading row": "loading",
        "loaded": "in engine",
        "disk row": "in engine",
        "held": "held",
        "released": "in engine",
        "pinned": "pinned",
        "pinned row": "pinned",
        "removed": "on disk",
        "deprecated row": True,
        "landing": "landing",
        "quarantined": "quarantined",
    }
    assert cache.quarantined == {2}


def test_after_an_engine_restart_no_record_says_it_is_in_the_engine(world):
    cache, _engine, version = world

    async def scenario():
        await cache.pin(version(1))
        await cache.activate(version(2), hold=True)
        cache.forget_engine()

    run(scenario())
    assert [str(cache.versions.get(n).state) for n in (1, 2)] == ["on disk", "on disk"]
    assert cache.in_engine() == 0 and not cache.is_pinned(1) and cache.in_use(2) == 0


def test_a_deprecated_version_loaded_again_is_still_the_first_to_leave_the_engine(world):
    """Deprecation belongs to the version, not to one stay in the engine: loaded again after
    its alias moved on, it goes before older versions the alias still uses."""
    cache, engine, version = world

    async def scenario():
        await asyncio.to_thread(cache.land, version(1))
        cache.deprecate(1)  # on disk only when its alias moves on
        for n in (2, 3, 1):  # v1 is the most recently used of the three
            await cache.activate(version(n))
        await cache.activate(version(4))  # max_cpu_loras = 3: one must go

    run(scenario())
    assert engine.removed == [1]


def test_a_slot_about_to_free_goes_to_the_next_adapter_a_step_early_when_nothing_is_pinned():
    """Adapter 1's only request is on its last token: adapter 2 is let in now, so its request
    is queued inside vLLM when the slot frees; adapter 1 takes no newcomers meanwhile (its
    slot is promised), and the distinct adapters in vLLM never exceed the slots by more than
    the one leaving."""

    async def scenario():
        gate = DeviceGate(lambda: 1, early=lambda: True)
        await gate.enter(1, pinned=False)
        second = asyncio.ensure_future(gate.enter(2, pinned=False))
        await asyncio.sleep(0)
        assert not second.done()
        gate.finishing(1)
        await asyncio.wait_for(second, timeout=1)  # before adapter 1 has left
        again = asyncio.ensure_future(gate.enter(1, pinned=False))
        third = asyncio.ensure_future(gate.enter(3, pinned=False))
        await asyncio.sleep(0)
        assert not again.done() and not third.done()  # no joining a slot handed on
        assert gate.active() == {1, 2}
        gate.leave(1, finishing=True)
        await asyncio.sleep(0)
        assert gate.active() == {2} and not again.done() and not third.done()
        gate.leave(2)
        await asyncio.sleep(0)
        assert len(gate.active()) == 1  # the freed slot went to one of the two
        assert again.done() != third.done()

    run(scenario())


def test_with_a_pin_a_slot_is_handed_on_only_once_it_is_free():
    """vLLM does not count pinned adapters among its max_loras: with a pin, letting a
    newcomer queue inside vLLM early could put one adapter too many in its batch."""

    async def scenario():
        gate = DeviceGate(lambda: 1, early=lambda: False)
        await gate.enter(1, pinned=False)
        second = asyncio.ensure_future(gate.enter(2, pinned=False))
        gate.finishing(1)
        await asyncio.sleep(0.01)
        assert not second.done()
        gate.leave(1, finishing=True)
        await asyncio.wait_for(second, timeout=1)
        assert gate.active() == {2}

    run(scenario())


@pytest.mark.parametrize("wide", [True, False])
def test_with_nothing_pinned_the_gate_opens_to_the_host_slots_and_vllm_picks_each_step(wide):
    """Wide (the default): as many adapters may have requests in vLLM as it has host slots
    (3 here), vLLM's scheduler picking ``max_loras`` (2) of them a step as stock does, and the
    node reports no more than ``max_loras`` of them in the device slots (L1). A pin narrows the
    gate to the free device slots (vLLM does not count pinned slots); ``GateRule(wide=False)``
    keeps it that narrow always."""

    async def scenario():
        tiers = EngineTiers(lambda: (2, 3), clock=lambda: 0.0, gate_rule=GateRule(wide=wide))
        for n in (1, 2, 3):
            tiers.add(CachedVersion(n), Resident(n, 1, 10, last_used=float(n)))
        width = 3 if wide else 2
        for lora_id in range(1, width + 1):
            await asyncio.wait_for(tiers.gate.enter(lora_id, pinned=False), timeout=1)
        one_more = asyncio.ensure_future(tiers.gate.enter(width + 1, pinned=False))
        await asyncio.sleep(0)
        assert not one_more.done(), "one adapter more than the gate's width was let in"
        tiers.gate.finishing(1)  # wide, nothing is handed on a step early: vLLM holds others
        await asyncio.sleep(0)
        assert one_more.done() != wide, "a finishing request's slot went early (or not)"
        if not wide:
            tiers.gate.leave(width + 1)
        assert len(tiers.device_set()) == 2  # vLLM runs max_loras of them a step
        assert tiers.device_set() == {width, width - 1}  # the most recently used
        one_more.cancel()
        for lora_id in range(1, width + 1):
            tiers.gate.leave(lora_id)
        tiers.pin(tiers.members[1])  # one device slot left for the rest
        await asyncio.wait_for(tiers.gate.enter(2, pinned=False), timeout=1)
        narrowed = asyncio.ensure_future(tiers.gate.enter(3, pinned=False))
        await asyncio.sleep(0)
        assert not narrowed.done(), "with a pin, a second unpinned adapter entered vLLM"
        narrowed.cancel()

    run(scenario())


def test_a_release_between_the_search_for_victims_and_the_wait_is_not_missed():
    """A load that found every version held reads ``releases()`` before its search and waits
    with it: a request that lets go in between (while the load awaited its removals' sends)
    wakes it at once. Waiting for the *next* release instead hung a node under prefetch: every
    request waited on that load, and no release ever came again."""

    async def scenario():
        tiers = EngineTiers(lambda: (1, 1))
        record = CachedVersion(1)
        tiers.add(record, Resident(1, 1, 10, last_used=0.0))
        tiers.hold(record)
        since = tiers.releases()  # the search: everything held
        tiers.release(record)  # a request lets go before the wait begins
        await asyncio.wait_for(tiers.wait_for_release(since), timeout=1)
        since = tiers.releases()
        waiting = asyncio.ensure_future(tiers.wait_for_release(since))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # nothing freed since: it waits
        tiers.drop(record)  # the version left the engine: its slot is free
        await asyncio.wait_for(waiting, timeout=1)

    run(scenario())


def test_loads_side_by_side_make_room_for_each_other_so_the_engine_never_overflows(world):
    """Several loads at once (``max_concurrent_loads``): each counts the versions the others
    are adding, and its removals reach the engine before its add, so vLLM's own LRU never
    has to choose (it could take an adapter a running request uses)."""
    cache, engine, version = world
    cache.limits = Limits(max_pending=8, max_loads=2)

    async def scenario():
        for n in (1, 2, 3):  # the stand-in's three host slots, full
            await cache.activate(version(n))
        engine.add_delay = 0.05
        # a lone add waits for a second one (at most 5 s): under a serial cache none comes.
        # (Without this, a CI run beside two other lanes landed the versions too far apart
        # for two 50 ms adds to overlap.)
        engine.wait_for_company = 5.0
        await asyncio.gather(*(cache.activate(version(n)) for n in (4, 5, 6, 7)))

    run(scenario())
    assert engine.most_adding == 2  # the loads did run side by side
    assert engine.peak == engine.settings.max_cpu_loras  # and never overflowed the engine
    held = {n for n in range(1, 8) if cache.holds(n)}
    assert held == engine.resident and len(held) == 3
    # every add past the three slots came with one removal (an unheld fresh version may be
    # evicted and loaded again before its caller resumes: more of both, never an overflow)
    assert len(engine.adds) - len(engine.removed) == 3


def slot_order(first: tuple[str, int], then: list[tuple[str, int]]) -> list[str]:
    """The order in which one load slot (``cache/loads.py``) serves ``then`` (name, bytes),
    each asked for while ``first`` holds the slot."""
    from apps.serving.cache.loads import SizedSlots

    order: list[str] = []

    async def scenario():
        slots = SizedSlots(1)
        release = asyncio.Event()

        async def load(name: str, size: int, hold: asyncio.Event | None = None) -> None:
            async with slots.slot(size):
                order.append(name)
                if hold is not None:
                    await hold.wait()

        tasks = [asyncio.ensure_future(load(*first, release))]
        for name, size in then:
            await asyncio.sleep(0)
            tasks.append(asyncio.ensure_future(load(name, size)))
        await asyncio.sleep(0)
        assert order == [first[0]] and len(slots.waiting) == len(then)
        release.set()
        await asyncio.gather(*tasks)

    run(scenario())
    return order


def test_a_small_adapter_does_not_wait_behind_large_ones_in_the_load_queue():
    """One load at a time (the engine-add and fetch slots): a small version asked for after
    three large ones loads before them (their bytes would be its wait)."""
    mb = 1 << 20
    then = [("large-1", 80 * mb), ("large-2", 71 * mb), ("large-3", 80 * mb), ("small", 20 * mb)]
    order = slot_order(("large-0", 80 * mb), then)
    assert order == ["large-0", "small", "large-2", "large-1", "large-3"], order


def test_a_large_load_passed_over_too_often_goes_next_whatever_its_size():
    from apps.serving.cache.loads import MAX_PASSED

    smalls = [(f"small-{i}", 1) for i in range(MAX_PASSED + 3)]
    order = slot_order(("holder", 1), [("large", 100), *smalls])
    assert order.index("large") == 1 + MAX_PASSED, order  # after MAX_PASSED smaller ones
    assert len(order) == MAX_PASSED + 5


def test_a_version_whose_demand_rises_is_loaded_before_its_next_request(world):
    """Prefetch from demand (``node/demand.py``): a version asked for more and more often
    is brought back into the engine ahead of its next request; one asked for at a steady
    rate, or too rarely to be a trend, is left to its requests."""
    from apps.serving.node.demand import LONG_S, MIN_REQUESTS, Demand

    cache, engine, version = world
    now = [1000.0]
    demand = Demand(clock=lambda: now[0])
    owner = Owner(tenant_id=1)
    for t in range(0, int(LONG_S), 10):  # version 2: one request every 10 s, for long
        now[0] = 1000.0 + t
        demand.arrived(version(2), owner)
    now[0] = 1000.0 + LONG_S
    for _ in range(MIN_REQUESTS):  # version 1: nothing, then a burst
        demand.arrived(version(1), owner)
        now[0] += 1
    demand.arrived(version(3), owner)  # version 3: one request is not a trend

    assert [r.version_id for r, _ in demand.rising()] == [1]

    async def scenario():
        started = await demand.prefetch(cache)
        await cache.versions.get(1).loading
        return started

    assert run(scenario()) == 1
    assert engine.adds == [1]
    assert cache.versions.get(1).engine is not None
    assert run(demand.prefetch(cache)) == 0, "a version in the engine was loaded again"
    # rolled back: the node takes it out and marks it; its demand does not bring it back
    cache.deprecate(1)
    assert run(cache.unload(1))
    assert run(demand.prefetch(cache)) == 0, "a version no alias serves was prefetched"
    assert engine.adds == [1]


def test_a_prefetch_takes_only_room_nobody_uses_and_leaves_a_waited_for_version_alone(world):
    """A prefetch is a guess: with every host slot held it starts nothing (it never waits for
    a release, nor takes a slot a request needs), and a version a placed request already
    waits for is left to that request, whose own step loads it. Once a slot is idle and no
    request waits, the rising version is prefetched into it."""
    from apps.serving.node.demand import LONG_S, MIN_REQUESTS, Demand

    cache, engine, version = world
    now = [1000.0 + LONG_S]
    demand = Demand(clock=lambda: now[0])
    for _ in range(MIN_REQUESTS):  # version 1: nothing, then a burst
        demand.arrived(version(1), Owner(tenant_id=1))
        now[0] += 1

    async def scenario():
        for n in (4, 5, 6):  # every host slot, held by a request
            await cache.activate(version(n), hold=True)
        engine.adds.clear()
        assert await demand.prefetch(cache) == 0, "a prefetch took a slot a request holds"
        cache.release(6)
        await cache.prepare(version(1))  # a request for it is placed and waits for a seat
        assert await demand.prefetch(cache) == 0, "a waited-for version was prefetched"
        cache.stop_waiting(1)
        assert await demand.prefetch(cache) == 1
        await cache.versions.get(1).loading

    run(scenario())
    assert engine.adds == [1] and engine.removed == [6]


def test_the_engine_keeps_to_its_byte_budget_before_its_slot_count(world):
    """L2's budget is in bytes (``cpu_warm.max_memory_gb``), not only in adapters: with room
    for 8 adapters by count but 2 by bytes, a third version evicts one; the most the engine
    ever held, by bytes, stays under the budget."""
    cache, engine, version = world
    engine.settings.max_cpu_loras = 8
    size = version(1).size_bytes
    cache.limits = replace(cache.limits, warm_bytes=2 * size + size // 2)

    async def scenario():
        for n in (1, 2, 3):
            await cache.activate(version(n))

    run(scenario())
    assert engine.adds == [1, 2, 3]
    assert len(engine.removed) == 1 and engine.removed[0] in (1, 2)
    assert len(engine.resident) == 2 and engine.peak == 2  # the eviction went first


def test_a_cold_request_boards_with_the_room_made_and_no_add_before_it(world):
    """One boundary per cold load: ``prepare`` lands the version on disk only; ``board``
    books it in the engine, holds it and sends the removal of the policy's victim before
    returning (the request's own step then loads it): no ``add_lora`` at all."""
    cache, engine, version = world

    async def scenario():
        for n in (1, 2, 3):  # the engine's three host slots, filled
            await cache.activate(version(n))
        engine.adds.clear()
        placed = await cache.prepare(version(4))
        assert placed.tier == "L4" and not cache.holds(4) and engine.removed == []
        loaded = await cache.board(version(4), placed=placed)
        return loaded

    loaded = run(scenario())
    assert loaded == "L3" and cache.holds(4) and cache.in_use(4) == 1
    assert engine.adds == [] and engine.removed == [1]  # LRU's victim, out before the request
    assert cache.boundaries == {2: 3, 1: 1}
    cache.release(4)
    assert cache.in_use(4) == 0


def test_a_request_lets_go_of_its_version_as_vllm_finishes_it_not_when_its_response_ends(world):
    """The hold goes with the device slot (``Placement.leave_engine``): vLLM is done with the
    adapter when the request finishes there, and a stream still writing its last bytes must
    not keep a host slot from the next adapter's request; the response's end then releases
    nothing twice."""
    cache, _, version = world
    placement = Placement(cache=cache, config=None, metrics=None, demand=None)  # type: ignore[arg-type]

    async def scenario():
        placed = await cache.prepare(version(1))
        trace = RequestTrace(resolved=version(1), placed=placed, owner=Owner(tenant_id=1))
        trace.held, trace.active = placed.handle.lora_id, True
        await placement.board(trace)
        assert cache.in_use(1) == 1
        placement.leave_engine(trace)  # vLLM finished it; its response is still being written
        assert cache.in_use(1) == 0
        placement.let_go(trace)  # the response ended
        assert cache.in_use(1) == 0 and cache.versions.get(1).waiting == 0

    run(scenario())


def test_a_waiting_request_does_not_protect_its_version_while_the_engine_needs_room(world):
    """Every version in the engine has a placed request waiting for a seat: an add that
    needs room evicts one of them at once (before, a waiting request held its version and
    the add waited for a request to end). The evicted version's request loads it again when
    it boards."""
    cache, engine, version = world

    async def scenario():
        placed = {}
        for n in (1, 2, 3):
            await cache.activate(version(n))
            placed[n] = await cache.prepare(version(n))  # waiting for a seat
        await asyncio.wait_for(cache.activate(version(4)), timeout=2)
        (gone,) = {1, 2, 3} - {n for n in (1, 2, 3) if cache.holds(n)}
        boarded = {n: await cache.board(version(n), placed=placed[n]) for n in (1, 2, 3)}
        return gone, boarded

    gone, boarded = run(scenario())
    assert engine.removed[0] == gone
    assert boarded[gone] == "L3"  # placed again: loaded with its request
    assert all(boarded[n] is None for n in (1, 2, 3) if n != gone)


def test_a_version_with_waiting_requests_is_the_last_choice_of_victim(world):
    cache, engine, version = world

    async def scenario():
        for n in (1, 2, 3):
            await cache.activate(version(n))
        await cache.prepare(version(1))  # 1 is LRU's first choice, but a request waits for it
        await cache.activate(version(4))

    run(scenario())
    assert engine.removed == [2] and cache.holds(1)


def test_an_idle_scrub_finds_a_rotten_copy_and_it_lands_again_on_its_next_use(world):
    """The stat check of a load cannot see bytes that rot beneath the filesystem; the scrub
    re-hashes, drops the copy (counted as an L3 failure), and the next request lands it again
    from the registry. With ``verify_checksum`` (the forced check) the load itself sees it."""
    cache, _, version = world
    failures: list[tuple[str, str]] = []
    cache.landing.on_integrity_failure = lambda resolved, tier, why: failures.append((tier, why))

    def rot(n: int) -> None:
        path = cache.disk.folder(version(n)) / "adapter_model.safetensors"
        st = path.stat()
        with path.open("r+b") as fh:  # one byte, every stat field put back but ctime
            fh.seek(st.st_size // 2)
            byte = fh.read(1)
            fh.seek(st.st_size // 2)
            fh.write(bytes([byte[0] ^ 1]))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        seal = cache.disk._seals[path.parent][path.name]
        seal["ctime_ns"] = path.stat().st_ctime_ns  # as if beneath the filesystem

    async def scenario():
        await cache.prepare(version(1))
        cache.stop_waiting(1)
        rot(1)
        assert cache.landing.checked_now(version(1)) is not None  # stat check: fooled
        assert "does not match its seal" in cache.landing.scrub_one()
        assert failures == [("L3", failures[0][1])] and not cache.disk.has(version(1))
        again = await cache.prepare(version(1))
        assert again.tier == "L4"  # landed afresh
        cache.stop_waiting(1)
        await cache.prepare(version(2))
        cache.stop_waiting(2)
        rot(2)
        cache.limits = replace(cache.limits, verify_checksum=True)
        forced = await cache.prepare(version(2))
        assert forced.tier == "L4" and failures[-1][0] == "L3"

    run(scenario())
    assert cache.landing.scrub_one() is None  # what is left is sound


def test_a_request_cancelled_while_it_boards_never_keeps_a_hold(world):
    """A request cancelled at any point of ``board`` (its client gone) either boarded — the
    hold is its, released by its caller — or did not, and holds nothing: a hold kept by a
    cancelled request would keep its version in the engine for ever (an alias change then
    waits its whole patience for it to leave)."""
    cache, _, version = world

    async def scenario():
        for n in (1, 2, 3):  # full: boarding a cold version makes room first
            await cache.activate(version(n))
        outcomes = []
        for k in range(6):  # cancelled after k turns of the loop
            n = 10 + k
            placed = await cache.prepare(version(n))
            boarding = asyncio.ensure_future(cache.board(version(n), placed=placed))
            for _ in range(k):
                await asyncio.sleep(0)
            boarding.cancel()
            try:
                await boarding
                outcomes.append(("boarded", cache.in_use(n)))
                cache.release(n)
            except asyncio.CancelledError:
                cache.stop_waiting(n)
                outcomes.append(("cancelled", cache.in_use(n)))
        return outcomes

    outcomes = run(scenario())
    assert ("cancelled", 1) not in outcomes, outcomes
    assert all(held == (what == "boarded") for what, held in outcomes), outcomes
