"""The second factor for local accounts (TOTP, recovery codes), the actions it guards, and
local sign-in switched off but for the break-glass account. The browser's enrolment is in
tests/e2e/test_sign_in.py."""

from __future__ import annotations

from base64 import b32decode

import pytest
from django.test import Client
from django_otp.oath import TOTP

from apps.registry.models import AdapterVersion
from apps.tenants import services as tenant_services
from apps.tenants.models import AuditEvent
from apps.tenants.models import SealedTOTPDevice as TOTPDevice
from tests.helpers import pending_version

pytestmark = pytest.mark.django_db


def code_for(device: TOTPDevice, *, drift: int = 0) -> str:
    totp = TOTP(device.bin_key, step=device.step, t0=device.t0, digits=device.digits)
    totp.drift = drift
    return f"{totp.token():06d}"


def sign_in(client: Client, username: str, password: str):
    return client.post("/accounts/login/", {"username": username, "password": password})


def enrol(client: Client) -> tuple[TOTPDevice, list[str]]:
    """Through the second-factor page: the key shown, a code from it, the recovery codes."""
    page = client.get("/accounts/second-factor/")
    assert page.status_code == 200
    secret = page.context["secret"]
    device = TOTPDevice.objects.get(confirmed=False, user__username=page.context["user"])
    assert b32decode(secret) == device.bin_key  # the key on the page is the device's
    done = client.post("/accounts/second-factor/", {"action": "confirm", "code": code_for(device)})
    assert done.status_code == 200, done.content
    return device, done.context["codes"]


@pytest.fixture
def required(settings):
    settings.REQUIRE_SECOND_FACTOR = True


def test_a_reviewer_without_a_second_factor_may_not_approve_and_is_sent_to_set_one_up(
    required, tenant_a, reviewer, signing_key
):
    version = pending_version(tenant_a, "support", "v1")
    rita = Client()
    assert sign_in(rita, "rita", "rita-pass-123")["Location"] == "/accounts/second-factor/"
    assert rita.get("/review/")["Location"] == "/accounts/second-factor/"  # every console page

    refused = rita.post(
        f"/api/versions/{version}/approve", {"note": ""}, content_type="application/json"
    )
    assert refused.status_code == 403
    assert refused.json()["code"] == "second_factor_required"
    assert "approving a version needs a second factor" in refused.json()["detail"]
    assert "/accounts/second-factor/" in refused.json()["detail"]
    assert AdapterVersion.objects.get(pk=version).state == "pending_review"

    enrol(rita)  # the session that proved the code has its second factor
    approved = rita.post(
        f"/api/versions/{version}/approve", {"note": ""}, content_type="application/json"
    )
    assert approved.status_code == 200, approved.content
    assert approved.json()["state"] == "approved"
    assert AuditEvent.objects.filter(action="second_factor.enrol").count() == 1


def test_sign_in_asks_for_the_code_and_a_recovery_code_works_once(required, reviewer):
    first = Client()
    sign_in(first, "rita", "rita-pass-123")
    device, codes = enrol(first)

    browser = Client()
    step = sign_in(browser, "rita", "rita-pass-123")
    assert step["Location"] == "/accounts/second-factor/verify/"
    assert browser.get("/review/").status_code == 302  # not signed in yet: to the login page
    wrong = browser.post("/accounts/second-factor/verify/", {"code": "000000"})
    assert wrong.status_code == 200
    assert "That code is not right" in wrong.content.decode()
    failure = AuditEvent.objects.filter(action="sign_in.failed").latest("at")
    assert failure.note == "wrong second-factor code"

    # django-otp slows down a device after a wrong code; the next code is the one after it
    TOTPDevice.objects.filter(pk=device.pk).update(throttling_failure_count=0)
    ok = browser.post("/accounts/second-factor/verify/", {"code": code_for(device, drift=1)})
    assert ok.status_code == 302 and ok["Location"] == "/"
    sign_in_event = AuditEvent.objects.filter(action="sign_in").latest("at")
    assert sign_in_event.after["method"] == "password"
    assert sign_in_event.after["second_factor"] == "totp"
    assert sign_in_event.after["address"] == "127.0.0.1"

    lost_phone = Client()
    sign_in(lost_phone, "rita", "rita-pass-123")
    used = lost_phone.post("/accounts/second-factor/verify/", {"code": codes[0]})
    assert used.status_code == 302
    again = Client()
    sign_in(again, "rita", "rita-pass-123")
    refused = again.post("/accounts/second-factor/verify/", {"code": codes[0]})
    assert refused.status_code == 200  # a recovery code signs in once


