from __future__ import annotations

from django.urls import path

from apps.fleet import views

app_name = "fleet"
urlpatterns = [
    path("t/<slug:slug>/quota/", views.quota, name="quota"),
    path("operator/nodes/", views.nodes_page, name="nodes"),
    path("operator/fleet/<str:verb>", views.alias_action, name="alias_action"),
    path(
        "operator/quarantines/<int:quarantine_id>/lift",
        views.quarantine_lift,
        name="quarantine_lift",
    ),
    path("operator/nodes/<str:node>/<str:verb>", views.node_action, name="node_action"),
]
