"""The console's user journeys, end to end in Chromium on the real stack: PostgreSQL, the
Celery worker, the S3 server and a serving node running vLLM."""

from __future__ import annotations

import json
import time

import openai
import pytest
from playwright.sync_api import expect

from apps.demo import corpus
from apps.registry.contracts import canary_bucket
from apps.registry.models import AdapterVersion, Alias
from apps.serving.models import CacheSettings
from apps.telemetry.models import RequestMinute
from apps.tenants import services as tenant_services
from apps.tenants.events import publish_change
from apps.tenants.models import ApiKey
from tests.e2e.conftest import confirm, keep_for_docs, screenshot, sign_in
from tests.harness.waiting import wait_until
from tests.helpers import edit_config, publish

pytestmark = pytest.mark.browser
PROMPT = corpus.completion_prompt(corpus.UNSEEN_PROMPTS[0])


def parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def upload_through_the_form(page, adapter_id: str, version: str, folder) -> None:
    page.goto("/t/tenant-a/upload/")
    page.fill("input[name=adapter_id]", adapter_id)
    page.fill("input[name=version]", version)
    page.set_input_files("#files", [str(p) for p in sorted(folder.iterdir())])
    page.click("#upload-button")


def test_a_tenant_uploads_through_the_form_and_watches_it_reach_pending_review(
    page, console, registry, tenant_a, reviewer, adapter_files, demo_dir, tmp_path
):
    sign_in(page, "alice")
    upload_through_the_form(page, "support", "2026-12-01.1", demo_dir / "adapters" / "support-v1")
    # the progress bar fills while the bytes go up, then validation is followed without a reload
    expect(page.locator("#upload-progress")).to_have_attribute("value", "100")
    expect(page.locator("#upload-state")).to_have_attribute(
        "data-state", "pending_review", timeout=60_000
    )
    expect(page.locator("#upload-state")).to_contain_text("pending review")
    keep_for_docs(screenshot(page, "upload-pending-review"))
    version = AdapterVersion.objects.get(adapter__adapter_id="support", version="2026-12-01.1")
    assert version.state == "pending_review"

    # an invalid upload (rank above the platform's maximum): the reason, exactly as the API says
    edit_config(adapter_files, r=64)
    upload_through_the_form(page, "support", "2026-12-01.2", adapter_files)
    expect(page.locator("#upload-state")).to_have_attribute(
        "data-state", "rejected", timeout=60_000
    )
    rejected = AdapterVersion.objects.get(adapter__adapter_id="support", version="2026-12-01.2")
    assert rejected.state == "rejected"
    expect(page.locator("#upload-reason")).to_have_text(rejected.rejection_reason)
    assert "rank is 64" in rejected.rejection_reason
    screenshot(page, "upload-rejected")

    # the adapter page lists both, with their state badges and the reason in full
    page.goto("/t/tenant-a/adapters/support/")
    expect(page.locator("#versions tr[data-state=pending_review]")).to_have_count(1)
    expect(page.locator("#versions tr.reason")).to_contain_text(rejected.rejection_reason)
    keep_for_docs(screenshot(page, "adapter-versions"))

    # journey 2: a reviewer approves it from the queue
    page.context.clear_cookies()
    sign_in(page, "rita")
    page.goto("/review/")
    row = page.locator("#queue tbody tr", has_text="2026-12-01.1")
    expect(row).to_have_count(1)
    keep_for_docs(screenshot(page, "review-queue"))
    row.get_by_role("link", name="Review").click()
    expect(page.locator("#manifest")).to_contain_text('"rank": 8')
    expect(page.locator("#comparison")).to_have_count(0)  # no approved version to compare yet
    page.fill("#review form:first-of-type input[name=note]", "eval looks fine")
    page.get_by_role("button", name="Approve and sign").click()
    confirm(page)
    expect(page.locator("#version-state")).to_have_attribute("data-state", "approved")
    keep_for_docs(screenshot(page, "version-approved"))
    version.refresh_from_db()
    assert version.state == "approved" and version.signature


