from __future__ import annotations

from django.urls import path

from apps.serving import replay_views, views

app_name = "serving"
urlpatterns = [
    path("", views.home, name="home"),
    path("t/<slug:slug>/quota/", views.quota, name="quota"),
    path("t/<slug:slug>/dashboard/", views.tenant_dashboard, name="dashboard"),
    path("t/<slug:slug>/dashboard/data", views.tenant_dashboard_data, name="dashboard_data"),
    path("operator/dashboard/", views.operator_dashboard, name="operator_dashboard"),
    path("operator/dashboard/data", views.operator_dashboard_data, name="operator_dashboard_data"),
    path("operator/cache/", views.cache_config, name="cache_config"),
    path("operator/nodes/", views.nodes_page, name="nodes"),
    path("operator/replay/", replay_views.replay_page, name="replay"),
    path("operator/replay/<int:run_id>/", replay_views.replay_run, name="replay_run"),
    path("operator/replay/<int:run_id>/data", replay_views.replay_data, name="replay_data"),
    path("operator/replay/<int:run_id>/apply", replay_views.replay_apply, name="replay_apply"),
    path("operator/fleet/<str:verb>", views.alias_action, name="alias_action"),
    path(
        "operator/quarantines/<int:quarantine_id>/lift",
        views.quarantine_lift,
        name="quarantine_lift",
    ),
    path("operator/nodes/<str:node>/<str:verb>", views.node_action, name="node_action"),
]
