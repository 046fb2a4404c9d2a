from __future__ import annotations

from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "apps.tenants"
    label = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # the sign-in audit's signal receiver, and the check of the groups → roles mapping
        from apps.tenants import roles, signin  # noqa: F401
        from lorahub import checks  # noqa: F401  (check --deploy: the trust boundary)
