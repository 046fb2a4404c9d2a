"""Shadow traffic's rules without an engine: who may set a shadow, which requests get a copy,
when copies are dropped, how answers are compared, and what the alias page is shown."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model

from apps.registry import aliases
from apps.registry.models import AliasEvent
from apps.registry.snapshots import load_alias_snapshot
from apps.serving.node.admission import Admission, NoSpareSlot
from apps.serving.node.background import BackgroundTasks
from apps.serving.node.metrics import NodeMetrics
from apps.serving.node.shadow import Answer, Mirrored, Shadows, compare
from apps.telemetry.dashboards import shadow_evidence
from apps.telemetry.models import ShadowMinute
from apps.telemetry.records import ShadowRecord
from apps.telemetry.writers import write_shadow_records
from apps.tenants.auth import principal_for_user
from apps.tenants.errors import Invalid
from tests.helpers import key_client


@pytest.fixture
def alias(tenant_a, support_versions):
    principal = principal_for_user(get_user_model().objects.get(username="alice"))
    common = {"principal": principal, "tenant": tenant_a, "name": "support"}
    aliases.set_alias(**common, version_id=support_versions["v1"])
    return common


def test_a_shadow_is_set_audited_cleared_and_gone_once_it_becomes_stable(alias, support_versions):
    with pytest.raises(Invalid, match="between 1 and 100"):
        aliases.set_shadow(**alias, version_id=support_versions["v2"], percent=0)
    with pytest.raises(Invalid, match="already the stable version"):
        aliases.set_shadow(**alias, version_id=support_versions["v1"], percent=10)
    row = aliases.set_shadow(**alias, version_id=support_versions["v2"], percent=30)
    assert (row.shadow_version_id, row.shadow_percent) == (support_versions["v2"], 30)
    assert AliasEvent.objects.filter(action="shadow").count() == 1
    snapshot = load_alias_snapshot(tenant_id=row.tenant_id, name="support")
    assert snapshot.shadow.version == "v2" and snapshot.stable.version == "v1"
    aliases.set_alias(**alias, version_id=support_versions["v2"])  # the shadow goes live
    row.refresh_from_db()
    assert (row.shadow_version_id, row.shadow_percent) == (None, 0)
    aliases.set_shadow(**alias, version_id=support_versions["v3"], percent=100)
    cleared = aliases.set_shadow(**alias, version_id=None)
    assert cleared.shadow_version_id is None
    assert AliasEvent.objects.filter(action="clear_shadow").count() == 1


def test_the_rest_api_sets_and_shows_the_shadow(tenant_a, alias, support_versions):
    client = key_client(tenant_a)
    answer = client.post(
        "/api/aliases/support/shadow",
        {"version_id": support_versions["v2"], "percent": 25, "reason": "try it"},
        content_type="application/json",
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["shadow_version"]["label"] == "support@v2"
    assert answer.json()["shadow_percent"] == 25
    assert answer.json()["shadow_keep_examples"] is False  # nothing kept unless asked
    refused = client.post(
        "/api/aliases/support/shadow",
        {"version_id": support_versions["v2"], "percent": 101},
        content_type="application/json",
    )
    assert refused.status_code == 422 and "between 1 and 100" in refused.json()["detail"]


def test_the_share_of_requests_copied_follows_the_percent(alias, support_versions, tenant_a):
    aliases.set_shadow(**alias, version_id=support_versions["v2"], percent=25)
    snapshot = load_alias_snapshot(tenant_id=tenant_a.id, name="support")
    copied = [snapshot.mirror(f"key-{i}") is not None for i in range(4000)]
    assert 0.22 < sum(copied) / len(copied) < 0.28
    assert snapshot.mirror("key-1") == snapshot.mirror("key-1")  # the same key, the same way


def answer(*texts: str, finish: str = "stop", json_valid=None) -> Answer:
    return Answer(texts=list(texts), finish_reason=finish, json_valid=json_valid, ttft_ms=10.0)


def test_answers_are_compared_word_by_word_with_length_finish_and_json():
    same = compare(answer("Thank you."), answer("Thank you."))
    assert same == {
        "exact": True,
        "similarity": 1.0,
        "length_ratio": 1.0,
        "finish_agree": True,
        "json_agree": None,
    }
    other = compare(
        answer("Thank you for contacting support.", json_valid=True),
        answer("Hello from the helpdesk team!", finish="length", json_valid=False),
    )
    assert other["exact"] is False and other["similarity"] == 0.0
    assert other["finish_agree"] is False and other["json_agree"] is False
    live, shadow = "Thank you for contacting support.", "Hello from the helpdesk team!"
    assert other["length_ratio"] == pytest.approx(len(shadow) / len(live))


def mirrored(tenant_id: int) -> Mirrored:
    from apps.serving.node.lookups import Caller
    from tests.helpers import resolved_version

    shadow = resolved_version(tenant_id=tenant_id)
    caller = Caller(
        key_prefix="p",
        tenant_id=tenant_id,
        tenant_slug="tenant-a",
        priority=1,
        requests_per_minute=60,
    )
    return Mirrored(
        caller=caller,
        shadow=shadow,
        alias="support",
        live_version="v1",
        chat=False,
        body={"prompt": "x"},
        live=answer("Thank you."),
    )


class Recorder:
    def __init__(self) -> None:
        self.records: list[ShadowRecord] = []

    def record_shadow(self, record: ShadowRecord) -> None:
        self.records.append(record)


def test_copies_run_on_spare_capacity_only_and_failures_stay_with_the_shadow():
    async def scenario() -> list[str]:
        admission = Admission(max_concurrent=5, max_queue=4)  # budget: 1 copy at a time
        release = asyncio.Event()

        async def slow_answer(job: Mirrored) -> Answer:
            await release.wait()
            if job.body.get("fail"):
                raise RuntimeError("the shadow could not load")
            return answer("Hello.")

        recorder = Recorder()
        shadows = Shadows(
            admission=admission,
            answer=slow_answer,
            stats=recorder,  # type: ignore[arg-type]
            metrics=NodeMetrics(),
            background=BackgroundTasks(),
            budget_share=0.2,
        )
        job = mirrored(1)
        shadows.offer(job)  # runs
        shadows.offer(job)  # over the budget of one
        admission.waiting = 1
        shadows.offer(job)  # a caller waits
        admission.waiting = 0
        release.set()
        await asyncio.sleep(0.05)
        shadows.offer(Mirrored(**{**job.__dict__, "body": {"fail": True}}))
        await asyncio.sleep(0.05)
        return [r.outcome for r in recorder.records]

    assert asyncio.run(scenario()) == ["dropped_budget", "dropped_busy", "compared", "error"]


def test_copies_are_counted_per_minute_and_shown_since_the_shadow_was_set(
    alias, support_versions, tenant_a
):
    row = aliases.set_shadow(**alias, version_id=support_versions["v2"], percent=50)
    now = datetime.now(UTC)
    base = {"tenant_id": tenant_a.id, "alias": "support", "version": "v1", "shadow_version": "v2"}
    write_shadow_records(
        [
            ShadowRecord(
                **base,
                outcome="compared",
                exact=True,
                similarity=1.0,
                length_ratio=1.0,
                finish_agree=True,
                ttft_ms=20.0,
                live_ttft_ms=10.0,
                at=now,
            ),
            ShadowRecord(
                **base,
                outcome="compared",
                similarity=0.5,
                length_ratio=2.0,
                ttft_ms=40.0,
                live_ttft_ms=10.0,
                at=now,
            ),
            ShadowRecord(**base, outcome="error", at=now),
            ShadowRecord(**base, outcome="dropped_busy", at=now),
        ]
    )
    stored = ShadowMinute.objects.get()
    assert (stored.mirrored, stored.compared, stored.errors, stored.dropped_busy) == (3, 2, 1, 1)
    evidence = shadow_evidence(row)
    totals = evidence["totals"]
    assert totals["agreement"] == 0.5 and totals["similarity"] == 0.75
    assert totals["error_rate"] == pytest.approx(1 / 3)
    assert (totals["ttft_ms"], totals["live_ttft_ms"]) == (30.0, 10.0)
    assert len(evidence["minutes"]) == 1


def test_a_copy_takes_a_slot_only_with_room_to_spare_for_callers():
    async def scenario() -> list[bool]:
        admission = Admission(max_concurrent=4, max_queue=4)
        taken = []

        async def try_copy() -> bool:
            try:
                async with admission.spare_slot(headroom=1):
                    return True
            except NoSpareSlot:
                return False

        taken.append(await try_copy())  # idle: yes
        with admission.queue() as ticket:
            # two callers generating (one ticket's slot taken twice stands for them)
            async with ticket.slot(), ticket.slot():
                taken.append(await try_copy())  # 2 + 1 + 1 spare = 4: yes
                async with ticket.slot():
                    taken.append(await try_copy())  # 3 + 1 + 1 > 4: no
        admission.waiting = 1
        taken.append(await try_copy())  # a caller waits: no
        return taken

    assert asyncio.run(scenario()) == [True, True, False, False]


def test_examples_are_kept_only_when_asked_the_newest_few_and_shown_with_their_changes(
    alias, support_versions, tenant_a
):
    from datetime import timedelta

    from apps.telemetry.models import ShadowExample
    from apps.telemetry.writers import SHADOW_EXAMPLES

    row = aliases.set_shadow(
        **alias, version_id=support_versions["v2"], percent=50, keep_examples=True
    )
    start = datetime.now(UTC)
    base = {"tenant_id": tenant_a.id, "alias": "support", "version": "v1", "shadow_version": "v2"}
    write_shadow_records(
        [
            ShadowRecord(
                **base,
                outcome="compared",
                at=start + timedelta(seconds=i),
                example=(f"question {i}", "Thank you for contacting support.", "Hello there!"),
            )
            for i in range(SHADOW_EXAMPLES + 5)
        ]
        + [ShadowRecord(**base, outcome="compared", at=start)]  # one without: nothing kept
    )
    kept = list(ShadowExample.objects.order_by("-at").values_list("request", flat=True))
    assert len(kept) == SHADOW_EXAMPLES and kept[0] == f"question {SHADOW_EXAMPLES + 4}"
    [newest, *_] = shadow_evidence(row)["examples"]
    assert ("del", "Thank you for contacting support.") in newest["live"]
    assert ("ins", "Hello there!") in newest["shadow"]
