"""Request statistics: one batch write per second, whatever a batch holds."""

from __future__ import annotations

import pytest

from apps.telemetry.models import RequestLog, RequestMinute
from apps.telemetry.records import RequestRecord
from apps.telemetry.writers import write_records

pytestmark = pytest.mark.django_db


def test_a_deleted_tenants_records_do_not_lose_the_rest_of_the_batch(tenant_a):
    records = [
        RequestRecord(
            tenant_id=tenant_a.id,
            alias="support",
            adapter_id="support",
            version="v1",
            tier="L1",
            status=200,
            ttft_ms=9.0,
        ),
        RequestRecord(
            tenant_id=tenant_a.id + 1000,
            alias="gone",
            adapter_id="gone",
            version="v1",
            tier="L2",
            status=200,
        ),
    ]
    write_records("test-node", records)
    assert RequestLog.objects.count() == 2
    assert RequestLog.objects.get(alias="gone").tenant_id is None
    assert list(RequestMinute.objects.values_list("tenant_id", "alias", "requests")) == [
        (tenant_a.id, "support", 1)
    ]


# prewarm_candidates closes its connection when done (it runs on a node's worker thread)
@pytest.mark.django_db(transaction=True)
def test_a_node_prewarms_what_it_answered_itself_and_a_new_one_the_fleet_s_favourites(tenant_a):
    """Behind a router each node sees its own share of the adapters: after a restart it warms
    those (its own log), not the fleet's top list; a node with no history takes the fleet's."""
    from apps.registry.models import Adapter, AdapterVersion
    from apps.serving.node.prewarm import prewarm_candidates
    from lorahub.cacheconfig import CacheConfig

    for name in ("mine", "popular"):
        adapter = Adapter.objects.create(tenant=tenant_a, adapter_id=name)
        AdapterVersion.objects.create(adapter=adapter, version="v1")

    def record(adapter_id: str) -> RequestRecord:
        return RequestRecord(
            tenant_id=tenant_a.id,
            alias=adapter_id,
            adapter_id=adapter_id,
            version="v1",
            tier="L1",
            status=200,
        )

    write_records("node-1", [record("mine")] * 2)
    write_records("node-2", [record("popular")] * 5)
    config = CacheConfig.model_validate({"base_model": "m", "base_model_revision": "r1"})

    def labels(node: str) -> list[str]:
        return [v.label for v in prewarm_candidates(config, node)]

    assert labels("node-1") == ["mine@v1"]
    assert labels("node-2") == ["popular@v1"]
    assert labels("node-3") == ["popular@v1", "mine@v1"]  # no history: the fleet's counts
