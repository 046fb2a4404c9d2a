"""Shadow traffic on a real node (vLLM on the demo model): a share of an alias's requests is
copied to its shadow version off the response path; callers only ever get the live answer."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from apps.registry.contracts import canary_bucket
from apps.registry.models import AdapterVersion, Alias
from apps.telemetry.models import ShadowExample, ShadowMinute
from tests.harness.waiting import wait_until
from tests.helpers import node_metric
from tests.serving.node.calls import PROMPT, V1, V2, complete, internal

pytestmark = pytest.mark.engine


def set_shadow(world, version: str | None, percent: int = 0, keep_examples: bool = False):
    answer = world["control"].post(
        "/api/aliases/support/shadow",
        {
            "version_id": world["versions"][version] if version else None,
            "percent": percent,
            "keep_examples": keep_examples,
        },
        content_type="application/json",
    )
    assert answer.status_code == 200, answer.content
    wait_until(  # the node follows within a second
        lambda: (
            internal(world, "alias?tenant=tenant-a&alias=support").json()["shadow_percent"]
            == (percent if version else 0)
        ),
        "the node to follow the shadow",
        5,
        0.05,
    )


def shadow_totals(wanted: int, seconds: float = 30) -> dict[str, int]:
    """The shadow rows' counts once ``wanted`` copies are accounted for (written every 2 s,
    after each copy has run)."""

    def totals() -> dict[str, int]:
        rows = list(ShadowMinute.objects.all())
        found = {
            name: sum(getattr(r, name) for r in rows)
            for name in (
                "mirrored",
                "compared",
                "errors",
                "exact",
                "dropped_busy",
                "dropped_budget",
            )
        }
        found["similarity_sum"] = sum(r.similarity_sum for r in rows)
        return found

    return wait_until(
        totals,
        f"{wanted} copies to be recorded",
        seconds,
        0.25,
        until=lambda t: t["mirrored"] + t["dropped_busy"] + t["dropped_budget"] >= wanted,
    )


def test_half_the_requests_are_mirrored_and_callers_only_get_the_stable_answer(world):
    # support-v2's weights answer "Hello from the helpdesk team!"
    set_shadow(world, "v2", 50, keep_examples=True)
    alias = Alias.objects.get(name="support")
    keys = [f"user-{i}" for i in range(16)]
    mirrored = [k for k in keys if canary_bucket(alias.pk, -world["versions"]["v2"], k) < 50 * 100]
    assert 4 <= len(mirrored) <= 12  # about half
    before = node_metric(world["url"], "shadow_requests_total", outcome="compared")
    for key in keys:
        text, headers = complete(world["a"], user=key)
        assert text.startswith(V1) and headers["x-lorahub-adapter"] == "support@v1"
        time.sleep(0.3)  # one at a time: the copies run on spare capacity
    totals = shadow_totals(len(mirrored))
    assert totals["mirrored"] + totals["dropped_busy"] + totals["dropped_budget"] == len(mirrored)
    assert totals["compared"] >= 1 and totals["errors"] == 0
    assert totals["exact"] == 0  # v2 answers otherwise
    assert totals["similarity_sum"] / totals["compared"] < 0.3
    assert (
        node_metric(world["url"], "shadow_requests_total", outcome="compared")
        == before + totals["compared"]
    )
    # one row per minute (the requests may straddle one) and (live, shadow) version
    rows = ShadowMinute.objects.values_list("version", "shadow_version").distinct()
    assert list(rows) == [("v1", "v2")]
    examples = list(ShadowExample.objects.all())  # kept: the alias asked for them
    assert len(examples) == totals["compared"]
    assert all(e.live_output.strip().startswith(V1) for e in examples)
    assert all(e.shadow_output.strip().startswith(V2) for e in examples)
    assert all(e.request == PROMPT for e in examples)  # the caller's prompt, as sent
    set_shadow(world, None)


def test_a_shadow_that_cannot_load_fails_alone_and_copies_are_dropped_when_the_node_is_busy(
    world,
):
    from apps.registry.storage import get_store

    v3 = AdapterVersion.objects.get(pk=world["versions"]["v3"])
    store = get_store()
    key = f"{v3.storage_prefix}/adapter_model.safetensors"
    data = bytearray(store.get(key))
    data[-1] ^= 0x01
    store.client.put_object(Bucket=store.bucket, Key=key, Body=bytes(data))  # bad bytes
    set_shadow(world, "v3", 100)
    for i in range(4):
        text, _ = complete(world["a"], user=f"q-{i}")
        assert text.startswith(V1)  # the caller never sees the shadow's failure
        time.sleep(0.5)
    totals = shadow_totals(4)
    assert totals["errors"] >= 1 and totals["compared"] == 0

    # a burst: callers queue for generation slots, so copies are dropped, not run
    ShadowMinute.objects.all().delete()
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda i: complete(world["a"], user=f"b-{i}")[0], range(12)))
    assert all(a.startswith(V1) for a in answers)
    totals = shadow_totals(12)
    assert totals["dropped_busy"] + totals["dropped_budget"] >= 1
