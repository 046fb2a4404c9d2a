"""The tenant dashboard's engine charts in Chromium: the wait for a seat in the engine (p95)
and the tenant's share of the engine's tokens against its weighted fair share, from request
statistics written as nodes write them. The screenshot in docs/ comes from here
(LORAHUB_UPDATE_DOCS=1)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import expect

from apps.telemetry.records import RequestRecord
from apps.telemetry.writers import write_records
from tests.e2e.conftest import keep_for_docs, screenshot, sign_in

pytestmark = pytest.mark.browser


def test_the_dashboard_plots_queue_wait_and_the_engine_share_against_the_weight(
    page, console, transactional_db, tenant_a, tenant_b
):
    now = datetime.now(UTC)
    records = []
    for minute in range(12):  # tenant-b floods from minute 4; tenant-a's waits stay short
        at = now - timedelta(minutes=12 - minute)
        flood = minute >= 4
        for i in range(6):
            records.append(
                RequestRecord(
                    tenant_id=tenant_a.id, at=at, alias="support", adapter_id="support",
                    version="v1", tier="L1", status=200, ttft_ms=40, queue_ms=2 + 8 * flood * i,
                    prompt_tokens=30, completion_tokens=32,
                )
            )  # fmt: skip
        for _ in range(40 if flood else 2):
            records.append(
                RequestRecord(
                    tenant_id=tenant_b.id, at=at, alias="bulk", adapter_id="bulk", version="v1",
                    tier="L1", status=200, ttft_ms=90, queue_ms=300 if flood else 5,
                    prompt_tokens=200, completion_tokens=256,
                )
            )  # fmt: skip
    write_records("node-1", records)
    sign_in(page, "alice")
    page.goto("/t/tenant-a/dashboard/?range=hour")
    expect(page.locator("body")).to_have_attribute("data-dashboard-loaded", "hour")
    share = page.locator("#chart-engine-share")
    expect(share).to_contain_text("share of the engine's tokens")
    expect(share).to_contain_text("fair share (weight / weights served)")
    expect(page.locator("#chart-queue")).to_contain_text("Wait for a seat in the engine (p95)")
    keep_for_docs(screenshot(page, "dashboard-engine-share"))
