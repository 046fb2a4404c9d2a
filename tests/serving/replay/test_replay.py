"""The trace replay (pure logic): hand-computed tier sequences for every policy, the offline
bound, and the replay running the node's own policy objects."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.serving.cache import book
from apps.serving.cache import policies as node_policy
from apps.serving.cache.policies import (
    POLICIES,
    Resident,
)
from apps.serving.replay import simulate as simulate_module
from apps.serving.replay import traces
from apps.serving.replay.offline import (
    Oracle,
    belady_hits,
    known_popularity_hits,
    model_learner_hits,
)
from apps.serving.replay.simulate import Capacity, Costs, simulate
from apps.serving.replay.traces import Adapter, Epoch, Trace

MB = 1024 * 1024
FREE = Costs(base_ttft_ms=50, l2_ms=0, l3_ms=0, l3_ms_per_mb=0, l4_ms=0, l4_ms_per_mb=0)


def trace_of(names: str, *, size_mb: int = 10, tenants: dict[str, int] | None = None) -> Trace:
    """One request per letter, one second apart; every adapter ``size_mb``."""
    keys = {name: n for n, name in enumerate(sorted(set(names)))}
    owners = tenants or {}
    return Trace(
        name=names,
        description="hand-built",
        adapters={
            k: Adapter(k, owners.get(name, 1), size_mb * MB, name) for name, k in keys.items()
        },
        priorities={t: 1 for t in {*owners.values(), 1}},
        at=[float(i) for i in range(len(names))],
        keys=[keys[name] for name in names],
    )


# A is used three times, then B and C arrive in a cache of two engine slots (one device slot).
# Recency alone (LRU, and the seed's linear formula, where A's idle time outweighs its hits)
# evicts A for C; the frequency-aware policies evict B, so A's return is an engine hit.
EXPECTED = {
    "lru": (["L4", "L1", "L1", "L4", "L4", "L3"], 2),
    "linear": (["L4", "L1", "L1", "L4", "L4", "L3"], 2),
    "lfu": (["L4", "L1", "L1", "L4", "L4", "L2"], 1),
    "gdsf": (["L4", "L1", "L1", "L4", "L4", "L2"], 1),
    "weighted": (["L4", "L1", "L1", "L4", "L4", "L2"], 1),
}


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_gives_the_hand_computed_tiers_and_evictions(policy):
    result = simulate(
        trace_of("AAABCA"), policy, Capacity(l1_slots=1, l2_slots=2), FREE, record_tiers=True
    )
    tiers, evictions = EXPECTED[policy]
    assert result.tier_log == tiers
    assert result.evictions == {"L2": evictions, "L3": 0}
    assert result.hits == tiers.count("L1") + tiers.count("L2")
    assert result.loads == tiers.count("L3") + tiers.count("L4")


def test_the_device_slots_hold_the_most_recently_used_versions():
    # two device slots in an engine of three: A B C A B C cycles within the engine
    result = simulate(
        trace_of("ABCABCA"), "lru", Capacity(l1_slots=2, l2_slots=3), FREE, record_tiers=True
    )
    assert result.tier_log == ["L4", "L4", "L4", "L2", "L2", "L2", "L2"]
    again = simulate(
        trace_of("ABAB"), "lru", Capacity(l1_slots=2, l2_slots=3), FREE, record_tiers=True
    )
    assert again.tier_log == ["L4", "L4", "L1", "L1"]


@pytest.mark.parametrize("policy", POLICIES)
def test_the_disk_tier_keeps_to_its_byte_cap_but_never_drops_what_the_engine_holds(policy):
    # one engine slot; the disk holds two 10 MB versions; A B C A — each landing past the
    # cap evicts the one on-disk version the engine does not hold
    result = simulate(
        trace_of("ABCA"),
        policy,
        Capacity(l1_slots=1, l2_slots=1, l3_bytes=25 * MB),
        FREE,
        record_tiers=True,
    )
    assert result.tier_log == ["L4", "L4", "L4", "L4"]  # A left the disk when C landed
    assert result.evictions == {"L2": 3, "L3": 2}
    assert result.peak_bytes["L3"] == 20 * MB  # the cap held after every landing
    assert result.peak_bytes["L2"] == 10 * MB


def test_a_prewarmed_disk_turns_first_uses_into_disk_loads_up_to_its_cap():
    """As a node whose disk was prewarmed (bench/many_adapters.py lands every version before
    its run): each version's first use is a load from L3, not a fetch from the registry, for
    as many versions as the disk holds, in order of first use."""
    names = "ABCDA"
    cold = simulate(
        trace_of(names), "lru", Capacity(l1_slots=1, l2_slots=1), FREE, record_tiers=True
    )
    warm = simulate(
        trace_of(names),
        "lru",
        Capacity(l1_slots=1, l2_slots=1, warm_disk=True),
        FREE,
        record_tiers=True,
    )
    capped = simulate(
        trace_of(names),
        "lru",
        Capacity(l1_slots=1, l2_slots=1, l3_bytes=25 * MB, warm_disk=True),
        FREE,
        record_tiers=True,
    )
    assert cold.tier_log == ["L4", "L4", "L4", "L4", "L3"]
    assert warm.tier_log == ["L3", "L3", "L3", "L3", "L3"]
    assert capped.tier_log[:3] == ["L3", "L3", "L4"]  # A and B fit the 25 MB cap, C did not
    assert "(prewarmed)" in Capacity(warm_disk=True).describe()


def test_requests_for_a_version_still_loading_wait_for_that_one_load():
    slow = Costs(base_ttft_ms=50, l3_ms=20, l3_ms_per_mb=0, l4_ms=80, l4_ms_per_mb=0)
    trace = trace_of("AA")
    trace.at = [0.0, 0.03]  # the second arrives 30 ms into A's 100 ms load
    result = simulate(trace, "lru", Capacity(l1_slots=1, l2_slots=2), slow, record_tiers=True)
    assert result.tier_log == ["L4", "L4"]  # both served by the one load from L4
    assert result.loads == 1 and result.hits == 0
    assert list(result.ttft_ms) == pytest.approx([150.0, 120.0])


def test_a_full_load_queue_makes_a_cold_request_wait_for_room():
    slow = Costs(base_ttft_ms=0, l3_ms=100, l3_ms_per_mb=0, l4_ms=0, l4_ms_per_mb=0)
    trace = trace_of("AB")
    trace.at = [0.0, 0.01]
    capacity = Capacity(l1_slots=1, l2_slots=2, max_pending=1, max_fetches=4, max_loads=4)
    result = simulate(trace, "lru", capacity, slow)
    assert result.queue_full == 1
    assert list(result.ttft_ms) == pytest.approx([100.0, 190.0])  # B starts when A is done


def test_a_tenant_at_its_warm_quota_displaces_its_own_versions_in_the_replay_too():
    trace = trace_of("XABC", tenants={"X": 2, "A": 1, "B": 1, "C": 1})
    capacity = Capacity(l1_slots=1, l2_slots=8, warm_quotas={1: 2})
    result = simulate(trace, "lru", capacity, FREE, record_tiers=True)
    assert result.evictions["L2"] == 1  # C displaced A, not X, though the cache had room


def test_the_replay_runs_the_node_s_policy_objects_and_select_victims():
    assert simulate_module.TierBook is book.TierBook  # the node's tier rules, not a copy

    class Spy(node_policy.LRU):
        def __init__(self) -> None:
            self.evicted: list[int] = []

        def on_evict(self, resident, now):
            self.evicted.append(resident.version_id)

    spy = Spy()
    simulate(trace_of("ABC"), spy, Capacity(l1_slots=1, l2_slots=1), FREE)
    assert spy.evicted == [0, 1]  # A, then B


def test_the_oracle_knows_each_version_s_next_request():
    trace = trace_of("ABAB")
    oracle = Oracle(trace)
    a_at_0 = Resident(version_id=0, tenant_id=1, size_bytes=MB, last_used=0.0)
    b_at_3 = Resident(version_id=1, tenant_id=1, size_bytes=MB, last_used=3.0)
    assert oracle.next_use(a_at_0) == 2.0
    assert oracle.next_use(b_at_3) == float("inf")


# --- the bound -----------------------------------------------------------------------------

sequences = st.lists(st.integers(min_value=0, max_value=7), min_size=1, max_size=80)


def brute_force_best(keys: tuple[int, ...], slots: int) -> int:
    """The most hits any eviction sequence gets (exhaustive; tiny inputs only)."""

    @functools.cache
    def best(i: int, cache: frozenset[int]) -> int:
        if i == len(keys):
            return 0
        key = keys[i]
        if key in cache:
            return 1 + best(i + 1, cache)
        if len(cache) < slots:
            return best(i + 1, cache | {key})
        return max(best(i + 1, (cache - {victim}) | {key}) for victim in cache)

    return best(0, frozenset())


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=12), st.integers(1, 3))
def test_belady_is_the_optimum_on_small_sequences(keys, slots):
    trace = trace_of("".join("ABCDE"[k] for k in keys))
    assert belady_hits(trace, slots) == brute_force_best(tuple(trace.keys), slots)


@settings(max_examples=60, deadline=None)
@given(sequences, st.integers(1, 6), st.sampled_from(POLICIES))
def test_no_policy_beats_belady_on_equal_sizes(keys, slots, policy):
    trace = trace_of("".join("ABCDEFGH"[k] for k in keys))
    result = simulate(trace, policy, Capacity(l1_slots=1, l2_slots=slots), FREE)
    assert result.hits <= belady_hits(trace, slots)


# --- the online ceiling: A0, which knows the popularity -------------------------------------


def with_popularity(names: str, *epochs: tuple[int, dict[str, float]]) -> Trace:
    trace = trace_of(names)
    keys = {name: n for n, name in enumerate(sorted(set(names)))}
    trace.popularity = [
        Epoch(start, np.array([p.get(name, 0.0) for name in sorted(keys)])) for start, p in epochs
    ]
    return trace


def test_a0_evicts_the_resident_least_popular_at_that_moment():
    # Two slots. At C's miss A (0.5) stays and B (0.3) goes, so A and C hit; at B's miss C
    # (0.2) goes, so the last A hits too: 3 hits.
    steady = {"A": 0.5, "B": 0.3, "C": 0.2}
    assert known_popularity_hits(with_popularity("ABCACBA", (0, steady)), 2) == 3
    # The ranking changes after the third request: at B's miss A is now the least popular and
    # goes, so the last A misses: 2 hits on the same sequence.
    shifted = {"C": 0.5, "A": 0.3, "B": 0.2}
    assert known_popularity_hits(with_popularity("ABCACBA", (0, steady), (3, shifted)), 2) == 2
    assert known_popularity_hits(trace_of("ABCACBA"), 2) is None  # no popularity: no ceiling


@settings(max_examples=100, deadline=None)
@given(
    sequences,
    st.integers(1, 6),
    st.lists(st.lists(st.floats(0, 1), min_size=8, max_size=8), min_size=1, max_size=4),
    st.data(),
)
def test_neither_a0_nor_the_model_aware_learner_beats_belady(keys, slots, weights, data):
    trace = trace_of("".join("ABCDEFGH"[k] for k in keys))
    order = sorted(set(trace.keys))
    starts = sorted({0, *data.draw(st.lists(st.integers(1, len(keys)), max_size=3))})
    trace.popularity = [
        Epoch(start, np.array([w[k] for k in order]))
        for start, w in zip(starts, itertools.cycle(weights), strict=False)
    ]
    assert known_popularity_hits(trace, slots) <= belady_hits(trace, slots)
    assert model_learner_hits(trace, slots) <= belady_hits(trace, slots)


def test_the_model_aware_learner_keeps_what_its_posterior_says_is_most_asked_for():
    # Two slots. A is asked for three times, B once: at C's miss the posterior puts A on the
    # 0.5 value, so B goes (where LRU would evict A) and B's return misses: 2 hits.
    steady = {"A": 0.5, "B": 0.3, "C": 0.2}
    assert model_learner_hits(with_popularity("AAABCB", (0, steady)), 2) == 2
    # Every adapter's value changes before B's request (a full reshuffle, which the learner is
    # told of): A's three requests say nothing any more, B has just been asked for and A not,
    # so at C's miss A goes and B's return hits: 3 hits.
    reshuffled = {"A": 0.2, "B": 0.5, "C": 0.3}
    assert model_learner_hits(with_popularity("AAABCB", (0, steady), (3, reshuffled)), 2) == 3
    assert model_learner_hits(trace_of("AAABCB"), 2) is None  # no popularity: nothing to learn


def test_a_generated_trace_keeps_the_popularity_its_requests_were_drawn_from():
    trace = traces.zipf(1.0, requests=40_000, drift=0.2, drift_every_s=600)
    assert trace.popularity is not None and len(trace.popularity) > 5
    bounds = [e.start for e in trace.popularity[1:]] + [len(trace)]
    for epoch, stop in zip(trace.popularity, bounds, strict=True):
        asked = np.bincount(trace.keys[epoch.start : stop], minlength=len(epoch.p))
        assert epoch.p.sum() == pytest.approx(1.0)
        # the epoch's most popular adapter is the one asked for most, at about its probability
        top = int(np.argmax(epoch.p))
        assert int(np.argmax(asked)) == top
        assert asked[top] / (stop - epoch.start) == pytest.approx(epoch.p[top], abs=0.03)
    # a slice keeps, for every request, the epoch in force when it was drawn
    tail = trace.tail(0.37)
    offset = len(trace) - len(tail)

    def in_force(popularity: list[Epoch], i: int) -> np.ndarray:
        return [e for e in popularity if e.start <= i][-1].p

    for i in range(0, len(tail), 997):
        assert in_force(tail.popularity, i) is in_force(trace.popularity, offset + i)


def held(names: str, at: list[float], held_s: list[float]) -> Trace:
    trace = trace_of(names)
    trace.at, trace.held_s = at, held_s
    return trace


def test_a_version_held_by_a_running_request_stays_and_the_load_waits_for_a_release():
    """As the node's ``_make_room``: a version generating cannot leave the engine, so with
    every resident held the load waits for the first request to end, and its victim is the
    version let go, not the policy's first pick. A request for the waiting version waits with
    it; one for the version that stayed is a hit."""
    # A (held until 1.0 s) and B (until 0.6 s) fill two engine slots when C arrives at 0.2 s
    trace = held("ABCCAB", [0.0, 0.1, 0.2, 0.3, 0.8, 0.9], [1.0, 0.5, 0.1, 0.1, 0.1, 0.1])
    capacity = Capacity(l1_slots=1, l2_slots=2)
    result = simulate(trace, "lru", capacity, FREE, record_tiers=True)
    assert result.tier_log == ["L4", "L4", "L4", "L4", "L2", "L3"]  # B went for C, A stayed
    assert list(result.ttft_ms[2:4]) == pytest.approx([450.0, 350.0])  # both until 0.6 s
    assert result.loads == 4 and result.evictions["L2"] == 2  # B at 0.6 s, then C for B
    # the same requests taking no time: LRU evicts A for C, so A's return is a load
    instant = simulate(trace_of("ABCCAB"), "lru", capacity, FREE, record_tiers=True)
    assert instant.tier_log[4] == "L3"


def test_a_version_is_held_until_its_last_running_request_ends():
    # A's first request runs until 2.0 s, its second (1.5 s) until 1.6 s: A is held to 2.0 s
    trace = held("AABC", [0.0, 1.5, 1.6, 1.7], [2.0, 0.1, 0.05, 0.1])
    result = simulate(trace, "lru", Capacity(l1_slots=1, l2_slots=2), FREE, record_tiers=True)
    # C at 1.7 s: B (ended at 1.65 s) goes, though A is less recently used
    assert result.tier_log == ["L4", "L1", "L4", "L4"]
    assert result.ttft_ms[3] == pytest.approx(50.0)  # B was free: no wait
