"""Django's admin, under the console's rules.

Off in production unless ``LORAHUB_DJANGO_ADMIN=1`` (every ``/admin/`` page is then 404).
When on, it has no sign-in of its own: its login page sends people to the console's, so local
sign-in being off (break-glass only), django-axes' lockout, the second-factor step and the
audit all apply; and a page opens only for an active staff user whose session passed a second
factor when ``LORAHUB_REQUIRE_SECOND_FACTOR`` is on. Second-factor devices are not listed:
their keys are nobody's to read. Versions, aliases and releases are never registered here:
they change through the services, which sign, audit and broadcast.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.http import Http404, HttpRequest, HttpResponseRedirect


def enabled() -> bool:
    return settings.LORAHUB_DJANGO_ADMIN


class LorahubAdminSite(admin.AdminSite):
    site_header = "lorahub administration"

    def admin_view(self, view, cacheable=False):
        wrapped = super().admin_view(view, cacheable)

        def guarded(request: HttpRequest, *args, **kwargs):
            if not enabled():
                raise Http404("the admin is off (LORAHUB_DJANGO_ADMIN)")
            return wrapped(request, *args, **kwargs)

        guarded.__dict__.update(wrapped.__dict__)
        return guarded

    def has_permission(self, request: HttpRequest) -> bool:
        from apps.tenants.auth import SECOND_FACTOR_SESSION_KEY

        if not (enabled() and super().has_permission(request)):
            return False
        return not settings.REQUIRE_SECOND_FACTOR or bool(
            request.session.get(SECOND_FACTOR_SESSION_KEY)
        )

    def login(self, request: HttpRequest, extra_context=None):
        """The console's sign-in, never the admin's own password form."""
        if not enabled():
            raise Http404("the admin is off (LORAHUB_DJANGO_ADMIN)")
        target = request.GET.get("next") or "/admin/"
        return HttpResponseRedirect(f"{settings.LOGIN_URL}?{urlencode({'next': target})}")


class LorahubAdminConfig(AdminConfig):
    default_site = "lorahub.admin.LorahubAdminSite"

    def ready(self) -> None:
        super().ready()
        from django_otp.plugins.otp_static.models import StaticDevice
        from django_otp.plugins.otp_totp.models import TOTPDevice

        for model in (TOTPDevice, StaticDevice):
            if admin.site.is_registered(model):
                admin.site.unregister(model)
