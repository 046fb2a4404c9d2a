"""Every REST operation, as read from the OpenAPI schema (so a new endpoint cannot slip
through): refused without credentials and with a revoked key; operator and reviewer endpoints
refused to a tenant key; never a 500 for any of these callers."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from apps.registry.models import Adapter, AdapterVersion
from apps.tenants import services as tenant_services
from apps.tenants import throttle
from lorahub.api import api


@pytest.fixture(autouse=True)
def fresh_install(settings, tmp_path):
    """As on a fresh clone: no signing key has been created yet."""
    settings.LORAHUB_SIGNING_KEY = ""
    settings.LORAHUB_SIGNING_KEY_FILE = tmp_path / "no-signing-key.pem"


pytestmark = pytest.mark.django_db

# operations only an operator may call (a reviewer's are listed apart)
OPERATOR_ONLY = {
    ("GET", "/api/cache-config"),
    ("PUT", "/api/cache-config"),
    ("GET", "/api/nodes"),
    ("GET", "/api/nodes/{name}/cache"),
    ("POST", "/api/nodes/warm"),
    ("POST", "/api/nodes/evict"),
    ("GET", "/api/quarantines"),
    ("POST", "/api/quarantines/{quarantine_id}/lift"),
    ("PUT", "/api/tenants/{slug}/quota"),  # GET: a tenant's admins read their own
}
# public on purpose: the key that checks model-signing bundles is for anyone (docs/security.md)
PUBLIC = {("GET", "/api/signing-keys/lorahub.pub")}
REVIEWER_ONLY = {
    ("POST", "/api/versions/{version_id}/approve"),
    ("POST", "/api/versions/{version_id}/reject"),
}


def operations() -> list[tuple[str, str]]:
    schema = api.get_openapi_schema(path_prefix="/api/")
    return sorted(
        (method.upper(), path)
        for path, methods in schema["paths"].items()
        for method in methods
        if method in ("get", "post", "put", "patch", "delete")
    )


# well-formed bodies, so that a refusal is about who calls, not about the body's shape
BODIES = {
    ("POST", "/api/nodes/warm"): {"tenant": "tenant-a", "alias": "support"},
    ("POST", "/api/nodes/evict"): {"tenant": "tenant-a", "alias": "support"},
    ("POST", "/api/quarantines/{quarantine_id}/lift"): {"note": "restored"},
    ("POST", "/api/versions/{version_id}/approve"): {"note": "fine"},
    ("POST", "/api/versions/{version_id}/reject"): {"note": "not fine"},
}


def call(client: Client, method: str, path: str, params: dict | None = None):
    url = re.sub(r"\{([^}]+)\}", lambda m: str((params or {}).get(m[1], 1)), path)
    body = json.dumps(BODIES.get((method, path), {}))
    return client.generic(method, url, data=body, content_type="application/json")


def test_the_sweep_sees_every_operation_it_names():
    found = set(operations())
    named = OPERATOR_ONLY | REVIEWER_ONLY | PUBLIC
    assert found >= named, named - found
    assert len(found) >= 25


def test_no_credentials_and_a_revoked_key_are_refused_everywhere(tenant_a, settings):
    settings.LORAHUB_BAD_KEY_LIMIT = "1000/minute"  # one revoked key on every operation
    throttle.bad_keys.cache_clear()
    key_row, key = tenant_services.issue_api_key(tenant=tenant_a, name="gone", actor=None)
    tenant_services.revoke_api_key(key=key_row, actor=None)
    anonymous, revoked = Client(), Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    for method, path in operations():
        for who, client in (("nobody", anonymous), ("a revoked key", revoked)):
            answer = call(client, method, path)
            if (method, path) in PUBLIC:  # no key yet on a fresh install: said so, not 401
                assert answer.status_code == 404, (who, method, path, answer.status_code)
                assert "init_signing_key" in answer.json()["detail"]
                continue
            assert answer.status_code == 401, (who, method, path, answer.status_code)


def test_a_tenant_key_is_refused_on_operator_and_reviewer_endpoints_and_never_gets_a_500(
    tenant_a,
):
    _, key = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    tenant = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    # its own objects, so that what refuses is the role, not the object's visibility
    adapter = Adapter.objects.create(tenant=tenant_a, adapter_id="support")
    own = AdapterVersion.objects.create(adapter=adapter, version="v1", state="pending_review")
    params = {"version_id": own.pk, "slug": tenant_a.slug, "adapter_id": "support"}
    for method, path in operations():
        answer = call(tenant, method, path, params)
        assert answer.status_code < 500, (method, path, answer.content[:300])
        if (method, path) in OPERATOR_ONLY | REVIEWER_ONLY:
            assert answer.status_code == 403, (method, path, answer.status_code)
