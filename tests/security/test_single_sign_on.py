"""Points 3, 6 and 7 of the threat model: a provider's code signs in only through the
callback (with its state, nonce and PKCE verifier); an issuer that ends in "/" signs in;
a rotated key signs in at first sight."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from apps.tenants import oidc
from tests.security.idp import CLIENT_ID, CLIENT_SECRET, Idp

pytestmark = pytest.mark.django_db


def configure(settings, idp: Idp) -> None:
    settings.OIDC_ISSUER = idp.issuer
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    settings.OIDC_ROLES = "reviewers=reviewer"
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, oidc.BACKEND]
    oidc.forget_provider()


@pytest.fixture
def idp(settings) -> Iterator[Idp]:
    started = Idp()
    configure(settings, started)
    yield started
    started.stop()
    oidc.forget_provider()


def sign_in_through_callback(client: Client, idp: Idp) -> object:
    """The browser's round trip: our start page, the provider (skipped: it would ask the
    user), then the callback with the code, the ID token carrying this sign-in's nonce."""
    start = client.get("/oidc/authenticate/")
    assert start.status_code == 302, start.content
    query = parse_qs(urlsplit(start["Location"]).query)
    idp.nonce = query["nonce"][0]
    return client.get("/oidc/callback/", {"code": "code-1", "state": query["state"][0]})


def test_a_provider_code_posted_to_the_password_form_signs_nobody_in(idp, settings):
    idp.claims["groups"] = ["reviewers"]
    idp.nonce = None  # what an attacker's own authorization returns to them: no nonce of ours
    client = Client()
    client.get("/accounts/login/")
    answer = client.post(
        "/accounts/login/?code=attacker-code&state=x",
        {"username": "nobody", "password": "whatever-1"},
    )
    assert "_auth_user_id" not in client.session
    assert answer.status_code == 200  # the form again, with its error
    assert idp.exchanged == []  # the code never left the server
    assert not get_user_model().objects.filter(username="sam").exists()


def test_an_id_token_without_the_sign_ins_nonce_is_refused(idp):
    client = Client()
    start = client.get("/oidc/authenticate/")
    state = parse_qs(urlsplit(start["Location"]).query)["state"][0]
    idp.nonce = None
    answer = client.get("/oidc/callback/", {"code": "c", "state": state})
    assert answer.status_code == 403
    assert "does not answer this sign-in (nonce)" in answer.content.decode()
    assert "_auth_user_id" not in client.session


def test_the_callback_signs_in(idp):
    client = Client()
    answer = sign_in_through_callback(client, idp)
    assert answer.status_code == 302, answer.content.decode()[:400]
    assert client.get("/api/me").json()["username"] == "sam"


def test_an_issuer_that_ends_in_a_slash_signs_in(settings):
    idp = Idp(trailing_slash=True)
    try:
        configure(settings, idp)
        client = Client()
        answer = sign_in_through_callback(client, idp)
        assert answer.status_code == 302, answer.content.decode()[:400]
        assert client.get("/api/me").json()["username"] == "sam"
    finally:
        idp.stop()
        oidc.forget_provider()


def test_a_key_rotated_after_the_last_read_signs_in_at_first_sight(idp, settings):
    assert sign_in_through_callback(Client(), idp).status_code == 302
    time.sleep(settings.OIDC_KEY_REFETCH_S + 0.5)  # the provider rotates 2.5 s later
    idp.rotate()
    client = Client()
    answer = sign_in_through_callback(client, idp)
    assert answer.status_code == 302, answer.content.decode()[:400]
    assert client.get("/api/me").json()["username"] == "sam"
