"""Celery tasks of the registry: thin wrappers that load by id and call one service."""

from __future__ import annotations

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from apps.registry import services
from apps.registry.storage import StorageError


@shared_task(
    name=services.VALIDATE_TASK,
    autoretry_for=(StorageError,),
    retry_backoff=2,
    retry_kwargs={"max_retries": 4},
    acks_late=True,
)
def validate_version(version_id: int) -> str:
    """Validate a staged upload (idempotent: a version already judged is left alone)."""
    return services.validate_version(version_id=version_id).state


@shared_task
def sweep_stale_validations() -> list[int]:
    """Re-queue validations stuck longer than ``LORAHUB_VALIDATION_STALE_S`` (Celery beat runs
    it every few minutes; every worker also runs it once when it starts)."""
    return services.requeue_stale_validations(older_than_s=settings.LORAHUB_VALIDATION_STALE_S)


@worker_ready.connect
def _sweep_on_start(sender=None, **_: object) -> None:
    """A worker that starts (after a crash, a deploy) picks up what its predecessor left."""
    sweep_stale_validations.delay()
