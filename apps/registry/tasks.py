"""Celery tasks of the registry: thin wrappers that load by id and call one service."""

from __future__ import annotations

from celery import shared_task

from apps.registry import services
from apps.registry.storage import StorageError


@shared_task(
    autoretry_for=(StorageError,),
    retry_backoff=2,
    retry_kwargs={"max_retries": 4},
    acks_late=True,
)
def validate_version(version_id: int) -> str:
    """Validate a staged upload (idempotent: a version already judged is left alone)."""
    return services.validate_version(version_id=version_id).state
