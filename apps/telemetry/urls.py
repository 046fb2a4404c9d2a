from __future__ import annotations

from django.urls import path

from apps.telemetry import views

app_name = "telemetry"
urlpatterns = [
    path("t/<slug:slug>/dashboard/", views.tenant_dashboard, name="dashboard"),
    path("t/<slug:slug>/dashboard/data", views.tenant_dashboard_data, name="dashboard_data"),
    path("t/<slug:slug>/usage/", views.tenant_usage, name="usage"),
    path("t/<slug:slug>/usage.csv", views.tenant_usage_csv, name="usage_csv"),
    path("operator/usage/", views.operator_usage, name="operator_usage"),
    path("operator/usage.csv", views.operator_usage_csv, name="operator_usage_csv"),
    path("operator/dashboard/", views.operator_dashboard, name="operator_dashboard"),
    path("operator/dashboard/data", views.operator_dashboard_data, name="operator_dashboard_data"),
]
