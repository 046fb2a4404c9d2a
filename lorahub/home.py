"""The console's home page: the signed-in user's tenants at a glance, read through each
app's services."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.fleet import node_client
from apps.registry import queries as registry
from apps.telemetry import services as telemetry
from apps.tenants import services as tenants
from apps.tenants.console import principal_of, require, signed_in


@require(signed_in, "signed-in users")
def home(request: HttpRequest) -> HttpResponse:
    principal = principal_of(request)
    memberships = tenants.memberships_of(principal.user)
    tenant_ids = [m.tenant_id for m in memberships]
    adapters = registry.adapters_per_tenant(tenant_ids)
    aliases = registry.aliases_per_tenant(tenant_ids)
    traffic = telemetry.requests_per_tenant(tenant_ids, hours=24)
    rows = [
        {
            "membership": m,
            "adapters": adapters.get(m.tenant_id, 0),
            "aliases": aliases.get(m.tenant_id, 0),
            "requests_24h": traffic.get(m.tenant_id, 0),
        }
        for m in memberships
    ]
    return render(
        request,
        "serving/home.html",
        {
            "rows": rows,
            "pending": registry.pending_reviews(principal),
            "nodes": node_client.configured_nodes(),
            "section": "home",
        },
    )
