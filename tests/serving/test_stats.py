"""Request statistics: one batch write per second, whatever a batch holds."""

from __future__ import annotations

import pytest

from apps.serving.models import RequestLog, RequestMinute
from apps.serving.stats import RequestRecord, write_records

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
