"""The change marker a node without a broadcast channel polls: it must move on every change
the node caches (and only then would the node refresh)."""

from __future__ import annotations

import pytest

from apps.fleet import quarantine
from apps.fleet.models import Quarantine
from apps.registry.models import Adapter, AdapterVersion, Alias
from apps.serving.models import CacheSettings
from apps.serving.node.lookups import Lookups
from apps.tenants import services as tenant_services
from apps.tenants.models import Quota, Tenant

pytestmark = pytest.mark.django_db(transaction=True)  # the marker closes its connection


def test_the_change_marker_moves_on_every_change_a_polling_node_must_see(tenant_a):
    directory = Lookups()
    adapter = Adapter.objects.create(tenant=tenant_a, adapter_id="support")
    v1 = AdapterVersion.objects.create(adapter=adapter, version="v1")
    v2 = AdapterVersion.objects.create(adapter=adapter, version="v2")
    key, _ = tenant_services.issue_api_key(tenant=tenant_a, name="k", actor=None)
    seen = [directory.change_marker()]
    assert directory.change_marker() == seen[0], "nothing changed, yet the marker moved"

    def moved(what: str) -> None:
        marker = directory.change_marker()
        assert marker not in seen, f"the marker did not move when {what}: {marker}"
        seen.append(marker)

    alias = Alias.objects.create(tenant=tenant_a, name="support", adapter=adapter, version=v1)
    moved("an alias was created")
    alias.version = v2
    alias.save()
    moved("an alias moved")
    tenant_services.revoke_api_key(key=key, actor=None)
    moved("a key was revoked")
    Quota.objects.create(tenant=tenant_a)
    moved("a quota was set")
    tenant_services.set_quota(tenant=tenant_a, actor=None, requests_per_minute=7)
    moved("a quota changed")
    Tenant.objects.create(slug="tenant-c", name="C")
    moved("a tenant was added")
    CacheSettings.objects.create(data={})
    moved("the cache settings were saved")
    quarantine.record(version_id=v2.pk, node="n1", tier="L4", reason="sha256")
    seen.append(directory.change_marker())  # the node that opened it knows already
    Quarantine.objects.update(lifted_at="2026-01-01T00:00:00Z")
    moved("a quarantine was lifted")
    Alias.objects.filter(pk=alias.pk).delete()
    moved("an alias was deleted")
