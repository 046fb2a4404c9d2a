from __future__ import annotations

from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "apps.serving"
    label = "serving"
    default_auto_field = "django.db.models.BigAutoField"
