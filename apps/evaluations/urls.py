from __future__ import annotations

from django.urls import path

from apps.evaluations import views

app_name = "evaluations"
urlpatterns = [
    path("evaluations/<int:run_id>/", views.run_detail, name="run"),
    path("versions/<int:version_id>/evaluate/", views.start, name="start"),
]
