from __future__ import annotations

from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "apps.registry"
    label = "registry"
    default_auto_field = "django.db.models.BigAutoField"
