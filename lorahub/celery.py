"""The Celery app, configured from Django settings (``CELERY_`` namespace)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lorahub.settings")

app = Celery("lorahub")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
