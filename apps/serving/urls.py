from __future__ import annotations

from django.urls import path

from apps.serving.console import pages, replay_pages

app_name = "serving"
urlpatterns = [
    path("", pages.home, name="home"),
    path("t/<slug:slug>/quota/", pages.quota, name="quota"),
    path("t/<slug:slug>/dashboard/", pages.tenant_dashboard, name="dashboard"),
    path("t/<slug:slug>/dashboard/data", pages.tenant_dashboard_data, name="dashboard_data"),
    path("operator/dashboard/", pages.operator_dashboard, name="operator_dashboard"),
    path("operator/dashboard/data", pages.operator_dashboard_data, name="operator_dashboard_data"),
    path("operator/cache/", pages.cache_config, name="cache_config"),
    path("operator/nodes/", pages.nodes_page, name="nodes"),
    path("operator/replay/", replay_pages.replay_page, name="replay"),
    path("operator/replay/<int:run_id>/", replay_pages.replay_run, name="replay_run"),
    path("operator/replay/<int:run_id>/data", replay_pages.replay_data, name="replay_data"),
    path("operator/replay/<int:run_id>/apply", replay_pages.replay_apply, name="replay_apply"),
    path("operator/fleet/<str:verb>", pages.alias_action, name="alias_action"),
    path(
        "operator/quarantines/<int:quarantine_id>/lift",
        pages.quarantine_lift,
        name="quarantine_lift",
    ),
    path("operator/nodes/<str:node>/<str:verb>", pages.node_action, name="node_action"),
]
