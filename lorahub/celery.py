"""The Celery app, configured from Django settings (``CELERY_`` namespace)."""

from __future__ import annotations

import os

from celery import Celery, signals

from lorahub.tracing import instrument_worker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lorahub.settings")

app = Celery("lorahub")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# traces (lorahub/tracing.py): off unless OTEL_EXPORTER_OTLP_ENDPOINT is set
@signals.worker_init.connect
def _trace_worker(**_: object) -> None:
    instrument_worker("lorahub-worker")


@signals.beat_init.connect
def _trace_beat(**_: object) -> None:
    instrument_worker("lorahub-beat")


@app.task(name="lorahub.ping")
def ping() -> dict[str, object]:
    """Liveness probe for workers: proves a worker runs, reaches the database and answers."""
    from django.db import connection

    from apps.tenants.models import Tenant

    return {"pid": os.getpid(), "db_vendor": connection.vendor, "tenants": Tenant.objects.count()}
