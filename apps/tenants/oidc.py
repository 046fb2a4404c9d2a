"""Single sign-on through an OpenID Connect provider (Keycloak, Entra ID, Okta, Google...).

mozilla-django-oidc runs the authorization code flow: state (single use, kept in the session),
nonce and PKCE, the token exchange and the session. This module adds what it leaves out:

- discovery: the endpoints come from ``<issuer>/.well-known/openid-configuration``;
- the ID token's check with PyJWT: signature by a key of the provider's key set (fetched again
  when a token names a key id not seen yet, so the provider may rotate its keys), issuer,
  audience (our client id), expiry and issue time, nonce;
- users found by the provider's subject (``ExternalIdentity``), created at their first sign-in
  and updated at each one, their roles recomputed from their groups (``apps/tenants/roles.py``);
- the second factor from the ``amr``/``acr`` claims; sign-in failures on a page that says what
  happened, and in the audit log.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any
from urllib.parse import urlencode

import jwt
import requests
from django.conf import settings
from django.contrib.auth import get_user_model, logout
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from apps.tenants import roles
from apps.tenants.auth import METHOD_SESSION_KEY
from apps.tenants.models import ExternalIdentity
from apps.tenants.signin import audit, complete_sign_in
from lorahub.logs import printable

log = logging.getLogger(__name__)
DISCOVERY_TTL_S = 3600
BACKEND = "apps.tenants.oidc.ProviderBackend"
# discovery document field → the mozilla-django-oidc setting it stands for
ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
# set on the request by SignInCallback alone, after it checked the state
CALLBACK_MARK = "_lorahub_oidc_callback"
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"]


class SignInRefused(Exception):
    """A sign-in through the provider that must not go on; ``reason`` is shown and audited."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_lock = threading.Lock()
_discovered: dict[str, tuple[float, dict]] = {}
_key_sets: dict[str, jwt.PyJWKClient] = {}


def discovery() -> dict:
    """The provider's discovery document, cached for an hour."""
    issuer = settings.OIDC_ISSUER
    with _lock:
        cached = _discovered.get(issuer)
        if cached and time.monotonic() - cached[0] < DISCOVERY_TTL_S:
            return cached[1]
    url = f"{issuer.rstrip('/')}/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise SignInRefused(
            f"the identity provider's discovery document ({url}) could not be read: {exc}"
        ) from None
    if document.get("issuer") != issuer:  # exactly as published, a trailing "/" included
        raise SignInRefused(
            f"the provider at {url} calls itself {document.get('issuer')!r}, not {issuer!r}: "
            "check LORAHUB_OIDC_ISSUER"
        )
    with _lock:
        _discovered[issuer] = (time.monotonic(), document)
    return document


def forget_provider() -> None:
    """Drop the cached discovery document and key sets (tests; a changed issuer)."""
    with _lock:
        _discovered.clear()
        _key_sets.clear()


def provider_setting(attr: str, *args: Any) -> Any:
    """mozilla-django-oidc's settings, its endpoints taken from discovery."""
    if attr in ENDPOINTS:
        return discovery().get(ENDPOINTS[attr])
    return import_from_settings(attr, *args)


def _key_set(uri: str) -> jwt.PyJWKClient:
    with _lock:
        client = _key_sets.get(uri)
        if client is None:
            # keys cached; a token with an unknown key id fetches the set again at once
            # (rotation), at most once per LORAHUB_OIDC_KEY_REFETCH_S
            client = jwt.PyJWKClient(
                uri,
                cache_keys=True,
                lifespan=3600,
                timeout=10,
                cooldown_duration=settings.OIDC_KEY_REFETCH_S,
            )
            _key_sets[uri] = client
        return client


def check_id_token(token: str, *, nonce: str | None) -> dict:
    """The ID token's claims, once its signature, issuer, audience, expiry and nonce hold."""
    if not token:
        raise SignInRefused("the provider sent no ID token")
    try:
        key = _key_set(discovery()["jwks_uri"]).get_signing_key_from_jwt(token)
        claims = jwt.decode(
            token,
            key.key,
            algorithms=ALGORITHMS,
            audience=settings.OIDC_RP_CLIENT_ID,
            issuer=settings.OIDC_ISSUER,
            leeway=settings.OIDC_CLOCK_SKEW_S,
            options={"require": ["exp", "iat", "iss", "aud", "sub"]},
        )
    except jwt.ExpiredSignatureError:
        raise SignInRefused("the provider's ID token has expired") from None
    except jwt.InvalidAudienceError:
        raise SignInRefused(
            f"the provider's ID token was issued to another client, not to "
            f"{settings.OIDC_RP_CLIENT_ID!r}"
        ) from None
    except jwt.InvalidIssuerError:
        raise SignInRefused("the provider's ID token names another issuer") from None
    except jwt.InvalidSignatureError:
        raise SignInRefused(
            "the provider's ID token does not verify against the provider's keys: it was "
            "altered on the way"
        ) from None
    except (jwt.PyJWKClientError, jwt.InvalidTokenError) as exc:
        raise SignInRefused(f"the provider's ID token is not valid: {exc}") from None
    azp = claims.get("azp")
    if azp and azp != settings.OIDC_RP_CLIENT_ID:
        raise SignInRefused("the provider's ID token was issued to another client (azp)")
    if not nonce or claims.get("nonce") != nonce:  # a token without one answers no sign-in
        raise SignInRefused("the provider's ID token does not answer this sign-in (nonce)")
    return claims


