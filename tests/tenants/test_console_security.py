"""The console's security: throttled sign-in, CSRF, CSP, cookie flags, no secrets rendered."""

from __future__ import annotations

import re

from django.test import Client

from apps.tenants.models import ApiKey
from tests.helpers import user_client


def test_repeated_wrong_passwords_lock_the_sign_in_even_for_the_right_one(
    client, tenant_a, settings
):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        response = client.post("/accounts/login/", {"username": "alice", "password": "wrong"})
    response = client.post("/accounts/login/", {"username": "alice", "password": "alice-pass-123"})
    assert response.status_code == 429
    assert "locked for 15 minutes" in response.content.decode()
    assert client.get("/").status_code == 302  # not signed in


def test_a_form_without_its_csrf_token_is_refused_and_changes_nothing(tenant_a):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(tenant_a.memberships.get().user)
    response = browser.post("/t/tenant-a/keys/", {"name": "sneaky"})
    assert response.status_code == 403
    assert "security token" in response.content.decode()
    assert not ApiKey.objects.filter(name="sneaky").exists()


def test_pages_send_a_strict_csp_and_carry_no_inline_script(tenant_a):
    page = user_client("alice", "alice-pass-123").get("/t/tenant-a/upload/")
    csp = page["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-eval" not in csp
    assert "frame-ancestors 'none'" in csp
    scripts = re.findall(r"<script([^>]*)>", page.content.decode())
    assert scripts and all("src=" in attrs or "application/json" in attrs for attrs in scripts)
    assert page["X-Frame-Options"] == "DENY"


def test_session_and_csrf_cookies_are_secure_httponly_and_samesite(client, tenant_a, settings):
    assert settings.SESSION_COOKIE_SECURE and settings.CSRF_COOKIE_SECURE  # not DEBUG
    client.get("/accounts/login/")
    response = client.post("/accounts/login/", {"username": "alice", "password": "alice-pass-123"})
    session = response.cookies["sessionid"]
    assert session["secure"] and session["httponly"] and session["samesite"] == "Lax"
    csrf = client.cookies["csrftoken"]
    assert csrf["secure"] and csrf["httponly"]


def test_a_new_api_key_is_shown_once_and_never_again(tenant_a):
    alice = user_client("alice", "alice-pass-123")
    page = alice.post("/t/tenant-a/keys/", {"name": "ci"}).content.decode()
    secret = re.search(r"lh_[0-9a-f]{8}_[\w-]+", page)[0]
    assert secret not in alice.get("/t/tenant-a/keys/").content.decode()
    assert ApiKey.objects.get(name="ci").key_hash not in page


def test_an_admin_key_is_made_by_ticking_admin_and_marked_in_the_list(tenant_a):
    alice = user_client("alice", "alice-pass-123")
    page = alice.post("/t/tenant-a/keys/", {"name": "tooling", "admin": "on"}).content.decode()
    assert "Admin key “tooling” created" in page
    alice.post("/t/tenant-a/keys/", {"name": "ci"})
    assert dict(ApiKey.objects.values_list("name", "admin")) == {"tooling": True, "ci": False}
    listing = alice.get("/t/tenant-a/keys/").content.decode()
    assert listing.count('<span class="badge">admin</span>') == 1


def test_the_internal_token_never_reaches_a_page(operator, settings):
    settings.LORAHUB_INTERNAL_TOKEN = "node-secret-token-123"
    settings.LORAHUB_NODES = ["n1=http://127.0.0.1:9"]
    otto = user_client("otto", "otto-pass-123")
    for path in ("/operator/nodes/", "/operator/cache/", "/"):
        assert "node-secret-token-123" not in otto.get(path).content.decode()
