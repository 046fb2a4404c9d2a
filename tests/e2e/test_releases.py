"""A release started on the alias page, end to end in Chromium: the judge (a real beat and
worker) moves it step by step on the serving node's traffic, the release page follows it by
itself, and its abort button rolls it back."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from apps.tenants import services as tenant_services
from tests.e2e.conftest import confirm, keep_for_docs, screenshot, sign_in
from tests.helpers import key_client
from tests.releases.conftest import Traffic

pytestmark = pytest.mark.browser


def test_a_release_started_on_the_alias_page_advances_and_is_aborted_on_its_page(
    page, console, node_url, judge_beat, published, tenant_a
):
    control = key_client(tenant_a)
    control.put(
        "/api/aliases/support", {"version_id": published["v1"]}, content_type="application/json"
    )
    _, key = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    sign_in(page, "alice")
    page.goto("/t/tenant-a/aliases/support/")
    form = page.locator("#release-form")
    form.locator("select[name=version_id]").select_option(str(published["v3"]))
    form.locator("input[name=prewarm]").uncheck()
    form.locator("input[name=canary_steps]").fill("30, 40, 50, 60, 70, 80, 90, 100")
    form.locator("input[name=dwell_s]").fill("5")
    form.locator("input[name=min_requests]").fill("2")
    form.locator("input[name=interval_s]").fill("1")
    # v3's first canary requests load it from disk (no prewarm): against a warm v1, a p95 over
    # a handful of requests passed 1.5x, then 10x (608 ms against 49 ms), and rolled the
    # release back at step 1 in CI, and 100 (the most a plan accepts) was passed in a drill.
    # This test is about the page following a release; the TTFT gate has its own rule tests.
    form.locator("input[name=canary_max_ttft_ratio]").fill("off")
    # three callers: with one, a loaded CI machine served 13 requests in 30 s and the 30 % canary
    # drew one of them, short of the step's 2
    with Traffic(node_url, key, threads=3):
        form.locator("#start-release").click()
        confirm(page)
        state = page.locator("#release-state")
        expect(state).to_contain_text("step 1 of 8")
        # the page follows by itself (a slow reload may land a step or two later)
        try:
            expect(state).to_contain_text(re.compile(r"step [2-7] of 8"), timeout=60_000)
        except AssertionError:  # say why the release did not move: its outcome, its last check
            release = control.get("/api/releases", {"alias": "support"}).json()
            raise AssertionError(f"the release did not advance: {release}") from None
        expect(page.locator("body")).to_have_attribute("data-release-drawn", "1")
        expect(page.locator("#release-timeline tr[data-kind=advance]").first).to_contain_text(
            "canary requests"
        )
        keep_for_docs(screenshot(page, "release"))
        page.locator("#abort-release").click()
        expect(page.locator("#confirm-text")).to_contain_text("goes back to support@v1 alone")
        confirm(page)
        # the abort waits for a judgement under way to let go of the release's row: on a CI
        # machine running four lanes that took longer than expect's 5 s once
        expect(state).to_have_text("aborted", timeout=30_000)
    expect(page.locator("#release-outcome")).to_contain_text("aborted by alice")
    alias = control.get("/api/aliases/support").json()
    assert (alias["version"]["label"], alias["canary_version"], alias["held_by"]) == (
        "support@v1",
        None,
        "",
    )
    page.goto("/t/tenant-a/aliases/support/")
    expect(page.locator("#past-releases")).to_contain_text("aborted")
