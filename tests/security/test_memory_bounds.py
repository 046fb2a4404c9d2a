"""Memory bounded by design, not by traffic: every per-key table a node keeps has a bound, and
what callers invent (API keys, model names) cannot grow it past that bound.

The tables and their bounds (``docs/security.md``, "Memory"): arrival times per version
(``demand.py``: the last ``LONG_S`` only, at most ``MAX_ARRIVALS`` each, versions with none
forgotten), keys and aliases the node has looked up, hits and misses (``lookups.py``:
``MAX_CALLERS``, ``MAX_ALIASES``), signature verdicts (10,000), metric labels
(``MAX_TENANT_LABELS`` x ``MAX_ADAPTER_LABELS``), the statistics queue (``QUEUE_SIZE``), bad
keys per address (a moving window in ``limits``' storage). Per-tenant rate buckets and fair
queues are keyed by tenants that exist, never by what a caller sends.
"""

from __future__ import annotations

import secrets

import pytest

from apps.serving.cache.engine_tiers import Owner
from apps.serving.node import demand as demand_module
from apps.serving.node import lookups as lookups_module
from apps.serving.node.demand import LONG_S, MAX_ARRIVALS, SHORT_S, Demand
from tests.helpers import resolved_version


def version(version_id: int):
    return resolved_version(tenant_id=1, tenant_slug="acme", version_id=version_id)


def test_arrivals_are_trimmed_with_prefetch_off():
    """With prefetch off (the default) nothing calls ``rising()``: the arrivals themselves
    keep the table to the last ``LONG_S`` (it grew with every request for as long as the node
    ran)."""
    now = [0.0]
    demand = Demand(clock=lambda: now[0])
    owner = Owner(tenant_id=1)
    for step in range(20_000):  # 2,000 versions over ~2.8 hours, 10 requests each
        now[0] = step * 0.5
        demand.arrived(version(step // 10), owner)
    # only versions asked for in the last LONG_S (plus one sweep's lag) are left
    assert len(demand) <= (LONG_S + SHORT_S) / 0.5 / 10 + 1
    assert demand.arrivals() <= (LONG_S + SHORT_S) / 0.5 + 1


def test_one_versions_arrivals_are_capped(monkeypatch):
    monkeypatch.setattr(demand_module, "MAX_ARRIVALS", 100)
    now = [0.0]
    demand = Demand(clock=lambda: now[0])
    for step in range(1000):  # 1,000 requests within one window
        now[0] = step * 0.01
        demand.arrived(version(1), Owner(tenant_id=1))
    assert demand.arrivals() == 100
    assert MAX_ARRIVALS >= 1000  # the default keeps a real rate readable


@pytest.mark.django_db
def test_invented_keys_and_model_names_do_not_grow_the_nodes_lookups(
    monkeypatch, tenant_a, support_versions
):
    from django.contrib.auth import get_user_model

    from apps.registry import aliases
    from apps.tenants import services as tenant_services
    from apps.tenants.auth import principal_for_user

    monkeypatch.setattr(lookups_module, "MAX_CALLERS", 50)
    monkeypatch.setattr(lookups_module, "MAX_ALIASES", 50)
    alice = principal_for_user(get_user_model().objects.get(username="alice"))
    aliases.set_alias(
        principal=alice, tenant=tenant_a, name="support", version_id=support_versions["v1"]
    )
    _, key = tenant_services.issue_api_key(tenant=tenant_a, name="real", actor=None)
    lookups = lookups_module.Lookups()
    assert lookups.caller(key) is not None
    for _ in range(200):
        assert lookups.caller(f"lh_{secrets.token_hex(8)}_{secrets.token_hex(16)}") is None
        assert lookups.alias(tenant_a.id, f"no-such-{secrets.token_hex(8)}") is None
    assert len(lookups._callers) <= 50
    assert len(lookups._aliases) <= 50
    # what was forgotten is read again: the real key and alias still answer
    assert lookups.caller(key) is not None
    assert lookups.alias(tenant_a.id, "support") is not None
