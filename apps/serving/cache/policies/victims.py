"""Choosing victims: any policy's order, under tenant quotas and guaranteed shares."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable, Mapping

from apps.serving.cache.policies.base import Policy, Resident
from apps.serving.cache.policies.shares import Census


def rank(
    residents: Iterable[Resident], *, policy: Policy, now: float, pressure: float = 0.0
) -> list[Resident]:
    """Residents in eviction order under ``policy``: the first should go first.

    Deprecated versions (replaced or rolled back by their alias) go before any other, under
    every policy; the policy orders each group."""
    pool = list(residents)
    policy.prepare(pool, now)
    return sorted(pool, key=lambda r: (r.deprecated, policy.score(r, now, pressure)), reverse=True)


def select_victims(
    residents: Collection[Resident],
    *,
    policy: Policy,
    now: float,
    slots_needed: int = 1,
    capacity: int,
    requester: int | None = None,
    quotas: Mapping[int, int] | None = None,
    pressure: float = 0.0,
    ordered: Iterable[Resident] | None = None,
    census: Census | None = None,
    orders: Callable[[int], Iterable[Resident]] | None = None,
) -> list[Resident]:
    """The residents to evict so that ``slots_needed`` more fit, lowest value first.

    Rules, in order: pinned residents never go. If the requesting tenant is at its quota
    (``quotas[tenant]`` residents), it displaces its own lowest-value residents and nobody
    else's. Otherwise victims come from anyone, except that no other tenant is pushed below
    its guaranteed share (``guaranteed_shares``). Returns fewer than needed when the rules
    allow no more; the caller then waits, degrades or refuses.

    ``ordered``: the unpinned residents already in eviction order, for a cache that keeps
    them sorted by the policy's ``retention`` (the replay does); read only as far as needed.
    ``census``: the residents' per-tenant counts, kept by such a cache (else counted here).
    ``orders``: for a policy of several settings (the default), setting ``e``'s order of the
    same residents (the replay's heaps); without it each setting ranks them. Only the
    policy's ``learn_from_eviction`` step changes it; choosing does not.
    """
    census = census or Census.of(residents)
    free = capacity - census.total
    needed = max(0, slots_needed - max(free, 0))
    counts = census.counts  # read only; victims taken so far are counted in ``taken``
    taken: dict[int, int] = {}
    quota = (quotas or {}).get(requester) if requester is not None else None
    # A tenant at its quota makes room from its own residents, even when the cache has room.
    over_quota = (
        requester is not None
        and quota is not None
        and counts.get(requester, 0) + slots_needed > quota
    )
    if needed == 0 and not over_quota:
        return []
    if ordered is None:
        ordered = rank(
            [r for r in residents if not r.pinned], policy=policy, now=now, pressure=pressure
        )
    if over_quota:
        assert requester is not None and quota is not None
        over = counts.get(requester, 0) - quota + slots_needed
        own = (r for r in ordered if r.tenant_id == requester)
        return list(itertools.islice(own, max(needed, over)))
    victims: list[Resident] = []
    for r in ordered:
        if len(victims) == needed:
            break
        tenant = r.tenant_id
        left = counts[tenant] - taken.get(tenant, 0)
        if tenant != requester and left <= census.share(tenant, capacity):
            continue
        victims.append(r)
        taken[tenant] = taken.get(tenant, 0) + 1
    if victims:  # the policy's explicit learning step (the default learns; others do not)
        policy.learn_from_eviction(
            victims[0],
            residents,
            now=now,
            capacity=capacity,
            requester=requester,
            census=census,
            orders=orders,
        )
    return victims
