"""Each tenant's default release plan, and the plan a release runs: the defaults with its
own overrides (``plan.build``)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from apps.releases.models import ReleaseDefaults
from apps.releases.plan import Plan, build
from apps.tenants import services as tenant_services
from apps.tenants.auth import Principal
from apps.tenants.errors import Forbidden
from apps.tenants.models import Tenant


def tenant_defaults(tenant: Tenant) -> dict[str, Any]:
    row = ReleaseDefaults.objects.filter(tenant=tenant).first()
    return dict(row.plan) if row else {}


def effective_plan(tenant: Tenant, overrides: dict[str, Any] | None = None) -> Plan:
    return build(tenant_defaults(tenant), overrides)


@transaction.atomic
def set_tenant_defaults(
    *, principal: Principal, tenant: Tenant, plan: dict[str, Any]
) -> dict[str, Any]:
    if tenant.id not in principal.admin_tenant_ids and not principal.is_operator:
        raise Forbidden(f"only an admin of tenant '{tenant.slug}' or an operator may do this")
    build(plan)  # refuse what could not run, field by field
    row, _ = ReleaseDefaults.objects.get_or_create(tenant=tenant)
    before, row.plan = row.plan, plan
    row.save()
    tenant_services.record_event(
        action="release.defaults",
        obj=row,
        actor=principal.user,
        actor_key=principal.api_key,
        tenant=tenant,
        before=before,
        after=plan,
    )
    return row.plan
