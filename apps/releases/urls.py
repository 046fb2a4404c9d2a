from __future__ import annotations

from django.urls import path

from apps.releases import views

app_name = "releases"
urlpatterns = [
    path("t/<slug:slug>/aliases/<slug:name>/release/", views.start, name="start"),
    path("t/<slug:slug>/releases/", views.tenant_releases, name="list"),
    path("operator/releases/", views.operator_releases, name="operator_list"),
    path("releases/<int:release_id>/", views.release_detail, name="release"),
    path("releases/<int:release_id>/<str:verb>/", views.control, name="control"),
]
