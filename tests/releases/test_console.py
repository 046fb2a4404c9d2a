"""The release pages (server-rendered, on the real database): start from the alias page with
errors beside their fields, the release page's timeline, gates, split and controls, the
lists; other tenants get 404."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from apps.registry import aliases
from apps.releases.models import Release
from apps.tenants.auth import principal_for_user
from tests.helpers import user_client


def make_alias(tenant_a, support_versions):
    alice = principal_for_user(get_user_model().objects.get(username="alice"))
    return aliases.set_alias(
        principal=alice, tenant=tenant_a, name="support", version_id=support_versions["v1"]
    )


FORM = {
    "canary_steps": "10, 100",
    "dwell_s": "60",
    "min_requests": "5",
    "interval_s": "1",
    "failure_threshold": "2",
    "shadow_percent": "0",
}


def test_a_bad_field_is_shown_beside_it_and_nothing_starts(tenant_a, support_versions):
    make_alias(tenant_a, support_versions)
    alice = user_client("alice", "alice-pass-123")
    page = alice.post(
        "/t/tenant-a/aliases/support/release/",
        {**FORM, "version_id": support_versions["v2"], "canary_steps": "50, 25", "interval_s": "x"},
        follow=True,
    ).content.decode()
    assert 'id="error-interval_s">&#x27;x&#x27; is not a whole number' in page
    assert not Release.objects.exists()
    page = alice.post(
        "/t/tenant-a/aliases/support/release/",
        {**FORM, "version_id": support_versions["v2"], "canary_steps": "50, 25"},
        follow=True,
    ).content.decode()
    assert 'id="error-canary_steps">each step&#x27;s percent must be above the one before' in page
    assert 'value="50, 25"' in page  # what was typed stays in the form


def test_start_follow_and_abort_from_the_console(tenant_a, tenant_b, operator, support_versions):
    make_alias(tenant_a, support_versions)
    alice = user_client("alice", "alice-pass-123")
    started = alice.post(
        "/t/tenant-a/aliases/support/release/",
        {**FORM, "version_id": support_versions["v2"]},
    )
    release = Release.objects.get()
    assert started.status_code == 302 and started["Location"] == f"/releases/{release.pk}/"
    page = alice.get(f"/releases/{release.pk}/").content.decode()
    assert 'id="split-candidate">10 %' in page and 'id="split-baseline">90 %' in page
    assert 'id="abort-release"' in page and "release-figures" in page
    alias_page = alice.get("/t/tenant-a/aliases/support/").content.decode()
    assert f'Release <a href="/releases/{release.pk}/">#{release.pk}</a> is moving' in alias_page
    assert "canary" in alice.get("/t/tenant-a/releases/").content.decode()

    otto = user_client("otto", "otto-pass-123")
    listing = otto.get("/operator/releases/?active=1").content.decode()
    assert f'href="/releases/{release.pk}/">#{release.pk}</a></td><td>tenant-a</td>' in listing

    bob = user_client("bob", "bob-pass-123")
    assert bob.get(f"/releases/{release.pk}/").status_code == 404
    assert bob.post(f"/releases/{release.pk}/abort/").status_code == 404

    done = alice.post(f"/releases/{release.pk}/abort/", follow=True).content.decode()
    release.refresh_from_db()
    assert release.state == "aborted"
    assert "Aborted: support serves support@v1 alone" in done
    assert 'id="abort-release"' not in done  # nothing left to control