def test_a_reviewer_is_not_offered_their_own_tenants_upload(page, console, published, tenant_a):
    rita = tenant_services.ensure_user(username="rita", password="rita-pass-123")
    tenant_services.add_member(tenant=tenant_a, user=rita)
    pending = AdapterVersion.objects.create(
        adapter=AdapterVersion.objects.get(pk=published["v1"]).adapter,
        version="own-upload",
        state="pending_review",
    )
    sign_in(page, "rita")
    page.goto("/review/")
    expect(page.locator("#queue")).to_have_count(0)
    page.goto(f"/versions/{pending.pk}/")
    expect(page.get_by_role("button", name="Approve and sign")).to_have_count(0)
    expect(page.locator("main")).to_contain_text("another reviewer has to review it")


def answer_version(client) -> str:
    raw = client.completions.with_raw_response.create(
        model="support", prompt=PROMPT, max_tokens=4, temperature=0
    )
    return raw.headers["X-Lorahub-Adapter"]


def test_alias_canary_panel_and_one_click_rollback_reach_the_node(
    page, console, node_url, published, tenant_a
):
    _, key = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    client = openai.OpenAI(base_url=f"{node_url}/v1", api_key=key, max_retries=0)
    sign_in(page, "alice")
    page.goto("/t/tenant-a/aliases/")
    form = page.locator("#new-alias")
    form.locator("input[name=name]").fill("support")
    form.locator("select[name=version_id]").select_option(label="support@v1")
    form.get_by_role("button", name="Create alias").click()
    expect(page.locator("#stable-version")).to_have_text("v1")

    # move to v3, then a 10 % canary of v2
    page.locator("#stable select[name=version_id]").select_option(label="v3")
    page.locator("#stable").get_by_role("button", name="Move").click()
    confirm(page)
    expect(page.locator("#stable-version")).to_have_text("v3")
    page.locator("#canary-form select[name=version_id]").select_option(label="v2")
    page.locator("#percent").fill("10")
    expect(page.locator("#percent-out")).to_have_text("10 %")
    page.locator("#canary-form").get_by_role("button", name="Start canary").click()
    expect(page.locator("#canary-version")).to_have_text("v2")
    expect(page.locator("#canary-percent")).to_have_text("10 %")

    # traffic on both arms (request keys chosen by their canary bucket) shows in the panel
    alias = Alias.objects.get(tenant=tenant_a, name="support")
    users = [f"user-{n}" for n in range(400)]
    to_canary = [u for u in users if canary_bucket(alias.pk, published["v2"], u) < 1000][:3]
    to_stable = [u for u in users if canary_bucket(alias.pk, published["v2"], u) >= 1000][:7]
    for user in to_canary + to_stable:
        client.completions.create(
            model="support", prompt=PROMPT, max_tokens=4, temperature=0, user=user
        )
    evidence = page.locator("#canary-evidence")

    def counts() -> list[int]:
        page.reload()
        return [
            int(evidence.locator(f"tr[data-role={arm}] td").nth(1).inner_text())
            for arm in ("stable", "canary")
        ]

    wait_until(  # the node writes its statistics every LORAHUB_STATS_FLUSH_MS (2 s)
        counts, "7 stable and 3 canary requests", 10, 0.5, until=lambda n: n == [7, 3]
    )
    expect(evidence.locator("tr[data-role=canary] td").nth(4)).to_contain_text("ms")
    keep_for_docs(screenshot(page, "alias-canary"))

    # one-click rollback, whose confirmation names the version it returns to
    page.locator("#rollback").click()
    expect(page.locator("#confirm-text")).to_contain_text("to v1")
    confirm(page)
    clicked = time.monotonic()
    expect(page.locator("#stable-version")).to_have_text("v1")
    # a generous bound: how fast a move reaches a node is bench/alias_moves.py's figure
    while answer_version(client) != "support@v1":
        assert time.monotonic() - clicked < 10.0, "the node still answers with another version"
    expect(page.locator("#canary-version")).to_have_count(0)
    expect(page.locator("#history tbody tr").first).to_contain_text("Roll back")


