"""A shadow set from the alias page, end to end in Chromium: the node copies requests to the
shadow version and the alias page's shadow panel fills with how its answers compared."""

from __future__ import annotations

import openai
import pytest
from playwright.sync_api import expect

from apps.demo import corpus
from apps.telemetry.models import ShadowMinute
from apps.tenants import services as tenant_services
from tests.e2e.conftest import keep_for_docs, screenshot, sign_in
from tests.harness.waiting import wait_until
from tests.helpers import key_client

pytestmark = pytest.mark.browser


def test_a_tenant_sets_a_shadow_on_the_alias_page_and_watches_its_panel_fill(
    page, console, node_url, published, tenant_a
):
    key_client(tenant_a).put(
        "/api/aliases/support", {"version_id": published["v1"]}, content_type="application/json"
    )
    sign_in(page, "alice")
    page.goto("/t/tenant-a/aliases/support/")
    form = page.locator("#shadow-form")
    form.locator("select[name=version_id]").select_option(str(published["v2"]))
    form.locator("input[type=range]").fill("100")
    form.locator("input[name=keep_examples]").check()
    form.get_by_role("button", name="Start shadow").click()
    expect(page.locator("#shadow-version")).to_have_text("v2")
    expect(page.locator("#shadow-percent")).to_have_text("100 %")

    _, key = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    # A caller's client as shipped: it retries a 503 ("retry shortly") with backoff. The
    # deadline bounds liveness only; CI runs this beside the deploy lane's engines on two cores,
    # where one request once took 27 s.
    client = openai.OpenAI(base_url=f"{node_url}/v1", api_key=key, max_retries=2)
    prompt = corpus.completion_prompt(corpus.UNSEEN_PROMPTS[0])

    def compared() -> bool:
        if sum(r.compared for r in ShadowMinute.objects.all()) >= 3:
            return True
        answer = client.completions.create(
            model="support", prompt=prompt, max_tokens=8, temperature=0
        )
        assert answer.choices[0].text.strip().startswith(corpus.PHRASES["support-v1"][:8])
        return False

    wait_until(compared, "three shadow comparisons", 120, 0.5)

    page.reload()
    totals = page.locator("#shadow-totals")
    expect(totals).to_be_visible()
    assert int(totals.get_attribute("data-compared")) >= 3
    expect(page.locator("body")).to_have_attribute("data-shadow-drawn", "1")
    identical = page.evaluate("document.getElementById('chart-shadow').data[0].y")
    assert identical and all(v == 0 for v in identical if v is not None)  # v2 answers otherwise
    expect(page.locator("#shadow-examples tbody tr").first).to_contain_text("Hello from")
    keep_for_docs(screenshot(page, "alias-shadow"))
    page.locator("#shadow-form").get_by_role("button", name="Clear shadow").click()
    expect(page.locator("#shadow-evidence")).to_have_count(0)
