"""The usage ledger (``GET /api/usage``, its CSV): exact against the request log over the same
window, whatever the grouping; tenants read their own, operators every tenant's; a window
it cannot take is refused saying what to send."""

from __future__ import annotations

import csv
import io
import json
import random
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta

import pytest

from apps.telemetry import outcomes, writers
from apps.telemetry.aggregate import engine_ms
from apps.telemetry.models import RequestLog
from apps.telemetry.records import RequestRecord
from tests.helpers import key_client, user_client

START = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)  # two hours before a day (and month) ends
STATUSES = (200, 200, 200, 200, 429, 400, 503, 499)


def traffic(tenants, n: int = 400, seed: int = 7) -> list[RequestRecord]:
    """Requests of the tenants' aliases and versions over 30 hours, every outcome, loads,
    streams cut short, requests that never reached the engine."""
    rng = random.Random(seed)
    made = []
    for _ in range(n):
        tenant = rng.choice(tenants)
        alias = rng.choice(("support", "legal"))
        status = rng.choice(STATUSES)
        answered = status in (200, 499) and rng.random() < 0.9
        made.append(
            RequestRecord(
                tenant_id=tenant.pk,
                alias=alias,
                adapter_id=alias,
                version=rng.choice(("v1", "v2")),
                tier=rng.choice(("L1", "L2", "L3", "L4")) if answered else "",
                status=status,
                finish_reason=rng.choice(("stop", "length", "error")) if answered else "",
                load_caused=answered and rng.random() < 0.2,
                load_ms=rng.uniform(0, 50) if answered else 0.0,
                queue_ms=rng.uniform(0, 30),
                ttft_ms=rng.uniform(5, 80) if answered else None,
                total_ms=rng.uniform(100, 900),
                prompt_tokens=rng.randint(1, 300),
                completion_tokens=rng.randint(0, 64) if answered else 0,
                at=START + timedelta(seconds=rng.uniform(0, 30 * 3600)),
            )
        )
    return made


def write(records: list[RequestRecord]) -> None:
    for i in range(0, len(records), 50):  # in batches, as a node's recorder writes them
        writers.write_records(f"n{i % 3}", records[i : i + 50])


def from_the_log(start: datetime, end: datetime, group_by, day: bool) -> dict[tuple, Counter]:
    """The same figures summed from the request log, row by row, in Python."""
    sums: dict[tuple, Counter] = defaultdict(Counter)
    log = RequestLog.objects.filter(at__gte=start, at__lt=end, tenant__isnull=False)
    for row in log.select_related("tenant"):
        period = row.at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        if day:
            period = period.replace(hour=0)
        names = {
            "tenant": row.tenant.slug,
            "alias": row.alias,
            "version": f"{row.adapter_id}@{row.version}",
        }
        key = (period.strftime("%Y-%m-%dT%H:%M:%SZ"), *(names[g] for g in group_by))
        outcome = outcomes.classify(row.status, row.finish_reason)
        counts = sums[key]
        counts["requests"] += 1
        counts["ok" if outcome is outcomes.Outcome.OK else outcomes.COUNTERS[outcome]] += 1
        counts["prompt_tokens"] += row.prompt_tokens
        counts["completion_tokens"] += row.completion_tokens
        counts["total_tokens"] += row.prompt_tokens + row.completion_tokens
        counts["cache_loads"] += row.load_caused
        spent = engine_ms(row)  # type: ignore[arg-type]  # a row has a record's fields
        counts["engine_ms"] += spent
        counts["engine_token_ms"] += spent * (row.prompt_tokens + row.completion_tokens)
    return sums


def from_the_api(answer: dict, group_by) -> dict[tuple, Counter]:
    found = {}
    for row in answer["rows"]:
        key = (row["period"].replace("+00:00", "Z"), *(row[g] for g in group_by))
        counts = Counter({k: v for k, v in row.items() if isinstance(v, int | float)})
        counts["engine_ms"] = counts.pop("engine_seconds") * 1000
        counts["engine_token_ms"] = counts.pop("engine_token_seconds") * 1000
        found[key] = +counts
    return found


def agree(api: dict[tuple, Counter], log: dict[tuple, Counter]) -> None:
    assert api.keys() == log.keys()
    for key, counts in log.items():
        for name, value in counts.items():
            if name.startswith("engine"):  # rounded to the millisecond (token-)second
                assert api[key][name] == pytest.approx(value, abs=1.0), (key, name)
            else:
                assert api[key][name] == value, (key, name)


