"""schemathesis against the control plane's own OpenAPI schema, in-process (WSGI), as a tenant
key, a reviewer and an operator: every operation gets generated requests (valid and not); none
may get a 500, and every documented answer must match its schema."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from apps.tenants import services as tenant_services
from apps.tenants.choices import PlatformRole
from lorahub.wsgi import application


@pytest.fixture(autouse=True)
def fresh_install(settings, tmp_path):
    """As on a fresh clone: no signing key has been created yet."""
    settings.LORAHUB_SIGNING_KEY = ""
    settings.LORAHUB_SIGNING_KEY_FILE = tmp_path / "no-signing-key.pem"


CHECKS = [not_a_server_error, response_schema_conformance]
EXAMPLES = 40  # per operation and persona
CSRF = "x" * 32  # any token works when the cookie and the header agree


def session_headers(username: str, role: str) -> dict[str, str]:
    from django.test import Client

    user = tenant_services.ensure_user(username=username, password=f"{username}-pass-123")
    tenant_services.grant_platform_role(user=user, role=role)
    client = Client()
    assert client.login(username=username, password=f"{username}-pass-123")
    session = client.cookies["sessionid"].value
    return {"Cookie": f"sessionid={session}; csrftoken={CSRF}", "X-CSRFToken": CSRF}


def fuzz(headers: dict[str, str]) -> int:
    """Every operation, ``EXAMPLES`` generated requests each; returns how many were sent."""
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", application)
    sent = 0
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case) -> None:
            nonlocal sent
            response = case.call(headers=headers)
            sent += 1
            case.validate_response(response, checks=CHECKS)

        run()
    print(f"schemathesis: {sent} requests over {len(list(schema.get_all_operations()))} operations")
    return sent


@pytest.fixture
def isolated_store(settings, tmp_path):
    settings.LORAHUB_S3_ENDPOINT = ""
    settings.LORAHUB_LOCAL_STORE_DIR = tmp_path / "store"


# transactional: each WSGI request closes its database connection, as in production
@pytest.mark.django_db(transaction=True)
def test_as_a_tenant_key(isolated_store, tenant_a):
    _, key = tenant_services.issue_api_key(tenant=tenant_a, name="fuzz", actor=None)
    assert fuzz({"Authorization": f"Bearer {key}"}) > 100


@pytest.mark.django_db(transaction=True)
def test_as_a_reviewer(isolated_store, tenant_a):
    assert fuzz(session_headers("fuzz-reviewer", PlatformRole.REVIEWER)) > 100


@pytest.mark.django_db(transaction=True)
def test_as_an_operator(isolated_store, tenant_a):
    assert fuzz(session_headers("fuzz-operator", PlatformRole.OPERATOR)) > 100
