"""A validation whose message was lost (or whose worker died mid-task) is queued again by the
sweep, on the real Celery worker, and the version still gets exactly one verdict."""

from __future__ import annotations

import time
from datetime import timedelta
from unittest import mock

import pytest
from django.db import DatabaseError, transaction
from django.utils import timezone

from apps.registry import services, tasks
from apps.registry.models import AdapterVersion
from apps.tenants.models import AuditEvent
from tests.harness.processes import start_worker, stop
from tests.harness.waiting import wait_until
from tests.helpers import files_of, key_client, upload, wait_validated


def test_a_lost_validation_is_swept_up_and_judged_once(registry, tenant_a, adapter_files):
    tenant = key_client(tenant_a)
    # the fault: the broker loses the validation message
    with mock.patch.object(services, "send_validation"):
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
        object_id=str(version_id), action__in=("version.validated", "version.validation_failed")
    )
    assert verdicts.count() == 1


def validating_now(version_id: int) -> bool:
    """True while a worker holds the version's row lock: ``validate_version`` holds it from
    its first read to its verdict, so a held lock means a validation is under way."""
    try:
        with transaction.atomic():
            rows = AdapterVersion.objects.select_for_update(nowait=True).filter(pk=version_id)
            list(rows.values_list("pk", flat=True))
        return False
    except DatabaseError:
        return True


def test_a_worker_killed_mid_validation_still_gives_exactly_one_verdict(
    registry, celery_worker, s3_server, tenant_a, adapter_files
):
    """kill -9 of the worker while it validates: its transaction dies with it (the version
    stays `validating`, nothing published), the next worker's start-up sweep queues it again,
    and the version gets one verdict with exactly its own files in the registry."""
    from apps.registry.storage import get_store
    from lorahub.celery import app

    tenant = key_client(tenant_a)
    stale = {"LORAHUB_VALIDATION_STALE_S": "10"}  # the lowest the setting allows
    app.control.cancel_consumer("celery", destination=[celery_worker], reply=True)
    workers = []
    try:
        for attempt in range(5):  # until the kill lands inside a validation
            victim, _ = start_worker(s3_server, **stale)
            workers.append(victim)
            response = upload(tenant, "support", files_of(adapter_files), version=f"k.{attempt}")
            assert response.status_code == 202, response.content
            version_id = response.json()["id"]
            wait_until(
                lambda vid=version_id: validating_now(vid),
                "the worker to start the validation",
                every=0,
            )
            victim.kill()  # SIGKILL: no clean-up, no ack
            victim.wait()
            if AdapterVersion.objects.get(pk=version_id).state == "validating":
                break
        else:
            pytest.fail("every kill came after the verdict; the validation is too fast to catch")
        print(f"killed mid-validation on attempt {attempt + 1}")

        uploaded = AdapterVersion.objects.get(pk=version_id).created_at
        time.sleep(max(0.0, 10.5 - (timezone.now() - uploaded).total_seconds()))
        successor, _ = start_worker(s3_server, **stale)  # its start-up sweep finds it stale
        workers.append(successor)
        judged = wait_validated(tenant, version_id)
        assert judged["state"] == "pending_review", judged
        tasks.validate_version.delay(version_id).get(timeout=60)  # the lost message, redelivered
        verdicts = AuditEvent.objects.filter(
            object_id=str(version_id),
            action__in=("version.validated", "version.validation_failed"),
        )
        assert verdicts.count() == 1
        version = AdapterVersion.objects.get(pk=version_id)
        stored = sorted(
            info.key.rsplit("/", 1)[1] for info in get_store().list(version.storage_prefix)
        )
        assert stored == sorted(version.files), stored  # its files, once; nothing half-written
    finally:
        for worker in workers:
            stop(worker)
        app.control.add_consumer("celery", destination=[celery_worker], reply=True)
