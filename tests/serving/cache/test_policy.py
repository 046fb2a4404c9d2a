"""Unit tests of the eviction policies on hand-built residents (pure logic, no engine)."""

from __future__ import annotations

import pytest

from apps.serving.cache.policies import (
    GDSF,
    LFU,
    LRU,
    SETTINGS,
    Adaptive,
    Linear,
    Resident,
    Weighted,
    Weights,
    guaranteed_shares,
    make_policy,
    rank,
    select_victims,
)

MB = 1024 * 1024
NOW = 10_000.0


def resident(
    name,
    *,
    tenant=1,
    size_mb=10,
    idle_s=0,
    hits=0,
    cost_ms=10,
    priority=1,
    deprecated=False,
    pinned=False,
):
    return Resident(
        version_id=name,
        tenant_id=tenant,
        size_bytes=int(size_mb * MB),
        last_used=NOW - idle_s,
        hits=hits,
        reload_cost_ms=cost_ms,
        tenant_priority=priority,
        deprecated=deprecated,
        pinned=pinned,
    )


def evict_order(policy, residents, pressure=0.0):
    return [
        r.version_id
        for r in sorted(residents, key=lambda r: policy.score(r, NOW, pressure), reverse=True)
    ]


# The seed's rule of thumb: high-frequency, small, high-priority, slow-to-load adapters stay;
# low-frequency, large, low-priority, cheap-to-reload ones go.
KEEPER = dict(size_mb=20, hits=50, priority=2, cost_ms=800)
GOER = dict(size_mb=160, hits=1, priority=0, cost_ms=5)


@pytest.mark.parametrize(
    "policy", [Weighted(), Linear(), GDSF()], ids=["weighted", "linear", "gdsf"]
)
def test_the_seeds_rule_of_thumb_holds_even_when_the_keeper_is_idler(policy):
    keeper = resident("keeper", idle_s=300, **KEEPER)
    goer = resident("goer", idle_s=30, **GOER)
    assert evict_order(policy, [keeper, goer])[0] == "goer"


def test_plain_lru_gets_the_same_case_wrong():
    keeper = resident("keeper", idle_s=300, **KEEPER)
    goer = resident("goer", idle_s=30, **GOER)
    assert evict_order(LRU(), [keeper, goer])[0] == "keeper"


def test_each_factor_alone_moves_the_linear_score_the_right_way():
    w = Linear()
    base = resident("x", idle_s=60, hits=5)
    worse = {
        "idle": resident("x", idle_s=600, hits=5),
        "size": resident("x", idle_s=60, hits=5, size_mb=100),
        "fewer hits": resident("x", idle_s=60, hits=1),
        "lower priority": resident("x", idle_s=60, hits=5, priority=0),
        "cheaper reload": resident("x", idle_s=60, hits=5, cost_ms=1),
        "deprecated": resident("x", idle_s=60, hits=5, deprecated=True),
    }
    for why, r in worse.items():
        assert w.score(r, NOW) > w.score(base, NOW), why


def test_each_factor_alone_moves_the_default_score_the_right_way():
    w = Weighted()
    base = resident("x", idle_s=60, hits=5, size_mb=30)
    worse = {
        "idle": resident("x", idle_s=600, hits=5, size_mb=30),
        "bigger (per megabyte kept)": resident("x", idle_s=60, hits=5, size_mb=100),
        "fewer hits": resident("x", idle_s=60, hits=1, size_mb=30),
        "lower priority": resident("x", idle_s=60, hits=5, priority=0, size_mb=30),
    }
    for why, r in worse.items():
        assert w.score(r, NOW) > w.score(base, NOW), why
    # deprecated versions go first under every policy (rank puts them before the rest)
    gone = resident("x", idle_s=0, hits=50, size_mb=30, deprecated=True)
    assert rank([base, gone], policy=w, now=NOW)[0] is gone


def test_the_default_weighs_a_steady_adapter_above_a_one_off_used_just_now():
    w = Weighted()
    steady = resident("steady", idle_s=90, hits=12)  # used often, lately not at all
    one_off = resident("one-off", idle_s=1, hits=1)
    assert evict_order(w, [steady, one_off])[0] == "one-off"
    faded = resident("faded", idle_s=3600, hits=12)  # an hour idle: 30 recency half-lives
    assert evict_order(w, [faded, one_off])[0] == "faded"


def test_the_default_order_never_changes_between_accesses():
    """Its retention key is fixed: the ranking now and an hour later is the same, so a cache
    may keep residents in a heap (the replay does)."""
    w = Weighted()
    pool = [
        resident(f"r{i}", idle_s=i * 37 % 500, hits=1 + i % 7, size_mb=10 + i * 3, priority=i % 3)
        for i in range(20)
    ]
    now_order = [r.version_id for r in rank(pool, policy=w, now=NOW)]
    later_order = [r.version_id for r in rank(pool, policy=w, now=NOW + 3600)]
    assert now_order == later_order
    assert now_order == [r.version_id for r in sorted(pool, key=w.retention)]


