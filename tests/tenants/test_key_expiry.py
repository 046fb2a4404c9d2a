"""API keys that expire: made with an expiry in the console and the REST API, refused with
401 key_expired once it passes; the keys page shows the expiry and the last address. The
node's refusal is in tests/serving/test_node_keys.py."""

from __future__ import annotations

import html
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from apps.tenants.models import ApiKey
from tests.helpers import user_client

pytestmark = pytest.mark.django_db


def test_an_expired_key_gets_401_key_expired_and_the_list_says_so(tenant_a):
    alice = user_client("alice", "alice-pass-123")
    soon = datetime.now(UTC) + timedelta(hours=1)
    made = alice.post(
        "/api/tenants/tenant-a/keys",
        {"name": "nightly", "expires_at": soon.isoformat()},
        content_type="application/json",
    )
    assert made.status_code == 201, made.content
    key = made.json()["key"]
    caller = Client(HTTP_AUTHORIZATION=f"Bearer {key}", REMOTE_ADDR="10.1.2.3")
    assert caller.get("/api/me").status_code == 200

    ApiKey.objects.filter(name="nightly").update(expires_at=datetime.now(UTC))
    refused = caller.get("/api/me")
    assert refused.status_code == 401
    assert refused.json()["code"] == "key_expired"
    assert "expired at" in refused.json()["detail"]
    listed = {k["name"]: k for k in alice.get("/api/tenants/tenant-a/keys").json()}
    assert listed["nightly"]["state"] == "expired"
    assert listed["nightly"]["last_used_from"] == "10.1.2.3"

    # its name is free again
    again = alice.post(
        "/api/tenants/tenant-a/keys", {"name": "nightly"}, content_type="application/json"
    )
    assert again.status_code == 201


def test_an_expiry_in_the_past_is_refused_and_nothing_is_stored(tenant_a):
    alice = user_client("alice", "alice-pass-123")
    refused = alice.post(
        "/api/tenants/tenant-a/keys",
        {"name": "late", "expires_at": "2020-01-01T00:00:00Z"},
        content_type="application/json",
    )
    assert refused.status_code == 422
    assert "has passed" in refused.json()["detail"]
    assert not ApiKey.objects.filter(name="late").exists()


def test_the_keys_page_makes_a_key_valid_through_a_day_and_shows_expiry_and_address(tenant_a):
    alice = user_client("alice", "alice-pass-123")
    day = (datetime.now(UTC) + timedelta(days=7)).date()
    made = alice.post("/t/tenant-a/keys/", {"name": "weekly", "expires_on": day.isoformat()})
    assert made.status_code == 200
    row = ApiKey.objects.get(name="weekly")
    assert row.expires_at == datetime.combine(day + timedelta(days=1), datetime.min.time(), UTC)
    Client(
        HTTP_AUTHORIZATION=f"Bearer {made.context['new_key']['plaintext']}", REMOTE_ADDR="192.0.2.7"
    ).get("/api/me")
    page = alice.get("/t/tenant-a/keys/").content.decode()
    assert row.expires_at.strftime("%Y-%m-%d %H:%M") in page
    assert "192.0.2.7" in page

    bad = alice.post("/t/tenant-a/keys/", {"name": "x", "expires_on": "next week"}, follow=True)
    assert "'next week' is not a date" in html.unescape(bad.content.decode())
    assert not ApiKey.objects.filter(name="x").exists()
