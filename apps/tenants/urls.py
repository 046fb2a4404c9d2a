from __future__ import annotations

from django.urls import path

from apps.tenants import views

app_name = "tenants"
urlpatterns = [
    path("t/<slug:slug>/keys/", views.keys, name="keys"),
    path("t/<slug:slug>/keys/<str:prefix>/revoke", views.revoke_key, name="revoke_key"),
    path("t/<slug:slug>/limits", views.set_limits, name="set_limits"),
    path("t/<slug:slug>/webhooks/", views.webhooks_page, name="webhooks"),
    path("operator/webhooks/", views.platform_webhooks_page, name="platform_webhooks"),
    path("audit/", views.audit, name="audit"),
    path("operator/tenants/", views.tenant_list, name="tenant_list"),
]
