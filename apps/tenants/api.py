from __future__ import annotations

from django.http import HttpRequest
from ninja import Router, Schema
from ninja.security import django_auth

from apps.tenants import services
from apps.tenants.models import Membership

router = Router(tags=["tenants"])


class MembershipOut(Schema):
    tenant: str
    role: str


class MeOut(Schema):
    username: str
    platform_roles: list[str]
    tenants: list[MembershipOut]


@router.get("/me", response=MeOut, auth=django_auth)
def me(request: HttpRequest) -> MeOut:
    memberships = Membership.objects.filter(user=request.user).select_related("tenant")
    return MeOut(
        username=request.user.get_username(),
        platform_roles=services.platform_roles(request.user),
        tenants=[MembershipOut(tenant=m.tenant.slug, role=m.role) for m in memberships],
    )
