"""One set of tier rules: a trace replayed (``replay/simulate.py``) and the same requests
through the node's own cache manager (a stand-in engine, the real disk tier, the real policy
objects) give the same tier for every request, the same engine loads and the same evictions
from each tier, under every policy the node ships.

Both drive ``cache/book.py``'s ``TierBook``; the manager here runs on the trace's clock (and
a timer that reads no time, so a load's measured cost is the replay's free one), so that
time-weighted policies see the same ages on both sides. The real-engine version of this check
replays a live node's request log
(``test_cache_node.py::test_replaying_the_node_s_own_request_log_reproduces_the_tiers_it_reported``).
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from dataclasses import replace

import pytest

from apps.registry import signing
from apps.registry.storage import LocalStore
from apps.serving.cache import policies
from apps.serving.cache.engine_tiers import Owner
from apps.serving.cache.manager import CacheManager, Limits
from apps.serving.cache.policies import POLICIES, make_policy
from apps.serving.replay.simulate import Capacity, Costs, VirtualClock, simulate
from apps.serving.replay.traces import Adapter, Trace
from tests.helpers import signed_version
from tests.serving.cache.stand_in import StandInEngine

FREE = Costs(base_ttft_ms=0, l2_ms=0, l3_ms=0, l3_ms_per_mb=0, l4_ms=0, l4_ms_per_mb=0)
# Two tenants' adapters; A and B popular, the rest passing through two device slots, three
# engine slots and a disk that holds four versions. Gaps vary, so that idle time matters.
SEQUENCE = "AABACADBEAFBAGCHABDAEFAGHBCAHHGEDCBAFAEA"
GAPS = [1.0, 7.0, 3.0, 45.0, 2.0, 13.0, 90.0, 5.0]
TENANT_B = set("EGH")
PRIORITY = {1: 0, 2: 2}  # batch and premium: the weighted policy counts it


def test_the_equivalence_below_covers_every_policy_the_node_ships():
    shipped = {
        cls
        for _, cls in inspect.getmembers(policies, inspect.isclass)
        if issubclass(cls, policies.Policy) and cls is not policies.Policy
    }
    covered = {type(make_policy(name)) for name in POLICIES}
    assert shipped - covered <= {policies.Weighted}, shipped - covered  # the default's setting


def arrivals() -> list[float]:
    at, t = [], 0.0
    for i in range(len(SEQUENCE)):
        t += GAPS[i % len(GAPS)]
        at.append(t)
    return at


@pytest.mark.parametrize("policy", POLICIES)
def test_a_replay_and_the_live_cache_manager_agree_on_every_request(tmp_path, demo_dir, policy):
    key = signing.load_private_key(signing.generate_private_key_pem())
    store = LocalStore(tmp_path / "registry")
    base, public = signed_version(
        store, demo_dir / "adapters" / "support-v1", "tenants/t/adapters/support/v1", key
    )
    names = sorted(set(SEQUENCE))
    versions = {
        name: replace(
            base,
            version_id=n + 1,
            version=f"v{n + 1}",
            tenant_id=2 if name in TENANT_B else 1,
        )
        for n, name in enumerate(names)
    }
    size = base.size_bytes
    engine = StandInEngine()  # 2 device slots, 3 engine slots
    evicted: Counter[str] = Counter()
    clock = VirtualClock()
    cache = CacheManager(
        engine=engine,  # type: ignore[arg-type]
        store=store,
        root=tmp_path / "disk",
        public_keys=lambda: public,
        policy=make_policy(policy),
        limits=Limits(disk_bytes=4 * size + size // 2, warm_bytes=100 * size),
        on_evict=lambda tier, tenant: evicted.update([tier]),
        clock=clock,
        timer=lambda: 0.0,
    )
    at = arrivals()

    async def requests() -> list[str]:
        tiers = []
        for name, now in zip(SEQUENCE, at, strict=True):
            clock.now = now
            resolved = versions[name]
            owner = Owner(tenant_id=resolved.tenant_id, priority=PRIORITY[resolved.tenant_id])
            placed = await cache.activate(resolved, owner=owner, hold=True)
            tiers.append(placed.tier)
            await cache.enter_engine(placed.handle.lora_id)  # as a request does
            cache.leave_engine(placed.handle.lora_id)
            cache.release(placed.handle.lora_id)
        return tiers

    live = asyncio.run(requests())

    trace = Trace(
        name="equivalence",
        description="the same requests",
        adapters={
            v.version_id: Adapter(v.version_id, v.tenant_id, size, name)
            for name, v in versions.items()
        },
        priorities=PRIORITY,
        at=at,
        keys=[versions[name].version_id for name in SEQUENCE],
    )
    capacity = Capacity(
        l1_slots=engine.settings.max_loras,
        l2_slots=engine.settings.max_cpu_loras,
        l2_bytes=100 * size,
        l3_bytes=4 * size + size // 2,
    )
    replayed = simulate(trace, make_policy(policy), capacity, FREE, record_tiers=True)

    assert {"L1", "L2", "L3", "L4"} <= set(live), live  # every tier took part
    assert replayed.tier_log == live
    assert replayed.loads == len(engine.adds)
    assert replayed.evictions["L2"] == evicted["L2"] > 0
    assert replayed.evictions["L3"] == evicted["L3"] > 0
