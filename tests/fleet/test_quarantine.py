"""Quarantine records: opened once per node, listed for operators, lifted only with a reason
(the lift's re-verification against the registry is exercised on a real node in
tests/serving/node/test_node_api.py)."""

from __future__ import annotations

import pytest

from apps.fleet import quarantine
from apps.fleet.models import Quarantine
from apps.registry.models import Adapter, AdapterVersion
from tests.helpers import key_client, user_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def version(tenant_a) -> AdapterVersion:
    adapter = Adapter.objects.create(tenant=tenant_a, adapter_id="support")
    return AdapterVersion.objects.create(adapter=adapter, version="v1")


def test_a_node_opens_one_quarantine_per_version_and_sees_only_its_own(version):
    assert quarantine.record(version_id=version.pk, node="n1", tier="L4", reason="sha256")
    assert not quarantine.record(version_id=version.pk, node="n1", tier="L4", reason="again")
    assert quarantine.record(version_id=version.pk, node="n2", tier="L4", reason="sha256")
    assert Quarantine.objects.count() == 2
    assert quarantine.open_on("n1") == {version.pk}
    assert quarantine.open_on("n3") == set()


def test_only_operators_see_and_lift_quarantines_and_a_lift_needs_a_reason(
    version, operator, tenant_a
):
    quarantine.record(version_id=version.pk, node="n1", tier="L4", reason="sha256 mismatch")
    open_ = Quarantine.objects.get()
    tenant = key_client(tenant_a)
    assert tenant.get("/api/quarantines").status_code == 403
    assert (
        tenant.post(
            f"/api/quarantines/{open_.pk}/lift", {"note": "x"}, content_type="application/json"
        ).status_code
        == 403
    )
    otto = user_client("otto", "otto-pass-123")
    [row] = otto.get("/api/quarantines").json()
    assert row["version"] == "tenant-a/support@v1" and row["reason"] == "sha256 mismatch"
    no_note = otto.post(
        f"/api/quarantines/{open_.pk}/lift", {"note": " "}, content_type="application/json"
    )
    assert no_note.status_code in (400, 422)
    assert "a note is required" in no_note.json()["detail"]
    missing = otto.post(
        "/api/quarantines/999999/lift", {"note": "x"}, content_type="application/json"
    )
    assert missing.status_code == 404
    page = otto.get("/operator/nodes/").content.decode()
    assert f'data-quarantine="{open_.pk}"' in page and "sha256 mismatch" in page
    followed = otto.post(f"/operator/quarantines/{open_.pk}/lift", {"note": ""}, follow=True)
    assert "a note is required" in followed.content.decode()
    assert Quarantine.objects.get().lifted_at is None  # nothing changed


def test_a_report_from_an_unknown_node_or_a_copy_that_verifies_is_not_announced(version):
    """The control plane checks a node's report before it acts: a node the registry does not
    know, or a registry copy that lands fine here, is audited as unconfirmed and sent to no
    webhook (a compromised node cannot make the platform tell a tenant anything)."""
    from apps.tenants import webhooks
    from apps.tenants.models import AuditEvent, WebhookDelivery

    webhooks.create(
        tenant=version.adapter.tenant, url="https://a.example.com/h", events=[],
        format="lorahub", actor=None,
    )  # fmt: skip
    assert quarantine.record(version_id=version.pk, node="ghost", tier="L4", reason="made up")
    assert not AuditEvent.objects.filter(action__startswith="version.quarantine").exists()
    assert quarantine.announce() != []
    event = AuditEvent.objects.get(action="version.quarantine_unconfirmed")
    assert "unknown node" in event.note
    assert not WebhookDelivery.objects.exists()
    assert quarantine.announce() == []  # once
