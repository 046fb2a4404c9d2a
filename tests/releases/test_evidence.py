"""The canary evidence is computed once (``apps/telemetry/evidence.py``): the alias page shows
the figures the release judge reads, and callers' mistakes never count against a version —
not in its error rate, not in its quality markers."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from apps.registry import aliases
from apps.registry.models import AdapterVersion
from apps.releases import services
from apps.releases.models import Release
from apps.telemetry.records import RequestRecord
from apps.telemetry.writers import write_records
from apps.tenants.auth import principal_for_user

pytestmark = pytest.mark.django_db

ONE_STEP = {
    "interval_s": 1,
    "prewarm": False,
    "canary_steps": [{"percent": 50, "dwell_s": 1, "min_requests": 5}],
}


def rows(tenant, version: str, n: int, *, status: int = 200, **fields) -> list[RequestRecord]:
    """``n`` requests of alias ``support`` as a node records them."""
    answered = status == 200
    record = RequestRecord(
        tenant_id=tenant.pk,
        alias="support",
        adapter_id="support",
        version=version,
        tier="L1" if answered else "",
        status=status,
        ttft_ms=40.0 if answered else None,
        finish_reason="stop" if answered else "",
        at=timezone.now(),
    )
    return [replace(record, **fields) for _ in range(n)]


def same_answers(tenant, version: str) -> list[RequestRecord]:
    """What a version with the stable version's weights answers: 40 % cut by max_tokens."""
    return rows(tenant, version, 6) + rows(tenant, version, 4, finish_reason="length")


def start(tenant_a, support_versions) -> Release:
    alice = principal_for_user(get_user_model().objects.get(username="alice"))
    alias = aliases.set_alias(
        principal=alice, tenant=tenant_a, name="support", version_id=support_versions["v1"]
    )
    release = services.start(
        principal=alice,
        alias=alias,
        candidate=AdapterVersion.objects.get(pk=support_versions["v2"]),
        plan=ONE_STEP,
    )
    services.judge(release.pk)  # into the canary: the alias now splits
    release.refresh_from_db()
    Release.objects.filter(pk=release.pk).update(
        step_started_at=timezone.now() - timedelta(seconds=2)
    )
    return release


def test_a_candidate_that_answers_as_the_stable_one_is_promoted_whatever_callers_send(
    tenant_a, support_versions
):
    """One caller sends malformed bodies (400, which the node records as refused by the
    engine), another bursts past its rate limit (429): neither says anything of v2."""
    release = start(tenant_a, support_versions)
    assert release.state == "canary", release.state
    write_records("n1", same_answers(tenant_a, "v1") + same_answers(tenant_a, "v2"))
    write_records("n1", rows(tenant_a, "v2", 20, status=400, refused=True))
    write_records("n1", rows(tenant_a, "v2", 12, status=429))
    assert services.judge(release.pk) == "advance"
    release.refresh_from_db()
    assert release.state == "promoted", release.outcome
    gates = {g["gate"]: g for g in release.last_check["gates"]}
    assert gates["canary quality markers"]["value"] == pytest.approx(0.4)  # 4 of 10 answers


def test_the_alias_page_shows_the_figures_the_judge_reads(client, tenant_a, support_versions):
    release = start(tenant_a, support_versions)
    write_records("n1", same_answers(tenant_a, "v1"))
    write_records(
        "n1",
        rows(tenant_a, "v2", 7)
        + rows(tenant_a, "v2", 3, finish_reason="length")
        + rows(tenant_a, "v2", 2, status=503)
        + rows(tenant_a, "v2", 5, status=400, refused=True),
    )
    services.judge(release.pk)
    release.refresh_from_db()
    gates = {g["gate"]: g for g in release.last_check["gates"]}

    client.force_login(get_user_model().objects.get(username="alice"))
    page = client.get(f"/t/{tenant_a.slug}/aliases/support/").content.decode()
    canary = re.search(r'<tr data-role="canary">(.*?)</tr>', page, re.S)
    assert canary is not None, "the alias page shows no canary evidence"
    cells = re.findall(r'<td class="num">([^<]*)</td>', canary.group(1))
    shown = {"requests": cells[0], "error rate": cells[1], "markers": cells[4]}
    assert shown["requests"] == "17"
    assert shown["error rate"] == f"{100 * gates['canary error rate']['value']:.1f} %"
    assert shown["markers"] == f"{100 * gates['canary quality markers']['value']:.1f} %"
    assert shown["markers"] == "30.0 %"  # 3 of the 10 answers: the 400s are no answers