def test_queue_pressure_weighs_idle_time_up():
    w = Linear(Weights(memory=0.0, hits=0.0, priority=0.0, reload=0.0))
    idle = resident("idle", idle_s=600)
    assert w.score(idle, NOW, pressure=1.0) == pytest.approx(2 * w.score(idle, NOW, pressure=0.0))


def test_lfu_evicts_the_least_used_and_frequency_decays_with_idle_time():
    frequent = resident("frequent", hits=40, idle_s=10)
    rare = resident("rare", hits=2, idle_s=10)
    assert evict_order(LFU(), [frequent, rare])[0] == "rare"
    long_ago = resident("long-ago", hits=40, idle_s=6 * 3600)  # 36 half-lives later
    assert evict_order(LFU(), [long_ago, rare])[0] == "long-ago"


def test_touch_adds_a_hit_to_the_decayed_count():
    r = resident("x", hits=8, idle_s=600)  # one half-life idle
    assert r.touched(NOW).hits == pytest.approx(5.0)
    assert r.touched(NOW).last_used == NOW


def test_gdsf_clock_rises_to_each_victim_so_old_values_age_out():
    policy = GDSF()
    a = resident("a", hits=3, cost_ms=100, size_mb=10)
    assert policy.clock == 0
    policy.on_evict(a, NOW)
    assert policy.clock == pytest.approx((3 + 1) * 100 / 10)  # (hits + 1) * cost / size
    fresh = resident("fresh", hits=0, cost_ms=10, size_mb=10)
    assert policy.value(fresh, NOW) > policy.clock


def test_gdsf_a_resident_untouched_since_the_clock_rose_goes_before_a_fresh_equal_one():
    policy = GDSF()
    old = resident("old", hits=1, cost_ms=10, size_mb=10, idle_s=60)
    policy.value(old, NOW)  # known while the clock was 0
    policy.on_evict(resident("victim", hits=3, cost_ms=100, size_mb=10), NOW)
    fresh = resident("fresh", hits=1, cost_ms=10, size_mb=10, idle_s=60)  # first seen now
    assert policy.score(old, NOW) > policy.score(fresh, NOW)
    touched = old.touched(NOW)  # an access re-bases it on the current clock
    assert policy.score(touched, NOW) < policy.score(fresh, NOW)


def test_a_tenant_at_its_quota_makes_room_from_its_own_even_when_the_cache_has_room():
    residents = [resident("a1", tenant=1, idle_s=5), resident("a2", tenant=1, idle_s=1)]
    victims = select_victims(
        residents, policy=LRU(), now=NOW, capacity=8, requester=1, quotas={1: 2}
    )
    assert [v.version_id for v in victims] == ["a1"]


def test_policies_are_selected_by_name():
    assert isinstance(make_policy("weighted_lru"), Adaptive)
    assert isinstance(make_policy("linear"), Linear)
    assert {make_policy(n).name for n in ("lru", "lfu", "weighted", "gdsf", "linear")} == {
        "lru",
        "lfu",
        "weighted",
        "gdsf",
        "linear",
    }
    with pytest.raises(ValueError, match="unknown eviction policy 'random'"):
        make_policy("random")


def test_pinned_residents_are_never_chosen():
    residents = [resident("pinned", idle_s=9999, pinned=True), resident("busy", hits=100)]
    victims = select_victims(residents, policy=LRU(), now=NOW, capacity=2)
    assert [v.version_id for v in victims] == ["busy"]
    only_pinned = [resident("p1", pinned=True), resident("p2", pinned=True)]
    assert select_victims(only_pinned, policy=LRU(), now=NOW, capacity=2) == []


def test_no_victims_while_there_is_room():
    assert select_victims([resident("a")], policy=LRU(), now=NOW, capacity=2) == []


def test_a_tenant_at_its_quota_displaces_its_own_lowest_value_adapter():
    residents = [
        resident("a1", tenant=1, idle_s=10),
        resident("a2", tenant=1, idle_s=20),
        resident("b1", tenant=2, idle_s=900),
    ]
    victims = select_victims(
        residents, policy=LRU(), now=NOW, capacity=3, requester=1, quotas={1: 2}
    )
    assert [v.version_id for v in victims] == ["a2"]


def test_a_burst_cannot_push_another_tenant_below_its_guaranteed_share():
    # capacity 8: half (4) is reserved, split by priority+1 between tenant 1 (p2) and 2 (p0)
    shares = guaranteed_shares(8, {1: 2, 2: 0})
    assert shares == {1: 3, 2: 1}
    residents = [resident(f"a{i}", tenant=1, idle_s=1, priority=2) for i in range(6)] + [
        resident("b0", tenant=2, idle_s=5000, priority=0),
        resident("b1", tenant=2, idle_s=4000, priority=0),
    ]
    # tenant 1 bursts and needs 3 more slots; tenant 2's two adapters are the idlest
    victims = select_victims(
        residents, policy=LRU(), now=NOW, capacity=8, requester=1, slots_needed=3, quotas={1: 10}
    )
    names = [v.version_id for v in victims]
    assert "b0" in names  # above its share: may go
    assert "b1" not in names  # its last guaranteed slot stays
    assert len(names) == 3  # the rest of the room comes from tenant 1's own adapters


