"""The console's sign-in: a local password (then the second factor, where the user has one),
single sign-on through an OpenID provider (``apps/tenants/oidc.py``), sign-out, and the audit
of each. docs/security.md says what is configured where.

A session records how it signed in (``METHOD_SESSION_KEY``) and whether it passed a second
factor (``SECOND_FACTOR_SESSION_KEY``); ``Principal.require_second_factor`` reads both.
"""

from __future__ import annotations

import logging
import time
from base64 import b32encode
from typing import Any

import segno
from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.signals import user_login_failed
from django.contrib.auth.views import LoginView
from django.db import transaction
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django_otp import devices_for_user
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken

from apps.tenants import throttle
from apps.tenants.auth import METHOD_SESSION_KEY, SECOND_FACTOR_SESSION_KEY
from apps.tenants.models import AuditEvent, HashedRecoveryCodes, SealedTOTPDevice
from apps.tenants.services import platform_roles

log = logging.getLogger(__name__)
PENDING_SESSION_KEY = "lorahub_pending_sign_in"
PENDING_TTL_S = 300  # the code must follow the password within this
SIGNED_IN_AT_SESSION_KEY = "lorahub_signed_in_at"
RECOVERY_CODES = 10


def client_address(request: HttpRequest) -> str:
    return request.META.get("REMOTE_ADDR", "")


def audit(
    request: HttpRequest,
    action: str,
    *,
    user: Any = None,
    who: str = "",
    after: dict | None = None,
    note: str = "",
) -> None:
    """A sign-in event: who (the user, or the name or subject tried), how, from where. Events
    of nobody signed in are bounded per address (``throttle.may_audit_anonymous``)."""
    if user is None and not throttle.may_audit_anonymous(client_address(request)):
        log.warning("not audited (over the anonymous limit): %s %s %s", action, who, note)
        return
    AuditEvent.objects.create(
        action=action,
        object_type="User",
        object_id=str(user.pk) if user is not None else (who or "?")[:64],
        actor=user if user is not None else None,
        after={"address": client_address(request), **(after or {})},
        note=note,
    )


def complete_sign_in(
    request: HttpRequest, user: Any, *, method: str, second_factor: str, backend: str, **extra
) -> None:
    """Log the user in and record how: the session's method and second factor, and the audit."""
    login(request, user, backend=backend)
    request.session[METHOD_SESSION_KEY] = method
    request.session[SECOND_FACTOR_SESSION_KEY] = second_factor
    request.session[SIGNED_IN_AT_SESSION_KEY] = time.time()
    audit(
        request,
        "sign_in",
        user=user,
        after={"method": method, "second_factor": second_factor or None, **extra},
    )


def needs_second_factor(user: Any) -> bool:
    """Whether the platform asks this user for a second factor: reviewers and operators, when
    ``LORAHUB_REQUIRE_SECOND_FACTOR`` is on."""
    return settings.REQUIRE_SECOND_FACTOR and bool(platform_roles(user))


def confirmed_devices(user: Any) -> list:
    return list(devices_for_user(user, confirmed=True))


# --- password, then code ---------------------------------------------------------------------


class PasswordForm(AuthenticationForm):
    """Django's form, refusing everyone but the break-glass account when local sign-in is off."""

    error_messages = {
        **AuthenticationForm.error_messages,
        "invalid_login": "That username and password do not match. Try again, or ask an "
        "operator to reset your password.",
    }

    def clean(self) -> dict[str, Any]:
        username = (self.data.get("username") or "").strip()
        if not settings.LOCAL_SIGN_IN and username != settings.BREAK_GLASS_USER:
            audit(self.request, "sign_in.failed", who=username, note="password sign-in is off")
            raise forms.ValidationError(
                f"Password sign-in is off on this platform: use “Sign in with "
                f"{settings.OIDC_NAME}”.",
                code="local_off",
            )
        return super().clean()


