"""The control plane's REST API: one NinjaAPI that mounts each app's router."""

from __future__ import annotations

from ninja import NinjaAPI

from apps.tenants.api import router as tenants_router

api = NinjaAPI(title="lorahub control plane", version="1", urls_namespace="api")
api.add_router("/", tenants_router)