def test_normalised_weighted_selection_keeps_the_keeper_among_many():
    """Through select_victims the factors are scaled to the candidates; the rule still holds."""
    keeper = resident("keeper", idle_s=300, **KEEPER)
    goer = resident("goer", idle_s=30, **GOER)
    others = [resident(f"o{i}", idle_s=60 + i, hits=10, size_mb=30, cost_ms=200) for i in range(6)]
    victims = select_victims([keeper, goer, *others], policy=Linear(), now=NOW, capacity=8)
    assert [v.version_id for v in victims] == ["goer"]


@pytest.mark.parametrize("policy", [LRU(), LFU(), Weighted(), GDSF()], ids=lambda p: p.name)
def test_a_deprecated_version_goes_first_under_every_policy(policy):
    residents = [
        resident("old-idle", idle_s=600, hits=0),
        resident("replaced", idle_s=0, hits=9, deprecated=True),
    ]
    victims = select_victims(residents, policy=policy, now=NOW, capacity=2)
    assert [v.version_id for v in victims] == ["replaced"]


# --- the default: three Weighted settings, judged by which victim comes back first ----------

OFTEN = Weighted(half_life_s=3600, recency_half_life_s=3600)  # frequency decides
LATELY = Weighted(half_life_s=3600, recency_half_life_s=10)  # recency decides


def penalties(policy):
    """Each setting's faded penalty as of now (the policy stores them scaled)."""
    return [s["penalty"] for s in policy.describe()["settings"]]


def disagreement(policy):
    """x: used five times, then idle for a minute and a half; y: used once, just now. The
    cache (two places) is full and must make room: OFTEN evicts y, LATELY evicts x."""
    for t in range(5):
        policy.observe("x", float(t))
    policy.observe("y", 100.0)
    pool = [
        Resident("x", 1, MB, 4.0, 5.0),
        Resident("y", 1, MB, 100.0, 1.0),
    ]
    return select_victims(pool, policy=policy, now=101.0, capacity=2, slots_needed=1)


def test_the_default_s_setting_whose_victim_comes_back_first_is_penalised():
    policy = Adaptive(experts=(OFTEN, LATELY), judge_every=1)
    victims = disagreement(policy)
    assert [v.version_id for v in victims] == ["y"]  # the active setting (OFTEN) decided
    assert penalties(policy) == [0.0, 0.0]  # open until x or y is requested again
    policy.observe("y", 102.0)  # y first: OFTEN's eviction would have cost this miss
    assert penalties(policy) == [1.0, 0.0]
    assert policy.active == 1 and policy.switches == 1
    policy.observe("x", 103.0)  # already settled: nothing more
    assert penalties(policy) == [1.0, 0.0]


def test_the_default_keeps_its_setting_when_the_other_s_victim_comes_back_first():
    policy = Adaptive(experts=(OFTEN, LATELY), judge_every=1)
    disagreement(policy)
    policy.observe("x", 102.0)  # x first: LATELY's choice was the wrong one
    assert penalties(policy) == [0.0, 1.0]
    assert policy.active == 0 and policy.switches == 0


def test_settings_that_agree_teach_the_default_nothing():
    policy = Adaptive(experts=(OFTEN, Weighted(half_life_s=3600, recency_half_life_s=1800)))
    policy.judge_every = 1
    disagreement(policy)
    policy.observe("y", 102.0)
    assert penalties(policy) == [0.0, 0.0] and policy.describe()["judged"] == 0


def test_penalties_fade_so_recent_evidence_outweighs_old():
    policy = Adaptive(experts=(OFTEN, LATELY), judge_every=1, memory=0.5)
    disagreement(policy)
    policy.observe("y", 102.0)  # one against OFTEN: LATELY takes over...
    assert policy.active == 1
    for round_ in range(2):  # ...then two against LATELY (x comes back first each time)
        t = 200.0 * (round_ + 1)
        x, y = f"x{round_}", f"y{round_}"
        for i in range(5):
            policy.observe(x, t + i)
        policy.observe(y, t + 100)
        pool = [Resident(x, 1, MB, t + 4, 5.0), Resident(y, 1, MB, t + 100, 1.0)]
        select_victims(pool, policy=policy, now=t + 101, capacity=2, slots_needed=1)
        policy.observe(x, t + 102)
    # each disagreement halves what came before: OFTEN 1 x 0.5 x 0.5, LATELY 1 x 0.5 + 1
    assert penalties(policy) == [0.25, 1.5]
    assert policy.active == 0 and policy.switches == 2


def test_the_default_ships_three_settings_and_judges_one_eviction_in_four():
    policy = make_policy("weighted")
    assert isinstance(policy, Adaptive)
    assert [(x.half_life_s, x.recency_half_life_s) for x in policy.experts] == list(
        SETTINGS.values()
    )
    assert [policy.judging() for _ in range(8)] == [False, False, False, True] * 2
    with pytest.raises(ValueError, match="memory"):
        Adaptive(memory=0)
