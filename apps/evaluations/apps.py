from __future__ import annotations

from django.apps import AppConfig


class EvaluationsConfig(AppConfig):
    name = "apps.evaluations"
    label = "evaluations"
    default_auto_field = "django.db.models.BigAutoField"
