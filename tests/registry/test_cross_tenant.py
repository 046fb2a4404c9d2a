"""Tenant B can neither see, use nor change tenant A's objects, on every endpoint."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import override_settings

from apps.registry import aliases, storage
from apps.registry.models import AdapterVersion, Alias
from apps.tenants.auth import principal_for_user
from apps.tenants.models import ApiKey, Quota
from tests.harness.s3 import empty_the_bucket, s3_overrides
from tests.helpers import files_of, key_client, user_client, write_platform_keys
from tests.personas import (
    make_reviewer,
    make_tenant_a,
    publish_support_versions,
    register_demo_base_model,
)


@pytest.fixture(scope="module")
def a_world(django_db_setup, django_db_blocker, s3_server, demo_dir, tmp_path_factory):
    """Tenant A's world, built once for this module's ~35 tests and committed: alice's
    tenant, three approved versions of 'support' (v1 live behind the alias). Publishing them
    for each test cost ~0.6 s of its ~0.7 s.

    Every test here takes the ``db`` fixture (through ``tenant_b``): it runs in a transaction
    rolled back at its end, so nothing one test does reaches the next, and each test's own
    before/after snapshot still sees exactly what its request changed. The world is deleted
    when the module ends."""
    key_file = tmp_path_factory.mktemp("cross-tenant") / "signing-key.pem"
    overrides = {
        **s3_overrides(s3_server),
        "LORAHUB_SIGNING_KEY": "",
        "LORAHUB_SIGNING_KEY_FILE": key_file,
        "LORAHUB_BUNDLE_KEY": "",
        "LORAHUB_BUNDLE_KEY_FILE": "",
    }
    with override_settings(**overrides):
        try:
            with django_db_blocker.unblock():
                write_platform_keys(key_file)
                empty_the_bucket()
                tenant_a = make_tenant_a()
                register_demo_base_model(demo_dir)
                published = publish_support_versions(tenant_a, make_reviewer(), demo_dir)
                alice = principal_for_user(get_user_model().objects.get(username="alice"))
                aliases.set_alias(
                    principal=alice, tenant=tenant_a, name="support", version_id=published["v1"]
                )
                a_key = ApiKey.objects.filter(tenant=tenant_a).first()
            yield {"tenant": tenant_a, "version": published["v2"], "key_prefix": a_key.prefix}
        finally:  # also when building it failed half-way: no committed row outlives the module
            with django_db_blocker.unblock():
                call_command("flush", interactive=False, verbosity=0)
            storage.get_store.cache_clear()


@pytest.fixture
def tenant_a(a_world):
    return a_world["tenant"]


ENDPOINTS = [
    ("get", "/api/tenants/tenant-a/keys", None),
    ("post", "/api/tenants/tenant-a/keys", {"name": "stolen"}),
    ("delete", "/api/tenants/tenant-a/keys/{key_prefix}", None),
    ("get", "/api/tenants/tenant-a/quota", None),
    ("put", "/api/tenants/tenant-a/quota", {"max_adapters": 1000}),
    ("get", "/api/adapters/support/versions", None),
    ("get", "/api/versions/{version}", None),
    ("post", "/api/versions/{version}/approve", {"note": "x"}),
    ("post", "/api/versions/{version}/reject", {"note": "x"}),
    ("get", "/api/aliases/support?tenant=tenant-a", None),
    ("put", "/api/aliases/support?tenant=tenant-a", {"version_id": "{version}"}),
    (
        "post",
        "/api/aliases/support/canary?tenant=tenant-a",
        {"version_id": "{version}", "percent": 50},
    ),
    ("post", "/api/aliases/support/promote?tenant=tenant-a", {}),
    ("post", "/api/aliases/support/rollback?tenant=tenant-a", {}),
    ("put", "/api/aliases/support", {"version_id": "{version}"}),
    ("get", "/api/audit?tenant=tenant-a", None),
]


# (method, path) -> the callers whose role may not do it for any tenant, their own included
ROLE_REFUSALS = {
    ("put", "/api/tenants/tenant-a/quota"): ("api-key", "session"),  # operators set quotas
    ("get", "/api/audit"): ("api-key",),  # operators and tenant admins read the audit log
}


def _call(client, method, path, body, world):
    path = path.format(**world)
    if body is not None:
        body = {
            k: (int(v.format(**world)) if isinstance(v, str) and "{" in v else v)
            for k, v in body.items()
        }
        return getattr(client, method)(path, body, content_type="application/json")
    return getattr(client, method)(path)


def _snapshot():
    alias = Alias.objects.get(name="support", tenant__slug="tenant-a")
    return (
        alias.version_id,
        alias.canary_version_id,
        alias.canary_percent,
        sorted(AdapterVersion.objects.values_list("pk", "state")),
        sorted(ApiKey.objects.values_list("prefix", "revoked_at")),
        list(Quota.objects.values_list("tenant_id", "max_adapters")),
    )


@pytest.mark.parametrize("as_key", [True, False], ids=["api-key", "session"])
@pytest.mark.parametrize(
    ("method", "path", "body"), ENDPOINTS, ids=[f"{m} {p}" for m, p, _ in ENDPOINTS]
)
def test_tenant_b_is_refused_and_learns_nothing(a_world, tenant_b, method, path, body, as_key):
    client = key_client(tenant_b, "b") if as_key else user_client("bob", "bob-pass-123")
    before = _snapshot()
    response = _call(client, method, path, body, a_world)
    # API.md: another tenant's object is not found (404); 403 only where the caller's role
    # may not do this to any tenant, and then it says no more than about a tenant that does
    # not exist
    refused_role = ROLE_REFUSALS.get((method, path.split("?")[0]), ())
    expected = 403 if ("api-key" if as_key else "session") in refused_role else 404
    assert response.status_code == expected, (response.status_code, response.content)
    if expected == 403:
        nowhere = _call(client, method, path.replace("tenant-a", "no-such-tenant"), body, a_world)
        assert (nowhere.status_code, nowhere.content) == (403, response.content)
    text = response.content.decode()
    assert "support@v" not in text and "sha256" not in text and a_world["key_prefix"] not in text
    assert _snapshot() == before


def test_listings_show_tenant_b_only_its_own(a_world, tenant_b, adapter_files):
    client = key_client(tenant_b, "b")
    assert client.get("/api/adapters").json() == []
    assert client.get("/api/versions").json() == []
    assert client.get("/api/aliases").json() == []
    assert client.get("/api/aliases?tenant=tenant-a").json() == []


def test_tenant_b_cannot_upload_into_tenant_a(a_world, tenant_b, adapter_files):
    bob = user_client("bob", "bob-pass-123")
    response = bob.post(
        "/api/adapters/support/versions?tenant=tenant-a", {"files": files_of(adapter_files)}
    )
    assert response.status_code == 404
    assert AdapterVersion.objects.filter(adapter__tenant__slug="tenant-b").count() == 0
    assert AdapterVersion.objects.count() == 3


def test_a_revoked_or_wrong_key_is_401(a_world, tenant_a, db):
    from apps.tenants import services as tenant_services

    key, plaintext = tenant_services.issue_api_key(tenant=tenant_a, name="temp", actor=None)
    from django.test import Client

    good = Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert good.get("/api/aliases").status_code == 200
    tenant_services.revoke_api_key(key=key, actor=None)
    assert good.get("/api/aliases").status_code == 401
    assert Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}x").get("/api/aliases").status_code == 401
    assert Client().get("/api/aliases").status_code == 401
