from __future__ import annotations

from django.urls import path

from apps.registry import views

app_name = "registry"
urlpatterns = [
    path("t/<slug:slug>/adapters/", views.adapter_list, name="adapters"),
    path("t/<slug:slug>/adapters/<slug:adapter_id>/", views.adapter_detail, name="adapter"),
    path("t/<slug:slug>/upload/", views.upload, name="upload"),
    path("t/<slug:slug>/aliases/", views.alias_list, name="aliases"),
    path("t/<slug:slug>/aliases/<slug:name>/", views.alias_detail, name="alias"),
    path(
        "t/<slug:slug>/aliases/<slug:name>/<str:action>",
        views.alias_action,
        name="alias_action",
    ),
    path("versions/<int:version_id>/", views.version_detail, name="version"),
    path("versions/<int:version_id>/<str:verdict>", views.review, name="review"),
    path("review/", views.review_queue, name="queue"),
]
