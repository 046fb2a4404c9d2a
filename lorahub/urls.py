from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from lorahub.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/", api.urls),
    path("", include("apps.serving.urls")),
    path("", include("apps.registry.urls")),
    path("", include("apps.tenants.urls")),
]
