"""Points 9 and 11 of the threat model: bodies are bounded (console and node), malformed
tokens are a plain 401, and nobody signed in can fill the audit log."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from django.test import Client
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from apps.serving.node.body_limit import BodyLimit
from apps.tenants.models import AuditEvent

pytestmark = pytest.mark.django_db


def test_an_anonymous_oversized_form_is_refused_before_it_is_read(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024
    client = Client()
    client.get("/accounts/login/")
    body = "username=a&password=" + "x" * (200 * 1024)
    answer = client.generic(
        "POST", "/accounts/login/", body, content_type="application/x-www-form-urlencoded"
    )
    assert answer.status_code == 413
    assert "limit of 64 KiB" in answer.content.decode()


def test_the_console_bounds_bodies_by_default(settings):
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE is not None
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE <= 16 * 1024 * 1024


def test_an_oversized_json_body_gets_413_naming_the_limit(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024
    answer = Client().generic(
        "POST", "/api/aliases/x/canary", "[" + "1," * 60000 + "1]", content_type="application/json"
    )
    assert answer.status_code == 413
    assert answer.json()["code"] == "body_too_large"


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"bytes": len(await request.body())})


@pytest.mark.parametrize("chunked", [False, True])
def test_a_node_refuses_a_body_over_its_limit_and_keeps_serving(chunked):
    asyncio.run(_a_node_refuses_a_body_over_its_limit(chunked))


async def _a_node_refuses_a_body_over_its_limit(chunked: bool) -> None:
    app = Starlette(  # as the node mounts it (apps/serving/node/assembly.py)
        routes=[Route("/v1/completions", _echo, methods=["POST"])],
        middleware=[Middleware(BodyLimit, limit_bytes=1024)],
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://node"
    ) as client:
        big = b"x" * 5000

        async def stream():
            for i in range(0, len(big), 500):
                yield big[i : i + 500]

        refused = await client.post("/v1/completions", content=stream() if chunked else big)
        assert refused.status_code == 413
        assert refused.json()["error"]["code"] == "body_too_large"
        assert "limit of 1 KiB" in refused.json()["error"]["message"]
        served = await client.post("/v1/completions", content=b"x" * 100)
        assert served.json() == {"bytes": 100}


@pytest.mark.parametrize("token", ["é" * 8, "lh_ünïcode_x", "\x7f\x01"])
def test_a_non_ascii_token_is_a_plain_401(settings, token):
    settings.LORAHUB_INTERNAL_TOKEN = "a-real-internal-token-0123456789"
    metrics = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/metrics")
    assert metrics.status_code == 401
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/adapters")
    assert api.status_code == 401


def test_anonymous_callers_cannot_fill_the_audit_log(settings):
    settings.OIDC_ISSUER = "http://127.0.0.1:9"
    client = Client(REMOTE_ADDR="203.0.113.7")
    for n in range(60):
        client.get("/oidc/callback/", {"error": "access_denied", "error_description": f"x{n}"})
    written = AuditEvent.objects.filter(action="sign_in.failed").count()
    assert 0 < written <= 30
