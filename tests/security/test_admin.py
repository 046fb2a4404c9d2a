"""Point 4 of the threat model: /admin/ obeys the console's sign-in rules, and is off in
production unless asked for."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.tenants import services as tenant_services

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser(db):
    user = tenant_services.ensure_user(username="root-admin", password="root-admin-pass-1")
    user.is_staff = user.is_superuser = True
    user.save()
    return user


def test_the_admins_own_password_form_does_not_sign_in(settings, superuser):
    settings.LOCAL_SIGN_IN = False
    settings.OIDC_ISSUER = "http://127.0.0.1:9"
    settings.BREAK_GLASS_USER = "someone-else"
    client = Client()
    answer = client.post(
        "/admin/login/", {"username": "root-admin", "password": "root-admin-pass-1"}
    )
    assert "_auth_user_id" not in client.session
    assert client.get("/api/me").status_code == 401
    assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/")


def test_a_superuser_without_a_second_factor_gets_no_admin_page(settings, superuser):
    settings.REQUIRE_SECOND_FACTOR = True
    client = Client()
    client.force_login(superuser)
    assert client.get("/admin/auth/user/").status_code == 302  # to the sign-in, not the list
    session = client.session
    session["lorahub_second_factor"] = "totp"
    session.save()
    assert client.get("/admin/auth/user/").status_code == 200


def test_the_admin_is_off_unless_asked_for(settings, superuser):
    settings.LORAHUB_DJANGO_ADMIN = False
    client = Client()
    client.force_login(superuser)
    assert client.get("/admin/").status_code == 404
    assert client.get("/admin/login/").status_code == 404


def test_second_factor_keys_are_not_listed(settings, superuser):
    client = Client()
    client.force_login(superuser)
    assert client.get("/admin/otp_totp/totpdevice/").status_code == 404
    assert client.get("/admin/auth/user/").status_code == 200
