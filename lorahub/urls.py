from __future__ import annotations

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from lorahub.api import api

urlpatterns = [
    path("favicon.ico", RedirectView.as_view(url=static("img/favicon.svg"), permanent=True)),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/", api.urls),
    path("", include("apps.serving.urls")),
    path("", include("apps.registry.urls")),
    path("", include("apps.tenants.urls")),
    path("", include("apps.evaluations.urls")),
    path("", include("apps.releases.urls")),
]
