"""Celery tasks of evaluations: thin wrappers that load by id and call one service."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from apps.evaluations import services


@shared_task(
    name=services.RUN_TASK,
    acks_late=True,
    soft_time_limit=settings.LORAHUB_EVALUATION_TIME_LIMIT_S,
    time_limit=settings.LORAHUB_EVALUATION_TIME_LIMIT_S + 30,
)
def run_evaluation(run_id: int) -> str:
    """Answer a run's cases with both versions on a serving node and judge them."""
    return services.execute_run(run_id).state