class SignInView(LoginView):
    """The password step. A user with a second factor goes on to the code step; the session
    is created only once both passed."""

    form_class = PasswordForm
    template_name = "registration/login.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return {
            **super().get_context_data(**kwargs),
            "oidc_name": settings.OIDC_NAME if settings.OIDC_ISSUER else "",
            "local_sign_in": settings.LOCAL_SIGN_IN,
        }

    def form_valid(self, form: AuthenticationForm) -> HttpResponse:
        user = form.get_user()
        if confirmed_devices(user):
            self.request.session[PENDING_SESSION_KEY] = {
                "user": user.pk,
                "backend": user.backend,
                "next": self.get_success_url(),
                "at": time.time(),
            }
            return redirect("second_factor_verify")
        complete_sign_in(
            self.request, user, method="password", second_factor="", backend=user.backend
        )
        if needs_second_factor(user):
            messages.info(
                self.request,
                "Reviewers and operators sign in with a second factor: set up an "
                "authenticator app to go on.",
            )
            return redirect("second_factor")
        return HttpResponseRedirect(self.get_success_url())


@receiver(user_login_failed)
def _record_password_failure(sender, credentials: dict, request=None, **kwargs) -> None:
    if request is not None and "username" in credentials:  # not the provider's callback
        audit(request, "sign_in.failed", who=credentials["username"], note="password")


def check_code(user: Any, code: str) -> Any:
    """The device that accepts ``code``: six digits are the app's (TOTP), anything else a
    recovery code. One device per code, so a wrong code slows down only the device it was
    meant for (django-otp's throttling)."""
    code = code.replace(" ", "").replace("-", "")
    kind = SealedTOTPDevice if code.isdigit() and len(code) == 6 else HashedRecoveryCodes
    device = kind.objects.filter(user=user, confirmed=True).first()
    if device is None or not device.verify_is_allowed()[0]:
        return None
    return device if device.verify_token(code) else None


class CodeForm(forms.Form):
    code = forms.CharField(max_length=32, strip=True, label="Code")


def verify(request: HttpRequest) -> HttpResponse:
    """The code step after a password: a code of the authenticator app, or a recovery code."""
    pending = request.session.get(PENDING_SESSION_KEY)
    if not pending or time.time() - pending["at"] > PENDING_TTL_S:
        request.session.pop(PENDING_SESSION_KEY, None)
        messages.error(request, "Sign in again: the code must follow the password within 5 min.")
        return redirect("login")
    user = get_user_model().objects.filter(pk=pending["user"], is_active=True).first()
    if user is None:
        return redirect("login")
    form = CodeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        device = check_code(user, form.cleaned_data["code"])
        if device is not None:
            del request.session[PENDING_SESSION_KEY]
            factor = "recovery code" if isinstance(device, StaticDevice) else "totp"
            complete_sign_in(
                request, user, method="password", second_factor=factor, backend=pending["backend"]
            )
            if factor == "recovery code":
                left = StaticToken.objects.filter(device=device).count()
                messages.warning(
                    request,
                    f"You signed in with a recovery code; {left} are left. Make new ones on "
                    "the second-factor page if you are running out.",
                )
            target = pending["next"]
            safe = url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()})
            return HttpResponseRedirect(target if safe else settings.LOGIN_REDIRECT_URL)
        audit(request, "sign_in.failed", user=user, note="wrong second-factor code")
        form.add_error(
            "code",
            "That code is not right (or was used already). Codes change every 30 s; check "
            "your device's clock, or use a recovery code.",
        )
    return render(request, "registration/verify.html", {"form": form, "username": user})


# --- enrolment -----------------------------------------------------------------------------


def _qr_svg(uri: str) -> str:
    return segno.make(uri, error="m").svg_inline(scale=4, dark="#111", light="#fff")


def _new_recovery_codes(user: Any) -> list[str]:
    """New codes for ``user`` (the old ones stop): shown once, stored as digests only."""
    StaticDevice.objects.filter(user=user).delete()
    device = HashedRecoveryCodes.objects.create(user=user, name="recovery codes", confirmed=True)
    codes = [StaticToken.random_token() for _ in range(RECOVERY_CODES)]
    device.set_codes(codes)
    return codes


def fresh_sign_in(request: HttpRequest) -> bool:
    """Whether this session signed in (password, and code where there is one) within
    ``LORAHUB_FRESH_SIGN_IN_S``: a session left open, or stolen, cannot bind a new factor."""
    at = request.session.get(SIGNED_IN_AT_SESSION_KEY) or 0
    return time.time() - at <= settings.LORAHUB_FRESH_SIGN_IN_S


STALE_SESSION = (
    "Sign out and in again first: setting up a second factor or making new recovery codes "
    "needs a sign-in from the last {minutes} minutes."
)


