from __future__ import annotations

from django.apps import AppConfig


class DemoConfig(AppConfig):
    """What ``make run`` needs besides the product: the demo model and adapters built
    locally, the demo tenants and users, and the supervisor that starts every process."""

    name = "apps.demo"
    label = "demo"
