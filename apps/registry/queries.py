"""Read-side services of the registry: what a principal may see, and counts for pages other
apps own (the console's home page)."""

from __future__ import annotations

from django.db.models import Count

from apps.registry.choices import VersionState
from apps.registry.models import Adapter, AdapterVersion, Alias
from apps.tenants.auth import Principal
from apps.tenants.errors import NotFound


def _per_tenant(queryset, tenant_ids: list[int]) -> dict[int, int]:
    return dict(
        queryset.filter(tenant_id__in=tenant_ids)
        .values("tenant_id")
        .annotate(n=Count("id"))
        .values_list("tenant_id", "n")
    )


def adapters_per_tenant(tenant_ids: list[int]) -> dict[int, int]:
    return _per_tenant(Adapter.objects, tenant_ids)


def aliases_per_tenant(tenant_ids: list[int]) -> dict[int, int]:
    return _per_tenant(Alias.objects, tenant_ids)


def pending_reviews(principal: Principal) -> int | None:
    """Versions waiting for a reviewer that ``principal`` may review (not its own tenants'),
    or None if it is no reviewer."""
    if not principal.is_reviewer:
        return None
    return (
        AdapterVersion.objects.filter(state=VersionState.PENDING_REVIEW)
        .exclude(adapter__tenant_id__in=principal.tenant_ids)
        .count()
    )


def visible_version(principal: Principal, version_id: int) -> AdapterVersion:
    """A version ``principal`` may see; 404, never 403, for one it may not."""
    version = AdapterVersion.objects.visible_to(principal).filter(pk=version_id).first()
    if version is None:
        raise NotFound(f"no adapter version {version_id} that you can see")
    return version
