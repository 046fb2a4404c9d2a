"""Fixtures of the client tests: the live REST API (pytest-django's ``live_server``, on the test
database, with the real registry behind it) and ``lorahub`` invoked as a tenant types it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from typer.testing import CliRunner

from apps.tenants import services as tenant_services


@dataclass
class Ran:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


@pytest.fixture
def lorahub(live_server, tmp_path, monkeypatch):
    """``lorahub(*args, key=...)``: the CLI in this process against the live API, with its own
    config file; at most one retry, so that refusals and outages answer quickly."""
    from lorahub_client.cli import app

    monkeypatch.setenv("LORAHUB_CONFIG", str(tmp_path / "lorahub-config.json"))
    runner = CliRunner()

    def run(*args: str, key: str | None = None, url: str | None = None, **env: str) -> Ran:
        environment = {
            "LORAHUB_URL": live_server.url if url is None else url,
            "LORAHUB_RETRIES": "1",
            **env,
        }
        if key is not None:
            environment["LORAHUB_API_KEY"] = key
        result = runner.invoke(app, list(args), env=environment, catch_exceptions=True)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception  # a traceback is a bug: no command may end with one
        return Ran(result.exit_code, result.stdout, result.stderr)

    return run


@pytest.fixture
def tenant_key(tenant_a) -> str:
    """A member key of tenant A (what a training job gets)."""
    return tenant_services.issue_api_key(tenant=tenant_a, name="training-job", actor=None)[1]


@pytest.fixture
def admin_key(tenant_a) -> str:
    """An admin key of tenant A, issued by a person (alice)."""
    from django.contrib.auth import get_user_model

    alice = get_user_model().objects.get(username="alice")
    return tenant_services.issue_api_key(tenant=tenant_a, name="tooling", actor=alice, admin=True)[
        1
    ]
