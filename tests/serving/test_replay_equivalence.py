"""One tier model: a trace replayed (``replay/simulate.py``) and the same requests through the
node's own cache manager (a stand-in engine, the real disk tier and policy objects) give the
same tier for every request, the same engine loads and the same evictions from each tier.

The real-engine version of this check replays a live node's request log
(``test_cache_node.py::test_replaying_the_node_s_own_request_log_reproduces_the_tiers_it_reported``);
this one is fast enough to run for every policy whose decisions do not depend on measured load
times, and it includes a byte cap on the disk tier, so L3 evictions are compared too.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace

import pytest

from apps.registry import signing
from apps.registry.storage import LocalStore
from apps.serving.cache.engine_tiers import Owner
from apps.serving.cache.manager import CacheManager, Limits
from apps.serving.cache.policies import make_policy
from apps.serving.replay.simulate import Capacity, Costs, replay
from apps.serving.replay.traces import Adapter, Trace
from tests.helpers import signed_version
from tests.serving.test_cache_manager import StandInEngine

FREE = Costs(base_ttft_ms=0, l2_ms=0, l3_ms=0, l3_ms_per_mb=0, l4_ms=0, l4_ms_per_mb=0)
# Two tenants' adapters; A and B popular, the rest passing through two device slots, three
# engine slots and a disk that holds four versions.
SEQUENCE = "AABACADBEAFBAGCHABDAEFAGHBCA"
TENANT_B = set("EGH")


@pytest.mark.parametrize("policy", ["lru", "lfu"])
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
    cache = CacheManager(
        engine=engine,  # type: ignore[arg-type]
        store=store,
        root=tmp_path / "disk",
        public_keys=lambda: public,
        policy=make_policy(policy),
        limits=Limits(disk_bytes=4 * size + size // 2, warm_bytes=100 * size),
        on_evict=lambda tier, tenant: evicted.update([tier]),
    )

    async def requests() -> list[str]:
        tiers = []
        for name in SEQUENCE:
            resolved = versions[name]
            placed = await cache.activate(
                resolved, owner=Owner(tenant_id=resolved.tenant_id), hold=True
            )
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
        priorities={1: 1, 2: 1},
        at=[i * 0.001 for i in range(len(SEQUENCE))],
        keys=[versions[name].version_id for name in SEQUENCE],
    )
    capacity = Capacity(
        l1_slots=engine.settings.max_loras,
        l2_slots=engine.settings.max_cpu_loras,
        l2_bytes=100 * size,
        l3_bytes=4 * size + size // 2,
    )
    replayed = replay(trace, make_policy(policy), capacity, FREE, record_tiers=True)

    assert {"L1", "L2", "L3", "L4"} <= set(live), live  # every tier took part
    assert replayed.tier_log == live
    assert replayed.loads == len(engine.adds)
    assert replayed.evictions["L2"] == evicted["L2"] > 0
    assert replayed.evictions["L3"] == evicted["L3"] > 0