def _second_factor_changed(request: HttpRequest, user: Any, action: str, **after: Any) -> None:
    """Audited, and told to the operators (their platform-wide webhooks)."""
    from apps.tenants import webhooks

    audit(request, action, user=user, after=after)
    webhooks.notify(
        "second_factor.changed",
        tenant=None,
        data={"user": user.get_username(), "change": action, "roles": platform_roles(user)},
    )


def second_factor(request: HttpRequest) -> HttpResponse:
    """Set up an authenticator app (QR code, then a code to confirm it), see how this session
    signed in, make new recovery codes or remove the second factor."""
    if not request.user.is_authenticated:
        return redirect(f"{settings.LOGIN_URL}?next={request.path}")
    user = request.user
    totp = SealedTOTPDevice.objects.filter(user=user, confirmed=True).first()
    session_factor = request.session.get(SECOND_FACTOR_SESSION_KEY, "")
    fresh = fresh_sign_in(request)
    context: dict[str, Any] = {
        "enrolled": totp is not None,
        "session_factor": session_factor,
        "required": needs_second_factor(user),
        "method": request.session.get(METHOD_SESSION_KEY, ""),
    }
    if request.method == "POST":
        action = request.POST.get("action")
        stale = STALE_SESSION.format(minutes=settings.LORAHUB_FRESH_SIGN_IN_S // 60)
        if action == "confirm" and totp is None and context["required"] and not fresh:
            context["error"] = stale
        elif action == "confirm" and totp is None:
            pending = SealedTOTPDevice.objects.filter(user=user, confirmed=False).first()
            code = (request.POST.get("code") or "").replace(" ", "")
            if pending is not None and pending.verify_token(code):
                with transaction.atomic():
                    pending.confirmed = True
                    pending.save(update_fields=["confirmed"])
                    codes = _new_recovery_codes(user)
                    _second_factor_changed(request, user, "second_factor.enrol", device="totp")
                request.session[SECOND_FACTOR_SESSION_KEY] = "totp"
                return render(request, "registration/recovery_codes.html", {"codes": codes})
            context["error"] = (
                "That code does not match: scan the QR code again, wait for a new code and "
                "type it within 30 s."
            )
        elif action in ("codes", "remove") and totp is not None:
            if not session_factor:
                context["error"] = (
                    "Sign out and in again with your code first: this session did not pass "
                    "your second factor."
                )
            elif action == "codes" and not fresh:
                context["error"] = stale
            elif action == "codes":
                codes = _new_recovery_codes(user)
                _second_factor_changed(request, user, "second_factor.recovery_codes")
                return render(request, "registration/recovery_codes.html", {"codes": codes})
            else:
                reset(user)
                request.session[SECOND_FACTOR_SESSION_KEY] = ""
                audit(request, "second_factor.reset", user=user, note="by the user")
                messages.success(request, "Your second factor is removed.")
                return redirect("second_factor")
    if totp is None and context["method"] != "oidc":
        device = SealedTOTPDevice.objects.filter(user=user, confirmed=False).first()
        if device is None:
            device = SealedTOTPDevice.create_for(user, name="authenticator")
        context["secret"] = b32encode(device.bin_key).decode()
        context["qr"] = _qr_svg(device.config_url)
    status = 422 if "error" in context else 200
    return render(request, "registration/second_factor.html", context, status=status)


def reset(user: Any) -> None:
    """Remove every second-factor device of ``user`` (a lost phone); audited by the caller."""
    for device in devices_for_user(user, confirmed=None):
        device.delete()


# --- the rule for reviewers and operators ----------------------------------------------------

EXEMPT_PREFIXES = ("/accounts/", "/oidc/", "/static/", "/api/", "/healthz", "/metrics")


class SecondFactorMiddleware:
    """With ``LORAHUB_REQUIRE_SECOND_FACTOR``, a reviewer or operator signed in by password
    alone sees the second-factor page until it is set up (the REST API refuses their guarded
    actions instead: ``Principal.require_second_factor``)."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if (
            settings.REQUIRE_SECOND_FACTOR
            and request.user.is_authenticated
            and not request.path.startswith(EXEMPT_PREFIXES)
            and request.session.get(METHOD_SESSION_KEY) == "password"
            and not request.session.get(SECOND_FACTOR_SESSION_KEY)
            and needs_second_factor(request.user)
        ):
            return redirect(reverse("second_factor"))
        return self.get_response(request)
