"""Sign-in in Chromium: single sign-on through a real OpenID provider (node-oidc-provider, run
by tests/oidc/provider/provider.mjs as its own process), roles from its groups, its logout, the
tokens and states the console must refuse; and a reviewer's TOTP enrolment."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import time
from base64 import b32decode
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model
from django_otp.oath import TOTP

from apps.tenants import oidc
from apps.tenants.models import AuditEvent, ExternalIdentity, Membership
from apps.tenants.services import platform_roles
from tests.e2e.conftest import PASSWORDS
from tests.harness.waiting import free_port, wait_until

pytestmark = pytest.mark.browser

PROVIDER_DIR = Path(__file__).resolve().parents[1] / "oidc" / "provider"
ROLES = "lorahub-operators=operator, lorahub-reviewers=reviewer, a-admins=admin:tenant-a"


class Provider:
    """The provider process; its users and its fault switch are files the test edits."""

    def __init__(self, folder: Path, console_url: str, *, trailing_slash: bool = False) -> None:
        self.port = free_port()
        self.trailing_slash = trailing_slash
        self.issuer = f"http://127.0.0.1:{self.port}" + ("/" if trailing_slash else "")
        self.users_file, self.faults_file = folder / "users.json", folder / "faults.json"
        self.console_url = console_url
        self.process: subprocess.Popen | None = None
        self.users({})
        self.fault("")

    def users(self, users: dict) -> None:
        self.users_file.write_text(json.dumps(users))

    def fault(self, kind: str) -> None:
        self.faults_file.write_text(json.dumps({"id_token": kind}))

    def start(self) -> Provider:
        self.process = subprocess.Popen(
            [
                "node",
                str(PROVIDER_DIR / "provider.mjs"),
                "--port",
                str(self.port),
                "--client",
                f"lorahub:lorahub-test-secret:{self.console_url}",
                "--users",
                str(self.users_file),
                "--faults",
                str(self.faults_file),
                *(["--trailing-slash"] if self.trailing_slash else []),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        discovery = f"{self.issuer.rstrip('/')}/.well-known/openid-configuration"

        def discovered() -> bool:
            if self.process.poll() is not None:
                pytest.fail(f"the OpenID provider exited: {self.process.stdout.read()}")
            httpx.get(discovery).raise_for_status()
            return True

        wait_until(discovered, "the OpenID provider to start", 30, ignore=(httpx.HTTPError,))
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def provider_modules() -> None:
    """node-oidc-provider from the npm registry, as package-lock.json pins it (once)."""
    if not (PROVIDER_DIR / "node_modules" / "oidc-provider").exists():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=PROVIDER_DIR,
            check=True,
            timeout=300,
        )


@pytest.fixture(params=[False], ids=["issuer"])
def provider(request, provider_modules, live_server, settings, tmp_path) -> Iterator[Provider]:
    started = Provider(tmp_path, live_server.url, trailing_slash=request.param).start()
    settings.OIDC_ISSUER = started.issuer
    settings.OIDC_NAME = "Test IdP"
    settings.OIDC_RP_CLIENT_ID = "lorahub"
    settings.OIDC_RP_CLIENT_SECRET = "lorahub-test-secret"
    settings.OIDC_ROLES = ROLES
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, oidc.BACKEND]
    policy = copy.deepcopy(settings.CONTENT_SECURITY_POLICY)
    policy["DIRECTIVES"]["form-action"].append(started.issuer)  # as settings.py does
    settings.CONTENT_SECURITY_POLICY = policy
    oidc.forget_provider()
    yield started
    started.stop()
    oidc.forget_provider()


def sso(page, login: str, password: str = "op-pass") -> None:  # noqa: S107 (a test user's)
    """The console's "Sign in with" button, then the provider's own form."""
    page.goto("/accounts/login/")
    page.click("#sign-in-sso")
    page.fill("#op-login", login)
    page.fill("#op-password", password)
    page.click("#op-submit")


def test_single_sign_on_takes_roles_from_groups_and_a_removed_group_removes_the_role(
    page, provider, transactional_db, tenant_a
):
    provider.users(
        {
            "sam": {
                "password": "op-pass",
                "groups": ["lorahub-reviewers", "a-admins", "unrelated"],
                "mfa": True,
            }
        }
    )
    sso(page, "sam")
    page.wait_for_url(re.compile(r".*/$"))
    assert page.locator(".who").inner_text() == "sam"
    sam = get_user_model().objects.get(username="sam")
    assert platform_roles(sam) == ["reviewer"]
    assert Membership.objects.get(user=sam).role == "admin"
    identity = ExternalIdentity.objects.get(user=sam)
    assert (identity.issuer, identity.subject) == (provider.issuer, "sam")
    assert not sam.has_usable_password()  # signs in through the provider only
    signed = AuditEvent.objects.filter(action="sign_in").latest("at")
    assert (signed.after["method"], signed.after["subject"]) == ("oidc", "sam")
    assert signed.after["second_factor"] == "provider: amr otp mfa"  # the provider's amr
    page.goto("/accounts/second-factor/")
    assert "provider: amr otp mfa" in page.locator("#session-factor").inner_text()

    # sign-out ends the provider's session too (RP-initiated logout), then back to sign-in
    page.click("text=Sign out")
    page.click("#op-logout")
    page.wait_for_url(re.compile(r".*/accounts/login/$"))

    provider.users({"sam": {"password": "op-pass", "groups": ["a-admins"], "mfa": False}})
    sso(page, "sam")  # the provider asks again: its session ended
    page.wait_for_url(re.compile(r".*/$"))
    assert platform_roles(sam) == []  # the reviewer group is gone, so is the role
    assert Membership.objects.get(user=sam).role == "admin"
    change = AuditEvent.objects.filter(action="user.roles_from_groups").latest("at")
    assert change.before["platform"] == ["reviewer"]
    assert change.after["platform"] == [] and change.after["groups"] == ["a-admins"]
    assert get_user_model().objects.filter(username__startswith="sam").count() == 1


@pytest.mark.parametrize("provider", [True], ids=["issuer-with-slash"], indirect=True)
def test_a_provider_whose_issuer_ends_in_a_slash_signs_in(page, provider, transactional_db):
    """Auth0 and authentik publish their issuer with a trailing "/": compared as published."""
    assert provider.issuer.endswith("/")
    provider.users({"sam": {"password": "op-pass", "groups": ["lorahub-reviewers"]}})
    sso(page, "sam")
    page.wait_for_url(re.compile(r".*/$"))
    assert page.locator(".who").inner_text() == "sam"
    identity = ExternalIdentity.objects.get(user__username="sam")
    assert identity.issuer == provider.issuer


def test_a_provider_that_rotates_its_key_signs_in_at_first_sight(page, provider, transactional_db):
    """The provider restarts with a new signing key 3 s after lorahub last read its key set:
    the next sign-in fetches the set at once and goes through."""
    provider.users({"sam": {"password": "op-pass", "groups": ["lorahub-reviewers"]}})
    sso(page, "sam")
    page.wait_for_url(re.compile(r".*/$"))
    page.click("text=Sign out")
    page.click("#op-logout")
    page.wait_for_url(re.compile(r".*/accounts/login/$"))
    time.sleep(3)
    provider.stop()
    provider.start()  # a fresh key (provider.mjs makes one per start), the same address
    sso(page, "sam")
    page.wait_for_url(re.compile(r".*/$"))
    assert page.locator(".who").inner_text() == "sam"
    signed = AuditEvent.objects.filter(action="sign_in").order_by("-at")
    assert signed.count() == 2


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("tamper", "does not verify against the provider's keys: it was altered on the way"),
        ("audience", "was issued to another client, not to 'lorahub'"),
        ("expired", "the provider's ID token has expired"),
    ],
)
def test_a_bad_id_token_is_refused_with_a_page_that_says_why(
    page, browser_errors, provider, transactional_db, fault, reason
):
    browser_errors.allow(403)
    provider.users({"mallory": {"password": "op-pass", "groups": ["unrelated"]}})
    provider.fault(fault)
    sso(page, "mallory")
    page.wait_for_selector("#sign-in-failed")
    assert reason in page.locator("#sign-in-reason").inner_text()
    assert "/oidc/callback/" in page.url
    assert not get_user_model().objects.filter(username="mallory").exists()
    assert page.locator(".who").count() == 0  # nobody signed in
    failed = AuditEvent.objects.get(action="sign_in.failed")
    assert reason in failed.note


def test_a_replayed_callback_is_refused(page, browser_errors, provider, transactional_db):
    browser_errors.allow(403)
    provider.users({"sam": {"password": "op-pass", "groups": []}})
    callbacks: list[str] = []
    page.on("request", lambda r: callbacks.append(r.url) if "/oidc/callback/" in r.url else None)
    sso(page, "sam")
    page.wait_for_url(re.compile(r".*/$"))
    page.goto(callbacks[0])  # the same code and state again
    page.wait_for_selector("#sign-in-failed")
    assert "already used" in page.locator("#sign-in-reason").inner_text()


def test_a_reviewer_enrols_totp_in_the_browser_and_signs_in_with_a_code(
    page, console, settings, transactional_db, reviewer
):
    settings.REQUIRE_SECOND_FACTOR = True
    sign_in_with_password(page, "rita")
    page.wait_for_url(re.compile(r".*/accounts/second-factor/$"))  # sent to set it up
    secret = page.locator("#totp-secret").inner_text()
    totp = TOTP(b32decode(secret))
    page.fill("#code", f"{totp.token():06d}")
    page.click("#confirm-form button[type=submit]")
    codes = page.locator("#recovery-codes code").all_inner_texts()
    assert len(codes) == 10 and len(set(codes)) == 10

    page.click("text=Sign out")
    sign_in_with_password(page, "rita")
    page.wait_for_url(re.compile(r".*/accounts/second-factor/verify/$"))
    page.fill("#code", "123456" if totp.token() != 123456 else "654321")
    page.click("#code-form button[type=submit]")
    assert "That code is not right" in page.locator("#code-error").inner_text()
    from django_otp.plugins.otp_totp.models import TOTPDevice

    TOTPDevice.objects.filter(user=reviewer).update(throttling_failure_count=0)
    totp.drift = 1  # the confirmation used this step's code: a code is good once
    page.fill("#code", f"{totp.token():06d}")
    page.click("#code-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))
    page.goto("/accounts/second-factor/")
    assert page.locator("#session-factor").inner_text() == "totp"
    actions = list(
        AuditEvent.objects.filter(object_id=str(reviewer.pk))
        .order_by("at", "id")
        .values_list("action", flat=True)
    )
    assert actions == [
        "sign_in",
        "second_factor.enrol",
        "sign_out",
        "sign_in.failed",
        "sign_in",
    ]


def sign_in_with_password(page, username: str) -> None:
    page.goto("/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORDS[username])
    page.click("#password-sign-in button[type=submit]")
