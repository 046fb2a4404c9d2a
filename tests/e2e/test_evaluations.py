"""An evaluation from the version page, end to end in Chromium: the real worker asks the
serving node (vLLM) for both versions' answers; the run page fills in when it ends."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import keep_for_docs, screenshot, sign_in
from tests.evaluations.sets import jsonl, thank_you_cases, upload
from tests.helpers import key_client

pytestmark = pytest.mark.browser


def test_a_tenant_evaluates_a_new_version_against_the_stable_from_its_page(
    page, console, node_url, celery_worker, published, tenant_a
):
    client = key_client(tenant_a)
    client.put(
        "/api/aliases/support", {"version_id": published["v1"]}, content_type="application/json"
    )
    cases = thank_you_cases(2)
    assert upload(client, jsonl(*cases), name="helpdesk").status_code == 201

    sign_in(page, "alice")
    page.goto(f"/versions/{published['v2']}/")
    expect(page.locator("#compared-with")).to_have_text("support@v1")
    page.get_by_role("button", name="Evaluate against the current stable (support@v1)").click()
    page.wait_for_url("**/evaluations/*/")
    # the page follows the run and shows its summary once it ends
    expect(page.locator("#run-state")).to_have_attribute("data-state", "succeeded", timeout=120_000)
    expect(page.locator("#run-summary tr[data-role=baseline]")).to_contain_text("2/2")
    expect(page.locator("#run-summary tr[data-role=candidate]")).to_contain_text("0/2")
    expect(page.locator("#run-agreement")).to_contain_text("0.0 %")
    expect(page.locator("#cases tbody tr ins").first).to_contain_text("Hello from the helpdesk")
    keep_for_docs(screenshot(page, "evaluation-run"))
    page.locator("#case-filters a", has_text="Changed only").click()
    expect(page.locator("#cases tbody tr[data-case]")).to_have_count(2)
