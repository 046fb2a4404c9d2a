"""Redis (the Celery broker) stops, then returns: the control plane keeps answering and loses
nothing. An upload is stored and answered 202 (it was a 500, and its staged files were
deleted under a committed `validating` row); its validation runs once the queue is back; a
replay started meanwhile says it could not be queued instead of waiting for ever.

A real outage of the suite's Redis: every process using it (the session's worker, the nodes'
change channel) loses it for a few seconds and reconnects."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest
from django.utils import timezone

from apps.registry.models import AdapterVersion
from apps.registry.storage import get_store
from apps.serving.models import ReplayRun
from apps.tenants.models import AuditEvent
from tests.harness.processes import start_worker, stop
from tests.harness.waiting import wait_until
from tests.helpers import files_of, key_client, upload, user_client, wait_validated
from tests.serving.replay.specs import SMALL

# it stops the machine's Redis: `make test` runs it alone, after the other lanes
pytestmark = pytest.mark.outage

# how `make test` (and the machine) start Redis
REDIS = [
    "redis-server",
    "--daemonize",
    "yes",
    "--bind",
    "127.0.0.1",
    "-::1",
    "--port",
    "6379",
    "--save",
    "",
    "--appendonly",
    "no",
    "--dir",
    "/var/lib/redis",
    "--logfile",
    "/var/log/redis/ci.log",
]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def redis(action: str) -> None:
    if action == "stop":
        subprocess.run(["redis-cli", "-p", "6379", "shutdown", "nosave"], check=False)
    else:
        subprocess.run(["mkdir", "-p", "/var/lib/redis", "/var/log/redis"], check=True)
        subprocess.run(REDIS, check=True)
    wait_until(lambda: listening(6379) == (action == "start"), f"Redis to {action}")


def test_with_the_task_queue_down_uploads_are_kept_and_validated_when_it_returns(
    registry, celery_worker, s3_server, tenant_a, operator, adapter_files
):
    from lorahub.celery import app

    tenant, otto = key_client(tenant_a), user_client("otto", "otto-pass-123")
    redis("stop")
    try:
        response = upload(tenant, "support", files_of(adapter_files), version="queued.1")
        assert response.status_code == 202, response.content
        version = AdapterVersion.objects.get(pk=response.json()["id"])
        assert version.state == "validating"
        staged = [info.key for info in get_store().list(version.staging_prefix)]
        assert len(staged) == 3, staged  # the two files and their index: nothing lost

        started = otto.post("/operator/replay/", SMALL, follow=True)
        assert started.status_code == 200
        assert "could not be queued" in started.content.decode()
        run = ReplayRun.objects.latest("pk")
        assert run.state == ReplayRun.State.FAILED
        assert "task queue" in run.error
    finally:
        redis("start")

    wait_until(  # the session's worker reconnects by itself
        lambda: app.control.ping(destination=[celery_worker], timeout=1.0),
        "the Celery worker to reconnect to Redis",
        60,
        every=0,
    )
    # its validation runs when the queue is back: a worker that starts sweeps up validations
    # older than LORAHUB_VALIDATION_STALE_S (Celery beat does too, every 5 minutes)
    # (the session's worker, whose threshold is 10 minutes, stands aside meanwhile)
    time.sleep(max(0.0, 10.5 - (timezone.now() - version.created_at).total_seconds()))
    app.control.cancel_consumer("celery", destination=[celery_worker], reply=True)
    successor, _ = start_worker(s3_server, LORAHUB_VALIDATION_STALE_S="10")
    try:
        assert wait_validated(tenant, version.pk)["state"] == "pending_review"
    finally:
        stop(successor)
        app.control.add_consumer("celery", destination=[celery_worker], reply=True)
    verdicts = AuditEvent.objects.filter(
        object_id=str(version.pk), action__in=("version.validated", "version.validation_failed")
    )
    assert verdicts.count() == 1
    wait_until(  # the staging area is cleared after the verdict commits
        lambda: not list(get_store().list(version.staging_prefix)),
        "the staged upload to be cleared",
        10,
    )


@pytest.fixture(autouse=True)
def _redis_back():
    """Whatever happens in the test, Redis is running afterwards."""
    yield
    if not listening(6379):
        redis("start")