def test_an_operator_resets_a_lost_second_factor_and_it_is_audited(required, reviewer):
    from django.core.management import call_command

    rita = Client()
    sign_in(rita, "rita", "rita-pass-123")
    enrol(rita)
    call_command("reset_second_factor", "rita", reason="lost phone, ticket 42")
    assert not TOTPDevice.objects.filter(user=reviewer).exists()
    event = AuditEvent.objects.get(action="second_factor.reset")
    assert event.note.endswith("lost phone, ticket 42")
    assert sign_in(Client(), "rita", "rita-pass-123")["Location"] == "/accounts/second-factor/"


def test_without_the_rule_nothing_changes_for_a_password_session(reviewer, tenant_a, signing_key):
    """The embedded default (make run): no second factor asked; approving works."""
    version = pending_version(tenant_a, "support", "v1")
    rita = Client()
    assert sign_in(rita, "rita", "rita-pass-123")["Location"] == "/"
    approved = rita.post(
        f"/api/versions/{version}/approve", {"note": ""}, content_type="application/json"
    )
    assert approved.status_code == 200


def test_guarded_actions_name_what_needs_the_second_factor(required, operator, tenant_a):
    otto = Client()
    sign_in(otto, "otto", "otto-pass-123")
    config = otto.get("/api/cache-config").json()
    refused = otto.put("/api/cache-config", config, content_type="application/json")
    assert refused.status_code == 403
    assert refused.json()["detail"].startswith("changing the cache tiers' capacities needs")
    lifted = otto.post("/api/quarantines/1/lift", {"note": "x"}, content_type="application/json")
    assert lifted.status_code == 403
    assert lifted.json()["detail"].startswith("lifting a quarantine needs a second factor")


def test_local_sign_in_off_leaves_only_the_break_glass_account(settings, tenant_a, operator):
    settings.LOCAL_SIGN_IN = False
    settings.OIDC_ISSUER = "http://127.0.0.1:9"  # never asked: nobody signs in through it here
    settings.BREAK_GLASS_USER = "otto"
    refused = sign_in(Client(), "alice", "alice-pass-123")
    assert refused.status_code == 200
    assert "Password sign-in is off on this platform" in refused.content.decode()
    assert AuditEvent.objects.filter(action="sign_in.failed", object_id="alice").exists()
    assert sign_in(Client(), "otto", "otto-pass-123").status_code == 302


def test_password_failures_are_audited_with_the_address(tenant_a):
    sign_in(Client(), "alice", "wrong")
    event = AuditEvent.objects.get(action="sign_in.failed")
    assert (event.object_id, event.note, event.after["address"]) == (
        "alice",
        "password",
        "127.0.0.1",
    )


def test_an_admin_key_needs_a_second_factor_when_the_rule_is_on(required, tenant_a):
    alice = Client()
    sign_in(alice, "alice", "alice-pass-123")
    refused = alice.post(
        "/api/tenants/tenant-a/keys", {"name": "ci", "admin": True}, content_type="application/json"
    )
    assert refused.status_code == 403
    assert refused.json()["code"] == "second_factor_required"
    member = alice.post(
        "/api/tenants/tenant-a/keys", {"name": "svc"}, content_type="application/json"
    )
    assert member.status_code == 201
    assert tenant_services.authenticate_api_key(member.json()["key"]) is not None