def test_the_dashboard_plots_what_the_tests_own_requests_produced(
    page, console, node_url, published, tenant_a
):
    from django.test import Client

    _, key = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    Client(HTTP_AUTHORIZATION=f"Bearer {key}").put(
        "/api/aliases/support", {"version_id": published["v1"]}, content_type="application/json"
    )
    client = openai.OpenAI(base_url=f"{node_url}/v1", api_key=key, max_retries=0)
    answered = [
        client.completions.create(
            model="support", prompt=PROMPT, max_tokens=max_tokens, temperature=0
        )
        for max_tokens in [4] * 6 + [64] * 5
    ]
    # JSON asked for, with too few tokens to finish it: an invalid answer, as a rule
    json_answers = [
        client.completions.create(
            model="support",
            prompt=PROMPT,
            max_tokens=3,
            temperature=0,
            extra_body={"response_format": {"type": "json_object"}},
        )
        for _ in range(2)
    ]
    answered += json_answers
    cut = sum(a.choices[0].finish_reason == "length" for a in answered)
    invalid_json = sum(not parses(a.choices[0].text) for a in json_answers)
    with pytest.raises(openai.BadRequestError):  # refused by vLLM: a quality marker too
        client.completions.create(model="support", prompt=PROMPT, max_tokens=4, stop=["", "x"])
    sent = len(answered) + 1
    counted = wait_until(  # the node writes its statistics every LORAHUB_STATS_FLUSH_MS (2 s)
        lambda: sum(r.requests for r in RequestMinute.objects.filter(tenant=tenant_a)),
        f"{sent} requests counted",
        10,
        0.2,
        until=lambda n: n >= sent,
    )
    assert counted == sent
    rows = list(RequestMinute.objects.filter(tenant=tenant_a))

    sign_in(page, "alice")
    page.goto("/t/tenant-a/dashboard/?range=hour")
    expect(page.locator("body")).to_have_attribute("data-dashboard-loaded", "hour")
    plotted = page.evaluate("document.getElementById('chart-requests').data[0].y")
    assert sum(plotted) == sent
    hits = page.evaluate(
        "['L1','L2','L3','L4'].map((t, i) => document.getElementById('chart-hits').data[i].y)"
    )
    found = {
        tier: sum(getattr(r, f"hits_{tier.lower()}") for r in rows)
        for tier in ["L1", "L2", "L3", "L4"]
    }
    for tier, ys in zip(("L1", "L2", "L3", "L4"), hits, strict=True):
        steps = [(y or 0) * n for y, n in zip(ys, plotted, strict=True)]
        assert round(sum(steps)) == found[tier], (tier, ys, found)
    ttft = page.evaluate("document.getElementById('chart-ttft').data[1].y")  # p95
    assert any(v is not None and v > 0 for v in ttft)
    expect(page.locator("#totals")).to_contain_text(str(sent))
    # the output-quality markers: answers cut by max_tokens; the refusal is a caller's error
    # (on the outcomes chart), not a marker of the answers
    quality = page.evaluate(
        "Object.fromEntries(document.getElementById('chart-quality').data"
        ".map(trace => [trace.name, trace.y]))"
    )
    steps = [(y or 0) * n for y, n in zip(quality["cut by max_tokens"], plotted, strict=True)]
    assert round(sum(steps)) == cut, (quality["cut by max_tokens"], plotted)
    assert "refused by the engine" not in quality
    # invalid JSON is a share of the requests that asked for JSON: plotted where they were
    assert any(y is not None for y in quality["JSON asked, invalid (of those)"])
    invalid_total = page.locator(".total", has_text="Invalid JSON (of JSON requests)")
    expect(invalid_total.locator("strong")).to_have_text(
        f"{100 * invalid_json / len(json_answers):.1f} %"
    )
    keep_for_docs(screenshot(page, "dashboard"))

    # the adapter filter and the range picker reload the figures without a page load
    page.locator("#dashboard-controls select[name=adapter]").select_option("support")
    page.locator("label.pill", has_text="Last week").click()
    expect(page.locator("body")).to_have_attribute("data-dashboard-loaded", "week")
    assert sum(page.evaluate("document.getElementById('chart-requests').data[0].y")) == sent
    # one adapter picked: its versions side by side, with their markers
    v1 = page.locator("#versions tbody tr[data-version=v1]")
    expect(v1).to_contain_text(str(sent))
    expect(v1.locator("td").nth(6)).to_have_text(f"{100 * cut / sent:.1f} %")


@pytest.fixture
def node_config(settings, node_work):
    """The console edits the configuration the test node started from; afterwards the stored
    configuration is dropped and the node told, so later tests see the node's file again."""
    settings.LORAHUB_CACHE_CONFIG = node_work / "cache.yaml"
    yield
    CacheSettings.objects.all().delete()
    publish_change("cache_config")


