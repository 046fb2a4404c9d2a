"""schemathesis against a real serving node, from the node's contract written as OpenAPI
(``node_openapi.yaml``): generated valid requests (positive) and invalid ones (negative) to
completions, chat completions and the model list, as a tenant key. None may get a 500, and
every answer must match the documented shape: the completion, the chat completion, the model
list, or OpenAI's error object for a refusal."""

from __future__ import annotations

import ipaddress
import itertools
from pathlib import Path

import httpx
import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from apps.tenants import services as tenant_services

pytestmark = pytest.mark.engine

SPEC = Path(__file__).with_name("node_openapi.yaml")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
EXAMPLES = 25  # per operation and mode


@pytest.mark.django_db(transaction=True)
def test_the_node_answers_generated_requests_as_its_contract_says(node_url, published, tenant_a):
    from apps.registry import aliases
    from apps.tenants.auth import principal_for_key

    row, key = tenant_services.issue_api_key(tenant=tenant_a, name="schemathesis", actor=None)
    aliases.set_alias(
        principal=principal_for_key(row),
        tenant=tenant_a,
        name="support",
        version_id=published["v1"],
    )
    headers = {"Authorization": f"Bearer {key}"}
    # each case is its own client (X-Forwarded-For, believed from loopback): the negative
    # cases' bad keys would otherwise throttle this machine's address on the shared node
    clients = (str(ipaddress.ip_address("198.18.0.0") + n) for n in itertools.count())
    schema = schemathesis.openapi.from_dict(yaml.safe_load(SPEC.read_text()))
    seen: dict[tuple[str, int], int] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            def run(case) -> None:
                forwarded = {**headers, "X-Forwarded-For": next(clients)}
                response = case.call(base_url=node_url, headers=forwarded, timeout=60)
                label = (case.operation.label, response.status_code)
                seen[label] = seen.get(label, 0) + 1
                case.validate_response(response, checks=CHECKS)

            run()
    print("node schemathesis:", {f"{op} {code}": n for (op, code), n in sorted(seen.items())})
    answered = {code for (_, code), _ in seen.items()}
    assert 200 in answered and 400 in answered  # both sides of the contract were exercised
    assert httpx.get(f"{node_url}/healthz", timeout=5).status_code == 200
