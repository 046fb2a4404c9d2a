"""The release page and the tenant dashboard in Chromium, after a release during which one
caller was throttled and another sent bad requests (the request statistics written as a node
writes them): the error chart shows the gate's own number, the callers' 4xx and 429 have a
chart of their own, and the dashboard plots each outcome apart. The screenshots in docs/ come
from here (LORAHUB_UPDATE_DOCS=1)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import expect

from apps.registry import aliases
from apps.registry.models import AdapterVersion
from apps.releases import services
from apps.releases.models import Release
from apps.tenants.auth import principal_for_user
from tests.e2e.conftest import keep_for_docs, screenshot, sign_in
from tests.harness.waiting import wait_until
from tests.helpers import record_requests

pytestmark = pytest.mark.browser


record = record_requests  # tests/helpers.py


def test_the_release_page_and_dashboard_show_server_failures_and_callers_apart(
    page, console, transactional_db, signing_key, tenant_a, reviewer
):
    from tests.helpers import approved_version

    versions = {v: approved_version(tenant_a, "support", v, reviewer) for v in ("v1", "v2")}
    alice = principal_for_user(get_user_model().objects.get(username="alice"))
    alias = aliases.set_alias(
        principal=alice, tenant=tenant_a, name="support", version_id=versions["v1"]
    )
    release = services.start(
        principal=alice,
        alias=alias,
        candidate=AdapterVersion.objects.get(pk=versions["v2"]),
        plan={
            "interval_s": 1,
            "prewarm": False,
            "canary_max_error_increase": 0.05,
            "canary_steps": [
                {"percent": 20, "dwell_s": 1, "min_requests": 5},
                {"percent": 100, "dwell_s": 1, "min_requests": 5},
            ],
        },
    )
    for step in range(2):  # two steps, each with a throttled caller and one sending bad requests
        Release.objects.filter(pk=release.pk).update(
            step_started_at=timezone.now() - timedelta(seconds=2)
        )
        record(tenant_a, "v1", 40)
        record(tenant_a, "v2", 30)
        record(tenant_a, "v2", 1, status=503)
        record(tenant_a, "v2", 8, status=429)
        record(tenant_a, "v2", 6, status=400)
        # the session's worker may judge it too (the start queued a judgement): "busy" then

        def judged(step: int = step) -> bool:
            now = Release.objects.get(pk=release.pk)
            if now.step != step or not now.is_active:
                return True
            assert services.judge(release.pk) in ("advance", "busy", "hold", "wait")
            return False

        wait_until(
            judged,
            f"release step {step} to be judged",
            30,
            on_timeout=lambda: Release.objects.get(pk=release.pk).last_check,
        )
    release.refresh_from_db()
    assert release.state == "promoted", release.outcome

    sign_in(page, "alice")
    page.goto(f"/releases/{release.pk}/")
    expect(page.locator("body")).to_have_attribute("data-release-drawn", "1")
    errors = page.locator("#chart-release-errors")
    expect(errors).to_contain_text("the canary gate's value")
    expect(errors).to_contain_text("support@v2 per minute")
    callers = page.locator("#chart-release-callers")
    expect(callers).to_contain_text("support@v2 caller errors")
    expect(callers).to_contain_text("support@v2 throttled")
    expect(errors).to_contain_text("step 2")
    keep_for_docs(screenshot(page, "release-numbers"))

    page.goto("/t/tenant-a/dashboard/?range=hour")
    expect(page.locator("body")).to_have_attribute("data-dashboard-loaded", "hour")
    outcomes = page.locator("#chart-outcomes")
    for series in ("server failures (the error rate)", "caller errors (4xx)", "throttled (429)"):
        expect(outcomes).to_contain_text(series)
    expect(page.locator("#totals")).to_contain_text("Throttled (429)")
    keep_for_docs(screenshot(page, "dashboard-outcomes"))
