"""The console's first screens and the demo seed."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from apps.tenants.models import Membership, Tenant


def test_the_console_asks_for_sign_in(client, db):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_a_wrong_password_gets_a_message_that_says_what_to_do(client, tenant_a):
    response = client.post("/accounts/login/", {"username": "alice", "password": "nope"})
    assert response.status_code == 200
    assert "do not match" in response.content.decode()


def test_a_tenant_admin_sees_their_tenant_and_not_others(client, tenant_a, tenant_b):
    assert client.login(username="alice", password="alice-pass-123")
    page = client.get("/").content.decode()
    assert "tenant-a" in page
    assert "tenant-b" not in page


def test_api_me_lists_roles_and_requires_authentication(client, tenant_a, reviewer):
    assert client.get("/api/me").status_code == 401
    client.login(username="rita", password="rita-pass-123")
    assert client.get("/api/me").json() == {
        "username": "rita",
        "api_key": None,
        "platform_roles": ["reviewer"],
        "tenants": [],
    }


def test_the_openapi_document_is_served(client, db):
    assert client.get("/api/openapi.json").json()["info"]["title"] == "lorahub control plane"


@pytest.mark.django_db
def test_seed_demo_is_idempotent_and_publishes_working_demo_adapters(
    client, capsys, settings, tmp_path, demo_dir, signing_key
):
    from apps.registry import snapshots, storage

    settings.VAR_DIR = tmp_path
    settings.LORAHUB_S3_ENDPOINT = ""
    settings.LORAHUB_LOCAL_STORE_DIR = tmp_path / "objects"
    storage.get_store.cache_clear()
    try:
        call_command("seed_demo")
        call_command("seed_demo")
    finally:
        storage.get_store.cache_clear()
    out = capsys.readouterr().out
    assert Tenant.objects.filter(slug__in=["acme", "globex"]).count() == 2
    assert Membership.objects.filter(user__username="alice", tenant__slug="acme").exists()
    line = next(line for line in out.splitlines() if line.strip().startswith("otto"))
    password = line.split("password")[1].split()[0]
    assert client.login(username="otto", password=password)
    assert "operator" in client.get("/api/me").json()["platform_roles"]
    acme_key = next(
        line.split()[1] for line in out.splitlines()[::-1] if line.strip().startswith("acme ")
    )
    assert client.get("/api/aliases", HTTP_AUTHORIZATION=f"Bearer {acme_key}").status_code == 200
    resolved = snapshots.resolve_alias(
        tenant=Tenant.objects.get(slug="acme"), name="support", request_key="k"
    )
    assert (resolved.adapter_id, resolved.version) == ("support", "demo.1")
    assert (tmp_path / "objects" / resolved.storage_prefix / "adapter_model.safetensors").exists()
