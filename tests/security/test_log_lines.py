"""Text from outside cannot forge a log line: a sign-in's user name and a provider's
``error_description`` reached the logs raw (a newline wrote a second, believable line; an
escape sequence rewrote the operator's terminal). The console's configured formatter
(``LOGGING``) escapes control characters; the provider's text is bounded too."""

from __future__ import annotations

import logging
import logging.config

import pytest
from django.test import Client

from lorahub.logs import PlainFormatter

pytestmark = pytest.mark.django_db

FORGED = "alice\n2026-12-07 12:00:00 INFO apps.tenants: admin 'root' signed in\x1b[2K"


def configured_format(settings, record: logging.LogRecord) -> str:
    """``record`` as the console's configured handler writes it."""
    spec = dict(settings.LOGGING["formatters"]["plain"])
    factory = spec.pop("()")
    assert factory == "lorahub.logs.PlainFormatter"
    return PlainFormatter(spec["format"]).format(record)


def test_a_forged_user_name_stays_on_one_escaped_line(settings, caplog, monkeypatch):
    from apps.tenants import throttle

    # past the anonymous-audit bound, a failed sign-in goes to the log with its user name
    monkeypatch.setattr(throttle, "may_audit_anonymous", lambda client: False)
    with caplog.at_level(logging.INFO):
        Client().post("/accounts/login/", {"username": FORGED, "password": "x"})
    lines = [configured_format(settings, r) for r in caplog.records]
    mentioning = [line for line in lines if "alice" in line]
    assert mentioning
    for line in mentioning:
        assert "\n" not in line and "\x1b" not in line
        assert "\\n2026-12-07" in line and "\\x1b[2K" in line


def test_the_providers_error_description_is_bounded_and_escaped_in_the_audit(settings):
    from apps.tenants.models import AuditEvent

    settings.OIDC_ISSUER = "https://sso.example.com"
    client = Client()
    answer = client.get(
        "/oidc/callback/", {"error": "access_denied", "error_description": FORGED + "x" * 5000}
    )
    assert answer.status_code == 403
    event = AuditEvent.objects.filter(action="sign_in.failed").latest("at")
    assert "\n" not in event.note and "\x1b" not in event.note
    assert len(event.note) < 400


def test_the_formatter_keeps_a_tracebacks_lines():
    formatter = PlainFormatter("%(message)s")
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "a\nb", (), sys.exc_info())
    text = formatter.format(record)
    assert text.startswith("a\\nb\nTraceback")
