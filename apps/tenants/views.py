"""Console pages of the tenants app: API keys, the audit log, the operator's tenant list."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

from django.contrib import messages
from django.db import transaction
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_date
from django.views.decorators.http import require_POST

from apps.tenants import services
from apps.tenants.choices import Priority
from apps.tenants.console import (
    act,
    operators,
    principal_of,
    require,
    signed_in,
    table,
    tenant_or_404,
)
from apps.tenants.errors import DomainError, Forbidden, Invalid
from apps.tenants.models import AuditEvent, Quota, Tenant


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """A form without a valid CSRF token: refused, with what to do (not Django's debug page)."""
    return HttpResponseForbidden(
        render_to_string("console/csrf_failure.html", {"reason": reason}, request=request)
    )


# --- API keys ----------------------------------------------------------------------------------


def _expiry(raw: str) -> datetime | None:
    """The form's "valid through" day: the key stops at the end of that day, UTC."""
    if not raw.strip():
        return None
    day = parse_date(raw.strip())
    if day is None:
        raise Invalid(f"'{raw}' is not a date; pick one, e.g. 2027-01-31, or leave it empty")
    return datetime.combine(day + timedelta(days=1), time.min, tzinfo=UTC)


@require(signed_in, "tenant admins")
def keys(request: HttpRequest, slug: str) -> HttpResponse:
    principal = principal_of(request)
    tenant = tenant_or_404(principal, slug)
    try:
        principal.require_tenant_admin(tenant)
    except Forbidden as exc:
        return render(request, "console/forbidden.html", {"message": exc.message}, status=403)
    new_key = None
    if request.method == "POST":
        try:
            if request.POST.get("admin") == "on":  # an admin key may promote and abort releases
                principal.require_second_factor("issuing an admin key")
            key, plaintext = services.issue_api_key(
                tenant=tenant,
                name=request.POST.get("name", ""),
                actor=request.user,
                admin=request.POST.get("admin") == "on",
                expires_at=_expiry(request.POST.get("expires_on", "")),
            )
        except DomainError as exc:
            messages.error(request, exc.message)
        else:
            # Shown in this response only: never stored, never rendered again.
            new_key = {
                "name": key.name,
                "plaintext": plaintext,
                "admin": key.admin,
                "expires_at": key.expires_at,
            }
    rows = tenant.api_keys.select_related("created_by")
    listing = table(
        request,
        rows,
        sorts={
            "name": "name",
            "created": "created_at",
            "used": "last_used_at",
            "expires": "expires_at",
        },
        default="-created",
    )
    return render(
        request,
        "tenants/keys.html",
        {
            "tenant": tenant,
            "table": listing,
            "new_key": new_key,
            "section": "keys",
            "today": timezone.now().date(),
        },
    )


@require_POST
@require(signed_in, "tenant admins")
def revoke_key(request: HttpRequest, slug: str, prefix: str) -> HttpResponse:
    principal = principal_of(request)
    tenant = tenant_or_404(principal, slug)
    back = reverse("tenants:keys", args=[tenant.slug])
    key = tenant.api_keys.filter(prefix=prefix).first()
    if key is None:
        messages.error(request, f"tenant '{slug}' has no API key lh_{prefix}_…")
        return redirect(back)

    def revoke() -> None:
        principal.require_tenant_admin(tenant)
        services.revoke_api_key(key=key, actor=request.user)

    return act(request, revoke, f"Key '{key.name}' (lh_{prefix}_…) is revoked.", back)


# --- webhooks ----------------------------------------------------------------------------------


@require(signed_in, "tenant admins")
def webhooks_page(request: HttpRequest, slug: str) -> HttpResponse:
    """A tenant's webhooks: add one (its secret shown once), send a test, remove one, and the
    deliveries with their last status."""
    principal = principal_of(request)
    tenant = tenant_or_404(principal, slug)
    try:
        principal.require_tenant_admin(tenant)
    except Forbidden as exc:
        return render(request, "console/forbidden.html", {"message": exc.message}, status=403)
    return _webhooks(request, tenant)


@require(operators, "operators")
def platform_webhooks_page(request: HttpRequest) -> HttpResponse:
    """The operators' webhooks: every quarantine, a node down (and any event they pick)."""
    return _webhooks(request, None)


def _webhooks(request: HttpRequest, tenant: Tenant | None) -> HttpResponse:
    from apps.tenants import webhooks
    from apps.tenants.models import Webhook, WebhookDelivery

    hooks = Webhook.objects.filter(tenant=tenant)
    back = (
        reverse("tenants:webhooks", args=[tenant.slug])
        if tenant
        else reverse("tenants:platform_webhooks")
    )
    created = None
    status = 200
    if request.method == "POST":
        action = request.POST.get("action", "")
        hook = hooks.filter(pk=request.POST.get("webhook") or 0).first()
        if action == "create":
            try:
                created = webhooks.create(
                    tenant=tenant,
                    url=request.POST.get("url", ""),
                    events=request.POST.getlist("events"),
                    format=request.POST.get("format", "lorahub"),
                    actor=request.user,
                )
            except DomainError as exc:
                messages.error(request, f"Nothing was added: {exc.message}")
                status = 422
        elif action == "test" and hook is not None:
            webhooks.send_test(hook)
            messages.success(
                request, f"A test is on its way to {hook.url}; its status shows below."
            )
            return redirect(back)
        elif action == "delete" and hook is not None:
            services.record_event(
                action="webhook.delete", obj=hook, actor=request.user, tenant=tenant,
                before={"url": hook.url},
            )  # fmt: skip
            hook.delete()
            messages.success(request, f"Webhook {hook.url} removed.")
            return redirect(back)
    deliveries = WebhookDelivery.objects.filter(webhook__tenant=tenant).select_related("webhook")
    listing = table(request, deliveries, sorts={"at": "created_at"}, default="-at")
    last = {}
    for delivery in WebhookDelivery.objects.filter(webhook__in=hooks).order_by("-created_at")[:500]:
        last.setdefault(delivery.webhook_id, delivery)
    rows = [{"hook": h, "last": last.get(h.pk)} for h in hooks]
    events = {
        name: label
        for name, label in webhooks.EVENTS.items()
        if name != "ping" and (tenant is None or name != "node.down")
    }
    return render(
        request,
        "tenants/webhooks.html",
        {
            "tenant": tenant,
            "rows": rows,
            "created": created,
            "events": events,
            "table": listing,
            "formats": Webhook.Format.choices,
            "section": "webhooks" if tenant else "platform_webhooks",
        },
        status=status,
    )


# --- audit log ---------------------------------------------------------------------------------


def _day(raw: str | None, *, end: bool = False) -> datetime | None:
    day = parse_date(raw or "")
    if day is None:
        return None
    moment = datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())
    return moment + timedelta(days=1) if end else moment


