"""Fixtures of the serving tests that drive the session's real node."""

from __future__ import annotations

import openai
import pytest
from django.test import Client

from apps.tenants import services as tenant_services


@pytest.fixture
def world(node_url, published, tenant_a, tenant_b):
    """Tenant A's alias `support` → v1 (support-v1's weights), v2 = support-v2's weights."""
    _, a_key = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    _, b_key = tenant_services.issue_api_key(tenant=tenant_b, name="app", actor=None)
    control = Client(HTTP_AUTHORIZATION=f"Bearer {a_key}")
    assert (
        control.put(
            "/api/aliases/support", {"version_id": published["v1"]}, content_type="application/json"
        ).status_code
        == 200
    )
    return {
        "url": node_url,
        "a": openai.OpenAI(base_url=f"{node_url}/v1", api_key=a_key, max_retries=0),
        "b": openai.OpenAI(base_url=f"{node_url}/v1", api_key=b_key, max_retries=0),
        "a_key": a_key,
        "control": control,
        "versions": published,
    }
