"""API keys (shown once, stored hashed, revocable), quotas (operators), the audit log."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.tenants import services
from apps.tenants.choices import TenantRole
from apps.tenants.models import ApiKey, AuditEvent, Quota


def login(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=f"{username}-pass-123")
    return client


@pytest.mark.django_db
def test_a_new_key_is_shown_once_and_only_its_hash_is_stored(tenant_a):
    alice = login("alice")
    response = alice.post(
        "/api/tenants/tenant-a/keys", {"name": "ci"}, content_type="application/json"
    )
    assert response.status_code == 201
    plaintext = response.json()["key"]
    assert plaintext.startswith("lh_")
    row = ApiKey.objects.get(name="ci")
    assert plaintext not in str(ApiKey.objects.filter(pk=row.pk).values().first())
    listed = alice.get("/api/tenants/tenant-a/keys").json()
    assert [k["name"] for k in listed] == ["ci"]
    assert "key" not in listed[0] and plaintext not in str(listed)
    assert Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}").get("/api/me").json()["tenants"] == [
        {"tenant": "tenant-a", "role": "api_key"}
    ]
    again = alice.post(
        "/api/tenants/tenant-a/keys", {"name": "ci"}, content_type="application/json"
    )
    assert again.status_code == 409


@pytest.mark.django_db
def test_revoking_a_key_stops_it_at_once_and_records_who(tenant_a):
    alice = login("alice")
    plaintext = alice.post(
        "/api/tenants/tenant-a/keys", {"name": "old"}, content_type="application/json"
    ).json()["key"]
    prefix = plaintext.split("_")[1]
    assert alice.delete(f"/api/tenants/tenant-a/keys/{prefix}").json()["revoked_at"]
    assert Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}").get("/api/me").status_code == 401
    event = AuditEvent.objects.get(action="api_key.revoke")
    assert event.actor.username == "alice"
    assert event.after == {"active": False}


@pytest.mark.django_db
def test_an_admin_key_administers_its_tenant_but_cannot_mint_admin_keys(tenant_a, tenant_b):
    """A tenant's tooling (the lorahub CLI) manages keys and reads the audit log with an admin
    key a person issued; a member key cannot, and no key can issue an admin key."""
    alice = login("alice")
    made = alice.post(
        "/api/tenants/tenant-a/keys",
        {"name": "tooling", "admin": True},
        content_type="application/json",
    ).json()
    assert made["admin"] is True
    admin = Client(HTTP_AUTHORIZATION=f"Bearer {made['key']}")
    member_key = admin.post(
        "/api/tenants/tenant-a/keys", {"name": "ci"}, content_type="application/json"
    )
    assert member_key.status_code == 201 and member_key.json()["admin"] is False
    refused = admin.post(
        "/api/tenants/tenant-a/keys",
        {"name": "ci2", "admin": True},
        content_type="application/json",
    )
    assert refused.status_code == 403
    assert "cannot issue an admin key" in refused.json()["detail"]
    assert not ApiKey.objects.filter(name="ci2").exists()
    assert admin.get("/api/me").json()["tenants"] == [
        {"tenant": "tenant-a", "role": "admin_api_key"}
    ]
    issued = AuditEvent.objects.get(action="api_key.issue", after__name="ci")
    assert issued.actor_key.name == "tooling" and issued.actor is None
    assert {e["action"] for e in admin.get("/api/audit").json()} >= {"api_key.issue"}
    assert admin.get("/api/tenants/tenant-b/keys").status_code == 404  # its own tenant only
    member = Client(HTTP_AUTHORIZATION=f"Bearer {member_key.json()['key']}")
    assert member.get("/api/tenants/tenant-a/keys").status_code == 403
    assert member.get("/api/audit").status_code == 403
    prefix = member_key.json()["prefix"]
    assert admin.delete(f"/api/tenants/tenant-a/keys/{prefix}").json()["revoked_at"]
    assert member.get("/api/me").status_code == 401


@pytest.mark.django_db
def test_members_who_are_not_admins_cannot_manage_keys_or_read_the_audit_log(tenant_a):
    user = services.ensure_user(username="mia", password="mia-pass-123")
    services.add_member(tenant=tenant_a, user=user, role=TenantRole.MEMBER)
    mia = login("mia")
    response = mia.post(
        "/api/tenants/tenant-a/keys", {"name": "x"}, content_type="application/json"
    )
    assert response.status_code == 403
    assert "only an admin of tenant 'tenant-a'" in response.json()["detail"]
    assert mia.get("/api/audit").status_code == 403


@pytest.mark.django_db
def test_only_operators_set_quotas_and_bad_values_are_refused(tenant_a, operator):
    alice = login("alice")
    refused = alice.put(
        "/api/tenants/tenant-a/quota", {"max_adapters": 999}, content_type="application/json"
    )
    assert refused.status_code == 403
    otto = login("otto")
    bad = otto.put(
        "/api/tenants/tenant-a/quota", {"max_upload_mb": -5}, content_type="application/json"
    )
    assert bad.status_code == 422
    assert "max_upload_mb must be a whole number of 0 or more" in bad.json()["detail"]
    none_warm = otto.put(
        "/api/tenants/tenant-a/quota",
        {"max_hot_adapters": 1, "max_warm_adapters": 0},
        content_type="application/json",
    )
    assert none_warm.status_code == 422
    assert "max_warm_adapters must be at least 1" in none_warm.json()["detail"]
    assert alice.get("/api/tenants/tenant-a/quota").json()["max_hot_adapters"] == 2  # unchanged
    ok = otto.put(
        "/api/tenants/tenant-a/quota",
        {"max_hot_adapters": 3, "max_upload_mb": 50},
        content_type="application/json",
    )
    assert ok.status_code == 200
    assert ok.json()["max_hot_adapters"] == 3
    assert alice.get("/api/tenants/tenant-a/quota").json()["max_upload_mb"] == 50
    event = AuditEvent.objects.get(action="quota.set", after__max_upload_mb=50)
    assert event.before["max_upload_mb"] == Quota._meta.get_field("max_upload_mb").default


@pytest.mark.django_db
def test_operators_see_every_event_and_tenant_admins_only_their_own(tenant_a, tenant_b, operator):
    services.issue_api_key(tenant=tenant_a, name="a", actor=None)
    services.issue_api_key(tenant=tenant_b, name="b", actor=None)
    tenants_seen = {e["tenant"] for e in login("otto").get("/api/audit").json()}
    assert tenants_seen == {"tenant-a", "tenant-b"}
    assert {e["tenant"] for e in login("alice").get("/api/audit").json()} == {"tenant-a"}
    assert login("alice").get("/api/audit?tenant=tenant-b").status_code == 404


@pytest.mark.django_db
def test_an_operator_sets_a_tenant_s_engine_weight_and_a_bad_one_is_refused(tenant_a, operator):
    otto = login("otto")
    for bad in (0, 10_001):
        refused = otto.put(
            "/api/tenants/tenant-a/quota", {"engine_weight": bad}, content_type="application/json"
        )
        assert refused.status_code == 422
        assert "engine_weight must be 1 to 10000" in refused.json()["detail"]
    assert otto.get("/api/tenants/tenant-a/quota").json()["engine_weight"] == 100  # unchanged
    ok = otto.put(
        "/api/tenants/tenant-a/quota", {"engine_weight": 300}, content_type="application/json"
    )
    assert ok.json()["engine_weight"] == 300
    event = AuditEvent.objects.get(action="quota.set", after__engine_weight=300)
    assert event.before["engine_weight"] == 100
    # the console's quota page shows the weight the nodes use: premium tier (2) x 300 %
    page = otto.get("/t/tenant-a/quota/").content.decode()
    assert 'name="engine_weight" value="300"' in page
    assert "6.00" in page.split('id="engine-share"')[1].split("</tr>")[0]
    # and its form refuses a bad one, changing nothing
    otto.post("/t/tenant-a/limits", {"engine_weight": "0"})
    assert Quota.objects.get(tenant=tenant_a).engine_weight == 300