def second_factor_of(claims: dict) -> str:
    """What the provider says about how the user authenticated: "" when not a second factor."""
    amr = claims.get("amr") or []
    amr = [amr] if isinstance(amr, str) else list(amr)
    strong = [m for m in amr if m in settings.OIDC_MFA_AMR]
    if strong:
        return f"provider: amr {' '.join(strong)}"
    acr = str(claims.get("acr") or "")
    if acr and acr in settings.OIDC_MFA_ACR:
        return f"provider: acr {acr}"
    return ""


class ProviderBackend(OIDCAuthenticationBackend):
    """Users by the provider's subject; roles from the groups claim at every sign-in."""

    get_settings = staticmethod(provider_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Django makes a backend for every request of a signed-in user: nothing here may ask
        # the provider (the endpoints below are read when a sign-in needs them)
        self.UserModel = get_user_model()
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None

    @property
    def OIDC_OP_TOKEN_ENDPOINT(self) -> str:
        return discovery()["token_endpoint"]

    @property
    def OIDC_OP_USER_ENDPOINT(self) -> str | None:
        return discovery().get("userinfo_endpoint")

    def authenticate(self, request: HttpRequest | None, **kwargs: Any):
        """Only the callback view signs in through the provider, with the state it checked
        and the sign-in's nonce and PKCE verifier. Django also offers every other
        ``authenticate()`` to this backend (the password form's, the admin's): those get
        nothing, whatever ``?code=`` their request carries."""
        if (
            request is None
            or not getattr(request, CALLBACK_MARK, False)
            or not kwargs.get("nonce")
            or not kwargs.get("code_verifier")
            or set(kwargs) - {"nonce", "code_verifier"}
        ):
            return None
        return super().authenticate(request, **kwargs)

    def verify_token(self, token: str, **kwargs: Any) -> dict:
        claims = check_id_token(token, nonce=kwargs.get("nonce"))
        self.id_claims = claims
        return claims

    def get_userinfo(self, access_token: str, id_token: str, payload: dict) -> dict:
        """The ID token's claims, completed by the userinfo endpoint where there is one (some
        providers send groups only there); how the user authenticated comes from the token."""
        claims = dict(payload)
        if self.OIDC_OP_USER_ENDPOINT:
            try:
                extra = super().get_userinfo(access_token, id_token, payload)
            except requests.RequestException as exc:
                log.warning("the provider's userinfo endpoint failed: %s", exc)
            else:
                if extra.get("sub") not in (None, claims["sub"]):
                    raise SignInRefused("the provider's userinfo is about another subject")
                for name, value in extra.items():
                    if name not in ("amr", "acr", "iss", "aud", "exp", "iat", "nonce"):
                        claims[name] = value
        return claims

    def verify_claims(self, claims: dict) -> bool:
        return bool(claims.get("sub"))

    def filter_users_by_claims(self, claims: dict):
        identity = ExternalIdentity.objects.filter(
            issuer=settings.OIDC_ISSUER, subject=claims["sub"]
        ).first()
        users = get_user_model().objects.filter(pk=identity.user_id) if identity else None
        return users if users is not None else get_user_model().objects.none()

    def _username(self, claims: dict) -> str:
        User = get_user_model()
        wanted = str(
            claims.get(settings.OIDC_USERNAME_CLAIM) or claims.get("email") or claims["sub"]
        )[:140]
        name, n = wanted, 1
        while User.objects.filter(username=name).exists():
            n += 1
            name = f"{wanted}-{n}"
        return name

    @transaction.atomic
    def create_user(self, claims: dict):
        User = get_user_model()
        user = User.objects.create(username=self._username(claims))
        user.set_unusable_password()  # signs in through the provider only
        user.save()
        ExternalIdentity.objects.create(
            user=user, issuer=settings.OIDC_ISSUER, subject=claims["sub"]
        )
        return self.update_user(user, claims, created=True)

    @transaction.atomic
    def update_user(self, user, claims: dict, created: bool = False):
        user.email = str(claims.get("email") or user.email)[:254]
        user.first_name = str(claims.get("given_name") or user.first_name)[:150]
        user.last_name = str(claims.get("family_name") or user.last_name)[:150]
        user.save()
        groups = claims.get(settings.OIDC_GROUPS_CLAIM) or []
        groups = [groups] if isinstance(groups, str) else [str(g) for g in groups]
        ExternalIdentity.objects.filter(user=user, issuer=settings.OIDC_ISSUER).update(
            groups=groups, last_sign_in_at=timezone.now()
        )
        roles.apply(user, groups, created=created)
        user.lorahub_second_factor = second_factor_of(claims)
        user.lorahub_subject = claims["sub"]
        return user


class SignInStart(OIDCAuthenticationRequestView):
    """ "Sign in with <provider>": to the provider's authorization endpoint (state, nonce and
    the PKCE challenge kept in the session)."""

    get_settings = staticmethod(provider_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID

    def get(self, request: HttpRequest) -> HttpResponse:
        if not settings.OIDC_ISSUER:
            raise Http404("single sign-on is not configured (LORAHUB_OIDC_ISSUER)")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = provider_setting("OIDC_OP_AUTHORIZATION_ENDPOINT")
        except SignInRefused as exc:
            return refused(request, exc.reason, status=502)
        return super().get(request)


class SignInCallback(OIDCAuthenticationCallbackView):
    """The provider's redirect back: state checked (single use), code exchanged, ID token
    checked, the user signed in. Any failure is a page that says what happened."""

    get_settings = staticmethod(provider_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not settings.OIDC_ISSUER:
            raise Http404("single sign-on is not configured (LORAHUB_OIDC_ISSUER)")
        if request.GET.get("error"):
            states = request.session.get("oidc_states") or {}
            if states.pop(request.GET.get("state", ""), None) is not None:  # never again
                request.session["oidc_states"] = states
            reason = request.GET.get("error_description") or request.GET["error"]
            # the provider's text, as sent through the browser: bounded, control characters
            # escaped, before it reaches the audit log and the logs
            return refused(request, f"the identity provider refused: {printable(reason, 300)}")
        state = request.GET.get("state", "")
        if state not in (request.session.get("oidc_states") or {}):
            return refused(
                request,
                "this sign-in link was already used or does not belong to this browser "
                "(state); start again",
            )
        setattr(request, CALLBACK_MARK, True)  # the one caller ProviderBackend answers
        try:
            return super().get(request)
        except SignInRefused as exc:
            return refused(request, exc.reason)
        except requests.HTTPError as exc:
            return refused(request, f"the provider refused the code: {exc}")
        except requests.RequestException as exc:
            return refused(request, f"the provider could not be reached: {exc}", status=502)

    def login_success(self) -> HttpResponse:
        user = self.user
        complete_sign_in(
            self.request,
            user,
            method="oidc",
            second_factor=getattr(user, "lorahub_second_factor", ""),
            backend=BACKEND,
            subject=getattr(user, "lorahub_subject", ""),
            issuer=settings.OIDC_ISSUER,
        )
        self.request.session["oidc_id_token_expiration"] = time.time() + 900
        return super().login_success()

    def login_failure(self) -> HttpResponse:
        return refused(self.request, "the provider's answer did not sign anyone in")


def refused(request: HttpRequest, reason: str, *, status: int = 403) -> HttpResponse:
    audit(request, "sign_in.failed", who="oidc", after={"method": "oidc"}, note=reason)
    return render(
        request,
        "registration/sign_in_failed.html",
        {"reason": reason, "provider": settings.OIDC_NAME},
        status=status,
    )


def logout_url(request: HttpRequest) -> str:
    """The provider's end-session endpoint with the ID token as hint, or "" if it has none."""
    try:
        endpoint = discovery().get("end_session_endpoint")
    except SignInRefused:
        return ""
    if not endpoint:
        return ""
    back = request.build_absolute_uri(reverse("login"))
    params = {"post_logout_redirect_uri": back, "client_id": settings.OIDC_RP_CLIENT_ID}
    if hint := request.session.get("oidc_id_token"):
        params["id_token_hint"] = hint
    return f"{endpoint}?{urlencode(params)}"


# --- sign-out ------------------------------------------------------------------------------


@require_POST
def sign_out(request: HttpRequest) -> HttpResponse:
    """End the console session; after single sign-on, the provider's session too, where the
    provider offers a logout endpoint (RP-initiated logout)."""
    target = settings.LOGOUT_REDIRECT_URL
    if request.session.get(METHOD_SESSION_KEY) == "oidc":
        target = logout_url(request) or target
    if request.user.is_authenticated:
        audit(request, "sign_out", user=request.user)
    logout(request)
    return HttpResponseRedirect(target)
