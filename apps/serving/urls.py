from __future__ import annotations

from django.urls import path

from apps.serving import replay_views, views

app_name = "serving"
urlpatterns = [
    path("operator/cache/", views.cache_config, name="cache_config"),
    path("operator/replay/", replay_views.replay_page, name="replay"),
    path("operator/replay/<int:run_id>/", replay_views.replay_run, name="replay_run"),
    path("operator/replay/<int:run_id>/data", replay_views.replay_data, name="replay_data"),
    path("operator/replay/<int:run_id>/apply", replay_views.replay_apply, name="replay_apply"),
]
