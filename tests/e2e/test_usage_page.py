"""The usage page in Chromium: a tenant's tokens per day stacked by alias with the month's
total, the same figures as the ledger's API, and its CSV download; an operator sees every
tenant; a tenant never sees another's."""

from __future__ import annotations

import csv
import io
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.sync_api import expect

from apps.telemetry import writers
from apps.telemetry.records import RequestRecord
from tests.e2e.conftest import keep_for_docs, screenshot, sign_in
from tests.helpers import key_client, user_client

pytestmark = pytest.mark.browser


def this_months_traffic(tenants) -> None:
    """A few hundred requests per tenant over the days of this month so far, two aliases."""
    now = datetime.now(UTC)
    first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    rng = random.Random(3)
    records = []
    for tenant in tenants:
        for _ in range(300):
            alias = rng.choice(("support", "support", "legal"))
            at = first + timedelta(seconds=rng.uniform(0, (now - first).total_seconds()))
            records.append(
                RequestRecord(
                    tenant_id=tenant.pk,
                    alias=alias,
                    adapter_id=alias,
                    version=rng.choice(("v1", "v2")),
                    tier="L1",
                    status=200,
                    finish_reason="stop",
                    ttft_ms=30.0,
                    total_ms=200.0,
                    prompt_tokens=rng.randint(20, 400),
                    completion_tokens=rng.randint(5, 120),
                    at=at,
                )
            )
    writers.write_records("node-1", records)


def test_a_tenant_reads_its_month_and_downloads_it_an_operator_reads_every_tenant(
    page, console, tenant_a, tenant_b, operator
):
    this_months_traffic([tenant_a, tenant_b])
    month = datetime.now(UTC).strftime("%Y-%m")
    ledger = key_client(tenant_a).get("/api/usage", {"group_by": "alias"}).json()
    total = sum(row["total_tokens"] for row in ledger["rows"])

    sign_in(page, "alice")
    page.goto("/t/tenant-a/usage/")
    expect(page.locator("body")).to_have_attribute("data-usage-drawn", "1")
    expect(page.locator("#month-tokens")).to_have_text(f"{total:,}")
    legend = page.locator("#chart-usage .legend")
    expect(legend).to_contain_text("support")
    expect(legend).to_contain_text("legal")
    expect(page.locator("#usage-groups")).to_contain_text("support@v2")
    expect(page.locator("#usage-groups")).not_to_contain_text("tenant-b")
    keep_for_docs(screenshot(page, "usage"))

    with page.expect_download() as download:
        page.locator("#usage-csv").click()
    sheet = Path(download.value.path()).read_text()
    server = key_client(tenant_a, "csv").get("/api/usage.csv", {"from": f"{month}-01"})
    assert sheet.splitlines()[0] == server.content.decode().splitlines()[0]
    lines = list(csv.DictReader(io.StringIO(sheet)))
    assert {line["tenant"] for line in lines} == {"tenant-a"}
    assert sum(int(line["total_tokens"]) for line in lines) == total

    # another tenant's page and the operators' page are not there for alice
    alice = user_client("alice", "alice-pass-123")
    for path in ("/t/tenant-b/usage/", "/t/tenant-b/usage.csv", "/operator/usage/"):
        assert alice.get(path).status_code == 404, path

    page.context.clear_cookies()
    sign_in(page, "otto")
    page.goto("/operator/usage/")
    expect(page.locator("body")).to_have_attribute("data-usage-drawn", "1")
    expect(page.locator("#chart-usage .legend")).to_contain_text("tenant-b")
    expect(page.locator("#usage-groups")).to_contain_text("tenant-a")
    screenshot(page, "usage-operator")
