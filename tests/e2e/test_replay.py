"""The operator's replay journey in Chromium: start a replay, watch it run in the Celery
worker, read the plotted comparison, apply a policy to the cache configuration."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from apps.serving import config
from apps.serving.models import ReplayRun
from tests.e2e.conftest import confirm, keep_for_docs, screenshot, sign_in

pytestmark = pytest.mark.browser


def test_an_operator_replays_traffic_compares_policies_and_applies_one(
    page, console, celery_worker, operator
):
    sign_in(page, "otto")
    page.goto("/operator/replay/")
    screenshot(page, "replay-form")
    page.select_option("select[name=source]", "shift")
    for name, value in (("adapters", "200"), ("tenants", "5"), ("requests", "4000")):
        page.fill(f"input[name={name}]", value)
    page.fill("input[name=l1]", "4")
    page.fill("input[name=l2]", "16")
    page.get_by_role("button", name="Start replay").click()
    page.wait_for_url("**/operator/replay/*/")
    expect(page.locator("#replay-table")).to_be_visible(timeout=60_000)  # reloads when done
    expect(page.locator("body")).to_have_attribute("data-replay-drawn", "1")
    expect(page.locator("#chart-replay-sweep .main-svg").first).to_be_visible()
    path = screenshot(page, "replay")
    keep_for_docs(path)

    run = ReplayRun.objects.latest("id")
    assert run.state == ReplayRun.State.DONE
    plotted = page.evaluate(
        """() => Object.fromEntries(document.getElementById('chart-replay-tiers').data
              .map(t => [t.name, Object.fromEntries(t.x.map((p, i) => [p, t.y[i]]))]))"""
    )
    for policy, figures in run.report["policies"].items():
        for tier in ("L1", "L2", "L3", "L4"):
            assert plotted[tier][policy] == pytest.approx(figures["tier_rates"][tier])
    rows = page.locator("#replay-table tbody tr")
    expect(rows).to_have_count(len(run.report["policies"]))

    page.locator("#replay-table tr[data-policy=lfu] button").click()
    confirm(page)
    page.wait_for_url("**/operator/cache/")
    expect(page.locator(".msg-success")).to_contain_text("lfu")
    assert config.effective_config().adapter_cache.gpu_hot.eviction_policy == "lfu"
