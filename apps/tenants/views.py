from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.tenants import services
from apps.tenants.models import Membership


@login_required
def home(request: HttpRequest) -> HttpResponse:
    memberships = Membership.objects.filter(user=request.user).select_related("tenant")
    return render(
        request,
        "tenants/home.html",
        {
            "memberships": memberships,
            "platform_roles": services.platform_roles(request.user),
            "node_url": f"http://{settings.LORAHUB_NODE_HOST}:{settings.LORAHUB_NODE_PORT}",
        },
    )
