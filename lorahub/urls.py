from __future__ import annotations

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from apps.tenants import oidc, signin
from lorahub.api import api
from lorahub.home import home

urlpatterns = [
    path("favicon.ico", RedirectView.as_view(url=static("img/favicon.svg"), permanent=True)),
    path("admin/", admin.site.urls),
    # sign-in (apps/tenants/signin.py, apps/tenants/oidc.py; docs/security.md)
    path("accounts/login/", signin.SignInView.as_view(), name="login"),
    path("accounts/logout/", oidc.sign_out, name="logout"),
    path("accounts/second-factor/", signin.second_factor, name="second_factor"),
    path("accounts/second-factor/verify/", signin.verify, name="second_factor_verify"),
    path("oidc/authenticate/", oidc.SignInStart.as_view(), name="oidc_sign_in"),
    path("oidc/callback/", oidc.SignInCallback.as_view(), name="oidc_callback"),
    path("api/", api.urls),
    path("", home, name="home"),
    path("", include("apps.telemetry.urls")),
    path("", include("apps.fleet.urls")),
    path("", include("apps.serving.urls")),
    path("", include("apps.registry.urls")),
    path("", include("apps.tenants.urls")),
    path("", include("apps.evaluations.urls")),
    path("", include("apps.releases.urls")),
]
