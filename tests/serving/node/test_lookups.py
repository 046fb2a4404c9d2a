"""The node's in-memory callers across the periodic full refresh (the safety net for lost
broadcasts): known keys are re-read, not forgotten, so a database outage that follows a
refresh still finds them; a key revoked meanwhile is dropped, a changed quota is seen."""

from __future__ import annotations

import pytest

from apps.serving.node.lookups import UNKNOWN, Caller, Lookups
from apps.tenants import services as tenant_services

pytestmark = pytest.mark.django_db(transaction=True)  # the refresh closes its connection


def test_a_full_refresh_keeps_the_callers_it_knows_and_re_reads_them(tenant_a):
    lookups = Lookups()
    _, kept = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    gone_row, gone = tenant_services.issue_api_key(tenant=tenant_a, name="old", actor=None)
    assert isinstance(lookups.caller(kept), Caller)
    assert isinstance(lookups.caller(gone), Caller)
    tenant_services.revoke_api_key(key=gone_row, actor=None)
    tenant_services.set_quota(tenant=tenant_a, actor=None, requests_per_minute=7)

    lookups.full_refresh()

    caller = lookups.cached_caller(kept)  # from memory alone: no database needed for it
    assert isinstance(caller, Caller), "the refresh forgot a key the node was serving"
    assert caller.requests_per_minute == 7, "the refresh kept the quota it had before"
    assert lookups.cached_caller(gone) is UNKNOWN, "a revoked key outlived the refresh"
    assert lookups.caller(gone) is None
