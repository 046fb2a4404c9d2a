"""A validation whose message was lost (or whose worker died mid-task) is queued again by the
sweep, on the real Celery worker, and the version still gets exactly one verdict."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

from django.utils import timezone

from apps.registry import tasks
from apps.registry.models import AdapterVersion
from apps.tenants.models import AuditEvent
from tests.helpers import files_of, key_client, upload, wait_validated


def test_a_lost_validation_is_swept_up_and_judged_once(registry, tenant_a, adapter_files):
    tenant = key_client(tenant_a)
    # the fault: the broker loses the validation message
    with mock.patch.object(tasks.validate_version, "delay"):
        response = upload(tenant, "support", files_of(adapter_files), version="lost.1")
    assert response.status_code == 202, response.content
    version_id = response.json()["id"]
    fresh = tasks.sweep_stale_validations.delay().get(timeout=30)
    assert version_id not in fresh  # a young upload is left to its own task
    assert AdapterVersion.objects.get(pk=version_id).state == "validating"

    AdapterVersion.objects.filter(pk=version_id).update(
        created_at=timezone.now() - timedelta(hours=1)
    )
    swept = tasks.sweep_stale_validations.delay().get(timeout=30)
    assert swept == [version_id]
    assert wait_validated(tenant, version_id)["state"] == "pending_review"

    # sweeping again, and a duplicate task, change nothing: one verdict
    tasks.validate_version.delay(version_id).get(timeout=60)
    assert tasks.sweep_stale_validations.delay().get(timeout=30) == []
    verdicts = AuditEvent.objects.filter(
        object_id=str(version_id), action__in=("version.validated", "version.rejected")
    )
    assert verdicts.count() == 1