def test_an_operator_edits_tier_capacities_and_evicts_from_a_node(
    page, node_url, console, node_config, published, operator, browser_errors
):
    sign_in(page, "otto")
    page.goto("/operator/cache/")
    field = page.locator('[data-field="adapter_cache.gpu_hot.max_adapters"]')
    field.locator("input").fill("1")
    browser_errors.allow(422)  # the refused form answers 422
    page.get_by_role("button", name="Save configuration").click()
    expect(field.locator(".field-error")).to_contain_text("greater than or equal to 2")
    assert not CacheSettings.objects.exists()
    keep_for_docs(screenshot(page, "cache-config-error"))

    field.locator("input").fill("3")
    page.get_by_role("button", name="Save configuration").click()
    expect(page.locator("#needs-restart")).to_contain_text("adapter_cache.gpu_hot.max_adapters")
    expect(field.locator(".needs-restart")).to_have_text("needs restart")
    assert CacheSettings.objects.get().data["adapter_cache"]["gpu_hot"]["max_adapters"] == 3

    # warm a version into the node's host cache, then evict it from the nodes page
    v1 = published["v1"]
    page.goto("/operator/nodes/")
    warm = page.locator("section.node form.inline-form")
    warm.locator("input[name=version_id]").fill(str(v1))
    warm.locator("select[name=tier]").select_option("L2")
    warm.get_by_role("button", name="Warm").click()
    expect(page.locator(".msg-success")).to_contain_text("warmed into L2")
    # in the engine: L1 while it is among the most recently used, else L2
    in_engine = page.locator(
        f'table[data-tier="L1"] tr[data-version="{v1}"], '
        f'table[data-tier="L2"] tr[data-version="{v1}"]'
    )
    expect(in_engine).to_have_count(1)
    expect(in_engine.locator(".badge").first).to_have_text("in engine")  # its record's state
    keep_for_docs(screenshot(page, "nodes"))
    in_engine.get_by_role("button", name="Evict from engine").click()
    expect(page.locator("#confirm-text")).to_contain_text(
        "Evict tenant-a/support@v1 from the engine"
    )
    confirm(page)
    expect(page.locator(".msg-success")).to_contain_text("evicted from L2")
    expect(in_engine).to_have_count(0)
    on_disk = page.locator(f'table[data-tier="L3"] tr[data-version="{v1}"]')
    expect(on_disk).to_have_count(1)
    expect(on_disk.locator(".badge").first).to_have_text("on disk")

    page.goto("/audit/?action=node.")
    expect(page.locator("#audit tbody tr")).to_have_count(2)

    # the tenant's dashboard counts the eviction (the node writes its statistics each second)

    def evicted() -> int:
        page.goto("/t/tenant-a/dashboard/?range=hour")
        expect(page.locator("body")).to_have_attribute("data-dashboard-loaded", "hour")
        return sum(page.evaluate("document.getElementById('chart-cache').data[0].y"))

    assert wait_until(evicted, "the eviction on the dashboard", 10, 0.5) == 1


def test_another_tenants_pages_are_404_and_a_form_without_csrf_is_refused(
    page, console, published, tenant_a, tenant_b, browser_errors, reviewer, demo_dir
):
    publish(tenant_b, "secret", "b1", demo_dir / "adapters" / "legal-v1", reviewer)
    sign_in(page, "alice")
    browser_errors.allow(404, 403)
    for path in (
        "/t/tenant-b/adapters/secret/",
        "/t/tenant-b/adapters/",
        "/t/tenant-b/aliases/secret/",
        "/t/tenant-b/dashboard/",
        "/t/tenant-b/dashboard/data?range=day",
        "/t/tenant-b/quota/",
        "/t/tenant-b/keys/",
        f"/versions/{AdapterVersion.objects.get(version='b1').pk}/",
    ):
        response = page.goto(path)
        assert response.status == 404, path
    expect(page.locator("h1")).to_have_text("Not found")
    screenshot(page, "not-found")

    # a form post that lacks the CSRF token is refused and changes nothing
    response = page.request.post("/t/tenant-a/keys/", form={"name": "sneaky"})
    assert response.status == 403
    assert "security token" in response.text()
    assert not ApiKey.objects.filter(name="sneaky").exists()
    # ... and the same form with its token works
    page.goto("/t/tenant-a/keys/")
    page.fill("#new-key-form input[name=name]", "deploy-bot")
    page.get_by_role("button", name="Create key").click()
    expect(page.locator("#new-key-value")).to_contain_text("lh_")
    assert ApiKey.objects.filter(name="deploy-bot").exists()
