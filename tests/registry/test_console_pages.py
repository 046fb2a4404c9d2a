"""Console pages server-side: one visibility rule with the API, and a constant query count."""

from __future__ import annotations

import io

import pytest

from apps.registry.models import Adapter, AdapterVersion, Alias
from apps.tenants import services as tenant_services
from apps.tenants.models import AuditEvent
from tests.helpers import count_queries, user_client

TENANT_PAGES = (
    "/t/{t}/adapters/",
    "/t/{t}/adapters/support/",
    "/t/{t}/upload/",
    "/t/{t}/aliases/",
    "/t/{t}/aliases/support/",
    "/t/{t}/dashboard/",
    "/t/{t}/dashboard/data?range=week",
    "/t/{t}/quota/",
    "/t/{t}/keys/",
)


def _rows(tenant, n: int, start: int = 0) -> None:
    """``n`` adapters with two versions each, and an audit event per version."""
    for i in range(start, start + n):
        adapter = Adapter.objects.create(tenant=tenant, adapter_id=f"a-{i:03d}")
        for v in ("1", "2"):
            version = AdapterVersion.objects.create(
                adapter=adapter, version=v, state="pending_review", rank=8, size_bytes=1000
            )
            tenant_services.record_event(action="version.upload", obj=version, tenant=tenant)


def _queries(client, path: str) -> int:
    with count_queries() as statements:
        assert client.get(path).status_code == 200, path
    assert statements, path
    return len(statements)


@pytest.mark.parametrize(
    "persona, path",
    [
        ("alice", "/"),
        ("alice", "/t/tenant-a/adapters/"),
        ("alice", "/t/tenant-a/adapters/a-000/"),
        ("rita", "/review/"),
        ("otto", "/audit/"),
        ("otto", "/operator/tenants/"),
        ("alice", "/t/tenant-a/dashboard/data?range=day"),
    ],
)
def test_a_page_makes_as_many_queries_for_many_rows_as_for_few(
    persona, path, tenant_a, reviewer, operator, settings
):
    settings.LORAHUB_NODES = ["n1=http://127.0.0.1:9"]
    client = user_client(persona, f"{persona}-pass-123")
    _rows(tenant_a, 3)
    client.get(path)  # a first visit may create defaults (a tenant's quota row)
    few = _queries(client, path)
    _rows(tenant_a, 30, start=3)
    assert _queries(client, path) == few


def test_another_tenants_console_urls_are_404_like_the_api(tenant_a, tenant_b):
    Adapter.objects.create(tenant=tenant_b, adapter_id="support")
    alice = user_client("alice", "alice-pass-123")
    for page in TENANT_PAGES:
        assert alice.get(page.format(t="tenant-b")).status_code == 404, page
    assert alice.get("/t/no-such-tenant/adapters/").status_code == 404
    bobs = AdapterVersion.objects.create(adapter=Adapter.objects.get(tenant=tenant_b), version="1")
    assert alice.get(f"/versions/{bobs.pk}/").status_code == 404
    assert user_client("bob", "bob-pass-123").get(f"/versions/{bobs.pk}/").status_code == 200


def test_alias_and_key_forms_on_another_tenant_are_404_and_change_nothing(
    published, tenant_a, tenant_b
):
    bob = user_client("bob", "bob-pass-123")
    for action in ("set", "canary", "promote", "rollback"):
        response = bob.post(
            f"/t/tenant-a/aliases/support/{action}", {"version_id": published["v1"], "name": "x"}
        )
        assert response.status_code == 404, action
    assert not Alias.objects.exists()
    assert bob.post("/t/tenant-a/keys/", {"name": "mine"}).status_code == 404
    key, _ = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    assert bob.post(f"/t/tenant-a/keys/{key.prefix}/revoke").status_code == 404
    key.refresh_from_db()
    assert key.revoked_at is None


def test_a_console_alias_move_is_the_services_move_with_its_audit_and_history(published, tenant_a):
    alice = user_client("alice", "alice-pass-123")
    response = alice.post(
        "/t/tenant-a/aliases/new/set", {"name": "support", "version_id": published["v1"]}
    )
    assert response.status_code == 302
    alice.post("/t/tenant-a/aliases/support/set", {"version_id": published["v2"], "reason": "r2"})
    page = alice.get("/t/tenant-a/aliases/support/").content.decode()
    assert "Roll back to v1" in page
    alice.post("/t/tenant-a/aliases/support/rollback", {"reason": "bad eval"})
    assert Alias.objects.get(name="support").version_id == published["v1"]
    actions = list(
        AuditEvent.objects.filter(action__startswith="alias.").values_list("action", flat=True)
    )
    assert actions == ["alias.rollback", "alias.set", "alias.set"]


def test_a_bad_alias_form_says_what_to_do_and_stores_nothing(published, tenant_a):
    alice = user_client("alice", "alice-pass-123")
    response = alice.post(
        "/t/tenant-a/aliases/new/set",
        {"name": "Bad Name!", "version_id": published["v1"]},
        follow=True,
    )
    assert "is not valid: use 2-63 lowercase letters" in response.content.decode()
    assert not Alias.objects.exists()


def test_review_from_the_console_signs_and_a_rejection_needs_a_note(
    registry, tenant_a, reviewer, demo_dir
):
    from tests.helpers import files_of, key_client, upload, wait_validated

    api = key_client(tenant_a)
    folder = demo_dir / "adapters" / "support-v1"
    first = upload(api, "support", files_of(folder), version="1").json()["id"]
    second = upload(api, "support", files_of(folder), version="2").json()["id"]
    wait_validated(api, first)
    wait_validated(api, second)
    rita = user_client("rita", "rita-pass-123")
    assert "Approve and sign" in rita.get(f"/versions/{first}/").content.decode()
    rita.post(f"/versions/{first}/approve", {"note": "ok"})
    assert AdapterVersion.objects.get(pk=first).signature
    page = rita.post(f"/versions/{second}/reject", {"note": " "}, follow=True).content.decode()
    assert "say why the version is rejected" in page
    assert AdapterVersion.objects.get(pk=second).state == "pending_review"
    # the second version's page compares it with the approved first one
    page = rita.get(f"/versions/{second}/").content.decode()
    assert 'id="comparison"' in page and "Tensors" in page
    assert AdapterVersion.objects.get(pk=second).report["tensors"] > 0


def test_an_upload_through_the_session_api_needs_the_csrf_token(tenant_a, s3_settings):
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(tenant_a.memberships.get().user)
    handle = io.BytesIO(b"{}")
    handle.name = "adapter_config.json"
    response = browser.post("/api/adapters/support/versions", {"files": [handle]})
    assert response.status_code == 403
    assert not AdapterVersion.objects.exists()