@pytest.mark.parametrize(
    ("group_by", "granularity"),
    [
        (("tenant", "alias", "version"), "day"),
        (("tenant", "alias", "version"), "hour"),
        (("tenant",), "day"),
        (("alias", "version"), "hour"),
    ],
)
def test_the_ledger_equals_the_request_log_summed_over_the_same_window(
    tenant_a, tenant_b, operator, group_by, granularity
):
    write(traffic([tenant_a, tenant_b]))
    window = {"from": "2026-11-30T23:00:00Z", "to": "2026-12-01T20:00:00Z"}
    client = user_client("otto", "otto-pass-123")
    answer = client.get(
        "/api/usage", {**window, "group_by": ",".join(group_by), "granularity": granularity}
    )
    assert answer.status_code == 200, answer.content
    start, end = (datetime.fromisoformat(window[k].replace("Z", "+00:00")) for k in ("from", "to"))
    log = from_the_log(start, end, group_by, day=granularity == "day")
    agree(from_the_api(answer.json(), group_by), log)
    assert sum(c["requests"] for c in log.values()) > 200  # the window cut the traffic


def test_a_tenant_reads_only_its_own_usage_and_the_csv_says_the_same(tenant_a, tenant_b):
    write(traffic([tenant_a, tenant_b], n=120))
    a = key_client(tenant_a)
    window = {"from": "2026-11-30", "to": "2026-12-02"}
    mine = a.get("/api/usage", window).json()
    assert {row["tenant"] for row in mine["rows"]} == {"tenant-a"}
    agree(
        from_the_api(mine, ("tenant", "alias", "version")),
        {
            key: counts
            for key, counts in from_the_log(
                datetime(2026, 11, 30, tzinfo=UTC),
                datetime(2026, 12, 2, tzinfo=UTC),
                ("tenant", "alias", "version"),
                day=True,
            ).items()
            if key[1] == "tenant-a"
        },
    )
    assert a.get("/api/usage", {**window, "tenant": "tenant-b"}).status_code == 404

    sheet = a.get("/api/usage.csv", window)
    assert sheet.status_code == 200
    assert sheet["Content-Type"] == "text/csv"
    lines = list(csv.DictReader(io.StringIO(sheet.content.decode())))
    assert len(lines) == len(mine["rows"])
    for line, row in zip(lines, mine["rows"], strict=True):
        assert line["version"] == row["version"]
        assert int(line["total_tokens"]) == row["total_tokens"]
        assert float(line["engine_seconds"]) == row["engine_seconds"]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"from": "yesterday"}, "from 'yesterday' is not a date (2026-12-01)"),
        ({"from": "2026-12-02", "to": "2026-12-01"}, "must be after from"),
        ({"from": "2026-12-01T09:30:00Z"}, "must fall on a whole hour"),
        ({"group_by": "tenant,model"}, "group_by 'tenant,model' must name some of"),
        ({"granularity": "minute"}, "granularity 'minute' is not one of: day, hour"),
        ({"from": "2026-01-01", "to": "2026-03-01", "granularity": "hour"}, "at most 31 days"),
    ],
)
def test_a_window_the_ledger_cannot_take_is_refused_saying_what_to_send(tenant_a, params, message):
    answer = key_client(tenant_a).get("/api/usage", params)
    assert answer.status_code == 422
    assert message in answer.json()["detail"]


def test_the_daily_export_writes_each_finished_day_once_as_cloudevents(
    tenant_a, tenant_b, operator, settings
):
    from apps.registry.storage import get_store
    from apps.telemetry import exports

    write(traffic([tenant_a, tenant_b]))
    settings.LORAHUB_USAGE_EXPORT_DELAY_S = 900
    # 00:10 on Dec 2: Nov 30 has ended, Dec 1 ended ten minutes ago (its records may still come)
    assert datetime(2026, 11, 30).date() in exports.export_finished_days(
        datetime(2026, 12, 2, 0, 10, tzinfo=UTC)
    )
    store = get_store()
    assert not store.exists("usage/2026/12/01.jsonl")
    written = exports.export_finished_days(datetime(2026, 12, 2, 0, 20, tzinfo=UTC))
    assert written == [datetime(2026, 12, 1).date()]
    first = store.get("usage/2026/12/01.jsonl")

    events = [json.loads(line) for line in first.decode().splitlines()]
    ledger = user_client("otto", "otto-pass-123").get(
        "/api/usage", {"from": "2026-12-01", "to": "2026-12-02"}
    )
    rows = ledger.json()["rows"]
    assert len(events) == len(rows) > 0
    for event, row in zip(events, rows, strict=True):
        assert {"specversion", "type", "source", "id", "time", "subject", "data"} <= event.keys()
        assert event["specversion"] == "1.0" and event["time"] == "2026-12-01T00:00:00Z"
        assert event["subject"] == f"{row['tenant']}/{row['alias']}/{row['version']}"
        assert event["id"] == f"2026-12-01/{event['subject']}"
        assert event["data"]["total_tokens"] == row["total_tokens"]
        assert event["data"]["requests"] == row["requests"]

    # late records change the ledger, never a file already written: the export is idempotent
    write(traffic([tenant_a], n=5, seed=8))
    assert exports.export_finished_days(datetime(2026, 12, 2, 5, 0, tzinfo=UTC)) == []
    assert store.get("usage/2026/12/01.jsonl") == first
    # a day without traffic is exported too, empty: nothing was used
    assert store.get("usage/2026/11/28.jsonl") == b""