@require(lambda p: p.is_operator or bool(p.admin_tenant_ids), "operators and tenant admins")
def audit(request: HttpRequest) -> HttpResponse:
    """Every recorded action; operators see all tenants, tenant admins their own."""
    principal = principal_of(request)
    qs = AuditEvent.objects.select_related("actor", "actor_key", "tenant")
    tenants = Tenant.objects.all()
    if not principal.is_operator:
        qs = qs.filter(tenant_id__in=principal.admin_tenant_ids)
        tenants = tenants.filter(id__in=principal.admin_tenant_ids)
    f = request.GET
    if f.get("tenant"):
        qs = qs.filter(tenant__slug=f["tenant"])
    if f.get("actor"):
        name = f["actor"].strip()
        qs = qs.filter(Q(actor__username=name) | Q(actor_key__prefix=name.removeprefix("key ")))
    if f.get("action"):
        qs = qs.filter(action__startswith=f["action"].strip())
    if since := _day(f.get("since")):
        qs = qs.filter(at__gte=since)
    if until := _day(f.get("until"), end=True):
        qs = qs.filter(at__lt=until)
    listing = table(request, qs, sorts={"at": "at", "action": "action"}, default="-at")
    return render(
        request,
        "tenants/audit.html",
        {"table": listing, "tenants": tenants, "filters": f, "section": "audit"},
    )


# --- operators: tenants, quotas, priorities -----------------------------------------------------


@require(operators, "operators")
def tenant_list(request: HttpRequest) -> HttpResponse:
    qs = Tenant.objects.select_related("quota")
    if q := request.GET.get("q", "").strip():
        qs = qs.filter(Q(slug__icontains=q) | Q(name__icontains=q))
    listing = table(
        request,
        qs,
        sorts={"slug": "slug", "priority": "priority", "created": "created_at"},
        default="slug",
    )
    return render(
        request,
        "tenants/tenant_list.html",
        {"table": listing, "q": q, "defaults": Quota(), "section": "tenants"},
    )


@require_POST
@require(operators, "operators")
def set_limits(request: HttpRequest, slug: str) -> HttpResponse:
    """The operator's quota and priority form (on the tenant's quota page)."""
    tenant = tenant_or_404(principal_of(request), slug)
    back = reverse("fleet:quota", args=[tenant.slug])
    limits: dict[str, int] = {}
    for field in services.QUOTA_FIELDS:
        raw = request.POST.get(field, "").strip()
        if raw == "":
            continue
        try:
            limits[field] = int(raw)
        except ValueError:
            messages.error(request, f"{field} must be a whole number, got '{raw}'; nothing changed")
            return redirect(back)

    def save() -> None:
        with transaction.atomic():  # limits and priority together, or neither
            services.set_quota(tenant=tenant, actor=request.user, **limits)
            if (priority := request.POST.get("priority", "").strip()) != "":
                services.set_priority(tenant=tenant, priority=int(priority), actor=request.user)

    if request.POST.get("priority", "").strip() not in ("", *map(str, Priority.values)):
        messages.error(request, "choose a priority from the list; nothing changed")
        return redirect(back)
    return act(request, save, f"Limits of '{tenant.slug}' saved; nodes apply them at once.", back)
