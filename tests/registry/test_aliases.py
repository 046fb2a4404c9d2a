"""Aliases: moves with history, canaries split deterministically, promote, one-call rollback,
only approved targets, and racing moves that never half-apply."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from apps.registry import aliases, snapshots
from apps.registry.models import Alias, AliasEvent
from apps.tenants import services as tenant_services
from apps.tenants.auth import principal_for_key, principal_for_user
from apps.tenants.errors import Conflict, Invalid
from tests.helpers import key_client, publish


def owner(tenant):
    from django.contrib.auth import get_user_model

    return principal_for_user(get_user_model().objects.get(username="alice"))


def test_put_moves_the_alias_and_records_who_when_from_to_why(support_versions, tenant_a):
    client = key_client(tenant_a)
    first = client.put(
        "/api/aliases/support",
        {"version_id": support_versions["v1"], "reason": "go"},
        content_type="application/json",
    ).json()
    assert first["version"]["label"] == "support@v1"
    moved = client.put(
        "/api/aliases/support",
        {"version_id": support_versions["v2"], "reason": "better tone"},
        content_type="application/json",
    ).json()
    assert moved["version"]["label"] == "support@v2"
    latest = moved["history"][0]
    assert latest["action"] == "set"
    assert latest["from_version"] == "support@v1"
    assert latest["to_version"] == "support@v2"
    assert latest["reason"] == "better tone"
    assert latest["actor"].startswith("key ")
    assert latest["at"]


def test_canary_split_is_within_three_points_and_deterministic_per_key(support_versions, tenant_a):
    principal = owner(tenant_a)
    aliases.set_alias(
        principal=principal, tenant=tenant_a, name="support", version_id=support_versions["v1"]
    )
    for percent in (10, 50, 90):
        aliases.set_canary(
            principal=principal,
            tenant=tenant_a,
            name="support",
            version_id=support_versions["v2"],
            percent=percent,
        )
        snapshot = snapshots.load_alias_snapshot(tenant_id=tenant_a.id, name="support")
        picks = [snapshot.choose(f"user-{i}").version for i in range(10_000)]
        share = picks.count("v2") / len(picks) * 100
        assert abs(share - percent) <= 3, (percent, share)
        # the registry's resolution (a database read each time) agrees, key by key, every time
        for i in range(0, 10_000, 50):
            resolved = snapshots.resolve_alias(
                tenant=tenant_a, name="support", request_key=f"user-{i}"
            )
            assert resolved.version == picks[i]
            assert resolved.is_canary == (picks[i] == "v2")


def test_listed_api_keys_always_get_the_canary(support_versions, tenant_a):
    principal = owner(tenant_a)
    key, _ = tenant_services.issue_api_key(tenant=tenant_a, name="beta-tester", actor=None)
    aliases.set_alias(
        principal=principal, tenant=tenant_a, name="support", version_id=support_versions["v1"]
    )
    aliases.set_canary(
        principal=principal,
        tenant=tenant_a,
        name="support",
        version_id=support_versions["v2"],
        percent=0,
        api_keys=[key.prefix],
    )
    for i in range(200):
        assert (
            snapshots.resolve_alias(
                tenant=tenant_a, name="support", request_key=str(i), api_key_prefix=key.prefix
            ).version
            == "v2"
        )
        assert (
            snapshots.resolve_alias(tenant=tenant_a, name="support", request_key=str(i)).version
            == "v1"
        )
    with pytest.raises(Invalid, match="no active API key"):
        aliases.set_canary(
            principal=principal,
            tenant=tenant_a,
            name="support",
            version_id=support_versions["v2"],
            api_keys=["deadbeef"],
        )


def test_promote_makes_the_canary_stable_and_clears_it(support_versions, tenant_a):
    client = key_client(tenant_a)
    client.put(
        "/api/aliases/support",
        {"version_id": support_versions["v1"]},
        content_type="application/json",
    )
    client.post(
        "/api/aliases/support/canary",
        {"version_id": support_versions["v2"], "percent": 25},
        content_type="application/json",
    )
    body = client.post(
        "/api/aliases/support/promote", {"reason": "metrics fine"}, content_type="application/json"
    ).json()
    assert body["version"]["label"] == "support@v2"
    assert body["canary_version"] is None
    assert body["canary_percent"] == 0
    assert (
        client.post("/api/aliases/support/promote", {}, content_type="application/json").status_code
        == 409
    )


def test_rollback_restores_the_previous_version_in_one_call_and_clears_the_canary(
    support_versions, tenant_a
):
    client = key_client(tenant_a)
    for name in ("v1", "v2", "v3"):
        client.put(
            "/api/aliases/support",
            {"version_id": support_versions[name]},
            content_type="application/json",
        )
    client.post(
        "/api/aliases/support/canary",
        {"version_id": support_versions["v1"], "percent": 50},
        content_type="application/json",
    )
    body = client.post(
        "/api/aliases/support/rollback", {"reason": "v3 regressed"}, content_type="application/json"
    ).json()
    assert body["version"]["label"] == "support@v2"
    assert body["canary_version"] is None
    assert body["history"][0]["action"] == "rollback"
    # rolling back again steps further down, never back up to the version left behind
    assert (
        client.post("/api/aliases/support/rollback", {}, content_type="application/json").json()[
            "version"
        ]["label"]
        == "support@v1"
    )
    again = client.post("/api/aliases/support/rollback", {}, content_type="application/json")
    assert again.status_code == 409
    assert "no earlier version to roll back to" in again.json()["detail"]


def test_only_approved_versions_of_the_same_adapter_can_be_targets(
    published, tenant_a, reviewer, demo_dir, adapter_files
):
    principal = owner(tenant_a)
    aliases.set_alias(
        principal=principal, tenant=tenant_a, name="support", version_id=published["v1"]
    )
    other = publish(tenant_a, "legal", "l1", demo_dir / "adapters" / "legal-v1", reviewer)
    with pytest.raises(Invalid, match="belongs to another adapter"):
        aliases.set_alias(principal=principal, tenant=tenant_a, name="support", version_id=other)
    with pytest.raises(Invalid, match="already the stable version"):
        aliases.set_canary(
            principal=principal,
            tenant=tenant_a,
            name="support",
            version_id=published["v1"],
            percent=10,
        )
    with pytest.raises(Invalid, match="between 0 and 100"):
        aliases.set_canary(
            principal=principal,
            tenant=tenant_a,
            name="support",
            version_id=published["v2"],
            percent=101,
        )
    from apps.registry import services

    key, _ = tenant_services.issue_api_key(tenant=tenant_a, name="x", actor=None)
    import io

    pending = services.upload_version(
        principal=principal_for_key(key),
        tenant=tenant_a,
        adapter_id="support",
        files=[
            services.UploadFile(p.name, io.BytesIO(p.read_bytes()), p.stat().st_size)
            for p in sorted(adapter_files.iterdir())
        ],
    )
    with pytest.raises(Conflict, match="only approved, signed versions"):
        aliases.set_alias(
            principal=principal, tenant=tenant_a, name="support", version_id=pending.pk
        )


def test_racing_moves_are_serialised_and_never_half_applied(published, tenant_a):
    principal = owner(tenant_a)
    aliases.set_alias(
        principal=principal, tenant=tenant_a, name="support", version_id=published["v1"]
    )
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def move(i: int) -> None:
        try:
            barrier.wait()
            if i % 2:
                aliases.set_alias(
                    principal=principal,
                    tenant=tenant_a,
                    name="support",
                    version_id=published["v2" if i % 4 == 1 else "v3"],
                )
            else:
                aliases.set_canary(
                    principal=principal,
                    tenant=tenant_a,
                    name="support",
                    version_id=published["v2"],
                    percent=10 * i,
                )
        except (Invalid, Conflict):
            pass  # e.g. canary equal to the stable version by then: refused whole
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=move, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    alias = Alias.objects.get(tenant=tenant_a, name="support")
    events = list(AliasEvent.objects.filter(alias=alias).order_by("at", "id"))
    stable = None
    for event in events:  # the history replays to exactly the final state
        if event.action in ("set", "promote", "rollback"):
            assert event.from_version_id == stable
            stable = event.to_version_id
    assert stable == alias.version_id
    assert alias.canary_version_id != alias.version_id
    last = events[-1]
    assert (last.canary_version_id, last.canary_percent) == (
        alias.canary_version_id,
        alias.canary_percent,
    )


def test_a_race_to_create_the_same_alias_makes_one_alias(published, tenant_a):
    principal = owner(tenant_a)
    barrier = threading.Barrier(4)

    def create(version: str) -> None:
        try:
            barrier.wait()
            aliases.set_alias(
                principal=principal, tenant=tenant_a, name="fresh", version_id=published[version]
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=create, args=(v,)) for v in ("v1", "v2", "v3", "v1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Alias.objects.filter(tenant=tenant_a, name="fresh").count() == 1
