"""Point 11 of the threat model: second factors and webhook secrets are sealed at rest and
survive a key rotation; a stale session cannot bind a new factor; admin keys must expire to
stand in for a second factor."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone
from django_otp.oath import TOTP

from apps.tenants import sealing, signin, webhooks
from apps.tenants import services as tenant_services
from apps.tenants.auth import principal_for_key
from apps.tenants.errors import Invalid
from apps.tenants.models import SealedTOTPDevice, Webhook

pytestmark = pytest.mark.django_db


def code_for(device: SealedTOTPDevice) -> str:
    return f"{TOTP(device.bin_key, step=device.step, t0=device.t0).token():06d}"


def enrolled(client: Client) -> tuple[SealedTOTPDevice, list[str]]:
    page = client.get("/accounts/second-factor/")
    device = SealedTOTPDevice.objects.get(confirmed=False, user__username=page.context["user"])
    done = client.post("/accounts/second-factor/", {"action": "confirm", "code": code_for(device)})
    assert done.status_code == 200, done.content.decode()[:300]
    return device, done.context["codes"]


def column(sql: str, *params) -> list:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def test_totp_keys_recovery_codes_and_webhook_secrets_are_not_stored_in_the_clear(
    settings, tenant_a, reviewer
):
    rita = Client()
    rita.post("/accounts/login/", {"username": "rita", "password": "rita-pass-123"})
    device, codes = enrolled(rita)
    (stored_key,) = column("SELECT key FROM otp_totp_totpdevice WHERE id = %s", device.pk)
    assert stored_key.startswith(sealing.PREFIX) and device.bin_key.hex() not in stored_key
    tokens = column("SELECT token FROM otp_static_statictoken")
    assert len(tokens) == 10 and not set(codes) & set(tokens)
    hook = webhooks.create(
        tenant=tenant_a, url="https://hooks.example.com/x", events=[], format="lorahub", actor=None
    )
    (stored_secret,) = column("SELECT secret FROM tenants_webhook WHERE id = %s", hook.pk)
    assert hook.signing_secret.startswith("whsec_") and hook.signing_secret not in stored_secret


def test_a_key_rotation_keeps_sign_in_and_webhook_signing_working(settings, tenant_a, reviewer):
    settings.REQUIRE_SECOND_FACTOR = True
    rita = Client()
    rita.post("/accounts/login/", {"username": "rita", "password": "rita-pass-123"})
    device, _ = enrolled(rita)
    hook = webhooks.create(
        tenant=tenant_a, url="https://hooks.example.com/x", events=[], format="lorahub", actor=None
    )
    secret = hook.signing_secret
    old_key = settings.LORAHUB_FIELD_KEYS[0]
    settings.LORAHUB_FIELD_KEYS = [Fernet.generate_key().decode(), old_key]
    call_command("rotate_field_keys")
    settings.LORAHUB_FIELD_KEYS = settings.LORAHUB_FIELD_KEYS[:1]  # the old key dropped
    hook.refresh_from_db()
    assert hook.signing_secret == secret  # receivers keep verifying
    device = SealedTOTPDevice.objects.get(pk=device.pk)
    time.sleep(max(0.0, 30 - time.time() % 30) + 0.1)  # a new step: the last code was used
    again = Client()
    again.post("/accounts/login/", {"username": "rita", "password": "rita-pass-123"})
    signed = again.post("/accounts/second-factor/verify/", {"code": code_for(device)})
    assert signed.status_code == 302, signed.content.decode()[:300]
    assert again.session["lorahub_second_factor"] == "totp"


def test_a_stale_session_cannot_set_up_a_reviewers_second_factor(settings, reviewer):
    settings.REQUIRE_SECOND_FACTOR = True
    rita = Client()
    rita.post("/accounts/login/", {"username": "rita", "password": "rita-pass-123"})
    session = rita.session
    session[signin.SIGNED_IN_AT_SESSION_KEY] = time.time() - 3600  # a session left open
    session.save()
    page = rita.get("/accounts/second-factor/")
    device = SealedTOTPDevice.objects.get(confirmed=False, user=reviewer)
    refused = rita.post("/accounts/second-factor/", {"action": "confirm", "code": code_for(device)})
    assert page.status_code == 200 and refused.status_code == 422
    assert "needs a sign-in from the last 10 minutes" in refused.content.decode()
    assert not SealedTOTPDevice.objects.filter(user=reviewer, confirmed=True).exists()


def test_enrolment_is_told_to_the_operators(settings, reviewer):
    hook = webhooks.create(
        tenant=None,
        url="https://ops.example.com/x",
        events=["second_factor.changed"],
        format="lorahub",
        actor=None,
    )
    rita = Client()
    rita.post("/accounts/login/", {"username": "rita", "password": "rita-pass-123"})
    enrolled(rita)
    (delivery,) = hook.deliveries.all()
    assert delivery.payload["data"]["user"] == "rita"


def test_admin_keys_must_expire_to_count_as_a_second_factor(settings, tenant_a):
    key, _ = tenant_services.issue_api_key(tenant=tenant_a, name="ci", actor=None, admin=True)
    assert key.expires_at is not None
    assert key.expires_at <= timezone.now() + timedelta(days=settings.LORAHUB_ADMIN_KEY_MAX_DAYS)
    with pytest.raises(Invalid, match="expires within 90 days"):
        tenant_services.issue_api_key(
            tenant=tenant_a,
            name="forever",
            actor=None,
            admin=True,
            expires_at=timezone.now() + timedelta(days=400),
        )
    key.expires_at = None  # an admin key made before the rule
    assert principal_for_key(key).second_factor == ""


def test_webhook_rows_store_sealed_secrets_only():
    assert Webhook._meta.get_field("secret").max_length >= 200
