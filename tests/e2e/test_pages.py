"""Every console page, as the persona who uses it, in Chromium: it renders without a console
error or failed request under the Content-Security-Policy, and is screenshotted."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from apps.registry import aliases
from apps.registry.models import AdapterVersion
from apps.tenants import services as tenant_services
from apps.tenants.auth import principal_for_user
from apps.tenants.models import AuditEvent
from tests.e2e.conftest import keep_for_docs, screenshot, sign_in

pytestmark = pytest.mark.browser


@pytest.fixture
def seeded(published, tenant_a, tenant_b, operator):
    alice = tenant_services.ensure_user(username="alice", password="alice-pass-123")
    principal = principal_for_user(alice)
    aliases.set_alias(
        principal=principal, tenant=tenant_a, name="support", version_id=published["v1"]
    )
    aliases.set_alias(
        principal=principal, tenant=tenant_a, name="support", version_id=published["v3"]
    )
    aliases.set_canary(
        principal=principal, tenant=tenant_a, name="support", version_id=published["v2"], percent=25
    )
    tenant_services.issue_api_key(tenant=tenant_a, name="checkout-service", actor=alice)
    return published


def test_every_tenant_page_renders_cleanly(page, console, seeded):
    sign_in(page, "alice")
    keep_for_docs(screenshot(page, "home"))
    for path, name, check in (
        ("/t/tenant-a/adapters/", "adapters", "support"),
        ("/t/tenant-a/aliases/", "aliases", "support"),
        ("/t/tenant-a/upload/", "upload", "Drop the files here"),
        (f"/versions/{seeded['v2']}/", "version", "Signed manifest"),
        ("/t/tenant-a/quota/", "quota", "Warm adapters"),
        ("/t/tenant-a/webhooks/", "webhooks", "Add a webhook"),
        ("/audit/", "audit-tenant", "alias.canary"),
    ):
        page.goto(path)
        expect(page.locator("main")).to_contain_text(check)
        screenshot(page, name)
    # the quota page says when the node cannot be reached, rather than failing
    page.goto("/t/tenant-a/quota/")
    expect(page.locator(".msg-warning")).to_contain_text("did not answer")

    # keys: created once, with a copy button; revoking asks first and names the key
    page.goto("/t/tenant-a/keys/")
    page.fill("#new-key-form input[name=name]", "batch-jobs")
    page.get_by_role("button", name="Create key").click()
    secret = page.locator("#new-key-value").inner_text()
    assert secret.startswith("lh_")
    page.get_by_role("button", name="Copy").click()
    expect(page.locator("[data-copied]")).to_be_visible()
    keep_for_docs(screenshot(page, "keys"))
    page.reload()
    assert secret not in page.content()  # shown once, never again
    row = page.locator("#keys tr", has_text="checkout-service")
    row.get_by_role("button", name="Revoke").click()
    expect(page.locator("#confirm-text")).to_contain_text("checkout-service")
    page.locator("#confirm-dialog button[value=cancel]").click()
    expect(row).to_contain_text("active")


def test_every_operator_and_reviewer_page_renders_cleanly(page, console, seeded, tenant_a):
    pending = AdapterVersion.objects.filter(pk=seeded["v3"]).first()
    assert pending is not None
    sign_in(page, "otto")
    for path, name, check in (
        ("/operator/tenants/", "tenants", "tenant-a"),
        ("/operator/cache/", "cache-config", "eviction policy"),
        ("/operator/nodes/", "nodes-unreachable", "did not answer"),
        ("/t/tenant-a/quota/", "quota-operator", "Edit limits"),
        ("/operator/webhooks/", "platform-webhooks", "node.down"),
        ("/audit/?action=alias.", "audit", "alias.set"),
    ):
        page.goto(path)
        expect(page.locator("main")).to_contain_text(check)
        screenshot(page, name)
    page.goto("/operator/dashboard/?range=day")
    expect(page.locator("body")).to_have_attribute("data-dashboard-loaded", "day")
    expect(page.locator("#chart-fairness .main-svg").first).to_be_visible()
    screenshot(page, "platform-dashboard")
    # at 1280 px every chart stays inside its card (Plotly once sized itself to the card's
    # border box and spilled its right-hand axis labels over the edge)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.reload()
    expect(page.locator("body")).to_have_attribute("data-dashboard-loaded", "day")
    spill = page.evaluate(
        """() => [...document.querySelectorAll('.chart')].map((card) => {
             const svg = card.querySelector('.main-svg');
             return svg.getBoundingClientRect().right - card.getBoundingClientRect().right;
           })"""
    )
    assert len(spill) == 7 and max(spill) <= 0, spill

    # an operator's limit change is audited with who, what and when
    page.goto("/t/tenant-a/quota/")
    page.fill("#limits-form input[name=requests_per_minute]", "1200")
    page.locator("#limits-form").get_by_role("button", name="Save limits").click()
    page.locator("#confirm-dialog[open] #confirm-ok").click()
    expect(page.locator(".msg-success")).to_contain_text("saved")
    assert tenant_services.get_quota(tenant_a).requests_per_minute == 1200
    assert AuditEvent.objects.filter(action="quota.set", actor__username="otto").exists()


def test_the_rest_api_docs_are_served_without_internet(page, console, tenant_a):
    sign_in(page, "alice")
    page.get_by_role("link", name="API docs").click()
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("lorahub control plane")
    expect(page.locator(".swagger-ui")).to_contain_text("/api/aliases/{name}/rollback")
    keep_for_docs(screenshot(page, "api-docs"))
    # no request left this machine: every script and style came from our own static files
    scripts = page.eval_on_selector_all(
        "script[src], link[href]", "els => els.map(e => e.src || e.href)"
    )
    assert scripts and all(url.startswith(console) for url in scripts), scripts


def test_a_dashboard_answer_that_comes_late_never_draws_over_a_newer_one(
    page, console, tenant_a, monkeypatch
):
    """Two changes in a row start two loads; the first one's answer arriving last must not
    draw its range over the second's (seen in CI: 'Last week' picked, 'hour' drawn)."""
    import time

    from apps.telemetry import dashboards

    series = dashboards.series

    def slow_hours(where, rng):  # the live server runs in this process
        if rng.key == "hour":
            time.sleep(2)  # the answer for the range picked first comes back last
        return series(where, rng)

    sign_in(page, "alice")
    page.goto("/t/tenant-a/dashboard/?range=day")
    expect(page.locator("body")).to_have_attribute("data-dashboard-loaded", "day")
    monkeypatch.setattr(dashboards, "series", slow_hours)
    page.locator("label.pill", has_text="Last hour").click()
    page.locator("label.pill", has_text="Last week").click()
    expect(page.locator("body")).to_have_attribute("data-dashboard-loaded", "week")
    page.wait_for_timeout(3000)  # the slow answer has come back by now, and was dropped
    expect(page.locator("body")).to_have_attribute("data-dashboard-loaded", "week")
    assert "range=week" in page.url
