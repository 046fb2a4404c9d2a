"""Smoke tests: each real part the suite claims to use is really there and really used."""

from __future__ import annotations

import pytest
from django.db import connection

from apps.registry.storage import S3Store, get_store
from apps.tenants.models import Tenant


@pytest.mark.django_db
def test_the_database_is_postgresql():
    assert connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        cursor.execute("select version()")
        assert cursor.fetchone()[0].startswith("PostgreSQL")


@pytest.mark.django_db(transaction=True)
def test_a_celery_task_runs_in_a_real_worker_and_its_result_comes_back_through_redis(
    celery_worker, tenant_a
):
    import os

    from lorahub.celery import ping

    result = ping.delay()
    answer = result.get(timeout=30)
    assert answer["pid"] != os.getpid()  # ran in the worker process, not here
    assert answer["db_vendor"] == "postgresql"
    assert answer["tenants"] == Tenant.objects.count() == 1  # the worker sees committed rows
    assert result.backend.__class__.__name__ == "RedisBackend"


def test_an_object_written_through_boto3_to_the_s3_server_reads_back_byte_identical(s3_settings):
    store = get_store()
    assert isinstance(store, S3Store)
    payload = bytes(range(256)) * 4096 + b"\x00tail"
    store.put("smoke/blob.bin", payload)
    assert store.get("smoke/blob.bin") == payload
    assert store.size("smoke/blob.bin") == len(payload)
