"""Template context for every console page: the signed-in user's tenants and roles (nav)."""

from __future__ import annotations

from django.http import HttpRequest

from apps.tenants.console import principal_of
from apps.tenants.models import Tenant


def console_nav(request: HttpRequest) -> dict:
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    principal = principal_of(request)
    tenants = list(Tenant.objects.filter(id__in=principal.tenant_ids).order_by("slug"))
    slug = getattr(request, "resolver_match", None) and request.resolver_match.kwargs.get("slug")
    current = next((t for t in tenants if t.slug == slug), None)
    if current is None and slug and principal.is_operator:
        current = Tenant.objects.filter(slug=slug).first()
    if current is None and tenants:
        current = tenants[0]
    return {
        "nav_tenants": tenants,
        "nav_tenant": current,
        "nav_is_reviewer": principal.is_reviewer,
        "nav_is_operator": principal.is_operator,
        "nav_is_admin": current is not None
        and (current.id in principal.admin_tenant_ids or principal.is_operator),
    }
