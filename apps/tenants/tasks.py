"""The worker's part of notifications: deliver each webhook call, retried with backoff; sweep up
deliveries whose message was lost."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from apps.tenants import webhooks
from apps.tenants.models import WebhookDelivery


@shared_task(
    bind=True,
    autoretry_for=(webhooks.DeliveryFailed,),
    retry_backoff=1,  # 1, 2, 4, 8 ... s (with jitter), at most retry_backoff_max apart
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=settings.LORAHUB_WEBHOOK_ATTEMPTS - 1,
    acks_late=True,
    # its own queue (CELERY_TASK_ROUTES; production runs a worker for it alone, the
    # entrypoint's `webhooks`), and a hard bound on one attempt beyond its own deadline
    queue="webhooks",
    soft_time_limit=settings.LORAHUB_WEBHOOK_TIMEOUT_S * 2 + 10,
    time_limit=settings.LORAHUB_WEBHOOK_TIMEOUT_S * 2 + 20,
)
def deliver_webhook(self, delivery_id: int) -> str:
    return webhooks.attempt(delivery_id, final=self.request.retries >= self.max_retries)


@shared_task
def sweep_webhooks() -> int:
    """Queue again the pending deliveries nobody is working on: never tried a minute after
    they were made (the broker was away), or not retried for longer than the longest backoff
    (the worker died holding the retry). Returns how many."""
    now = timezone.now()
    stale = WebhookDelivery.objects.filter(state=WebhookDelivery.State.PENDING).filter(
        last_attempt_at__isnull=True, created_at__lt=now - timedelta(minutes=1)
    ) | WebhookDelivery.objects.filter(
        state=WebhookDelivery.State.PENDING, last_attempt_at__lt=now - timedelta(minutes=15)
    )
    ids = list(stale.values_list("pk", flat=True)[:500])
    webhooks.queue(ids)
    return len(ids)
