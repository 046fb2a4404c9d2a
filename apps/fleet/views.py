"""Console pages of the fleet: the nodes' live cache state, quarantines, warming and
evicting on nodes, and a tenant's quota usage across the nodes.

Node state is read server-side from each node's internal API (``node_client.py``) with the
internal token; the browser never talks to a node.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib import messages
from django.db.models import Count, Sum
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.fleet import node_client, quarantine, services
from apps.registry.models import Adapter, AdapterVersion
from apps.telemetry.models import RequestMinute
from apps.tenants import services as tenant_services
from apps.tenants.choices import Priority
from apps.tenants.console import (
    act,
    operators,
    principal_of,
    require,
    signed_in,
    tenant_or_404,
)
from apps.tenants.errors import DomainError
from apps.tenants.models import Tenant
from apps.tenants.shares import weight_of


def _residency(tenant_id: int) -> tuple[list[dict], list[str]]:
    """Per node, how many of the tenant's versions are in L1 (device) and L1+L2 (engine)."""
    rows, problems = [], []
    for node in node_client.configured_nodes():
        try:
            state = node_client.cache_state(node)
        except DomainError as exc:
            problems.append(exc.message)
            continue
        tiers = state.get("tiers", {})
        hot = [r for r in tiers.get("L1", []) if r.get("tenant_id") == tenant_id]
        warm = hot + [r for r in tiers.get("L2", []) if r.get("tenant_id") == tenant_id]
        rows.append(
            {
                "node": node.name,
                "hot": len(hot),
                "warm": len(warm),
                "hot_mb": sum(r.get("size_bytes", 0) for r in hot) / 1048576,
            }
        )
    return rows, problems


@require(signed_in, "signed-in users")
def quota(request: HttpRequest, slug: str) -> HttpResponse:
    principal = principal_of(request)
    tenant = tenant_or_404(principal, slug)
    limits = tenant_services.get_quota(tenant)
    adapters = Adapter.objects.filter(tenant=tenant).annotate(n=Count("versions"))
    counts = adapters.aggregate(adapters=Count("id", distinct=True))
    busiest = adapters.order_by("-n").values("adapter_id", "n").first()
    minute_ago = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=1)
    per_minute = (
        RequestMinute.objects.filter(tenant=tenant, minute__gte=minute_ago)
        .values("minute")
        .annotate(n=Sum("requests"))
        .order_by("-n")
        .values_list("n", flat=True)
        .first()
    ) or 0
    residency, problems = _residency(tenant.id)
    return render(
        request,
        "serving/quota.html",
        {
            "tenant": tenant,
            "limits": limits,
            "adapters": counts["adapters"],
            "busiest": busiest,
            "per_minute": per_minute,
            "residency": residency,
            "node_problems": problems,
            "priorities": Priority.choices,
            "fields": tenant_services.QUOTA_FIELDS,
            "engine_weight": weight_of(tenant.priority, limits.engine_weight),
            "can_edit": principal.is_operator,
            "section": "quota",
        },
    )


@require(operators, "operators")
def nodes_page(request: HttpRequest) -> HttpResponse:
    states = []
    for node in node_client.configured_nodes():
        if node.state == "lost":
            age = node.registered["heartbeat_age_s"] if node.registered else 0
            states.append({"node": node, "error": f"no heartbeat for {age:.0f} s: is it running?"})
            continue
        try:
            state = node_client.cache_state(node)
        except DomainError as exc:
            states.append({"node": node, "error": exc.message})
            continue
        states.append({"node": node, "state": state})
    tenants = Tenant.objects.order_by("slug").values_list("slug", flat=True)
    return render(
        request,
        "serving/nodes.html",
        {
            "states": states,
            "section": "nodes",
            "tenants": list(tenants),
            "routed": bool(settings.LORAHUB_ROUTER_INTERNAL_URL),
            "quarantines": quarantine.listing(),
        },
    )


@require_POST
@require(operators, "operators")
def quarantine_lift(request: HttpRequest, quarantine_id: int) -> HttpResponse:
    """Lift a quarantine once the registry copy verifies again (``quarantine.lift``)."""
    back = reverse("fleet:nodes")
    try:
        outcome = quarantine.lift(
            quarantine_id=quarantine_id,
            principal=principal_of(request),
            note=request.POST.get("note", ""),
        )
    except DomainError as exc:
        messages.error(request, exc.message)
        return redirect(back)
    messages.success(
        request, f"Quarantine lifted on {', '.join(outcome)}: the version verifies again."
    )
    return redirect(back)


@require_POST
@require(operators, "operators")
def alias_action(request: HttpRequest, verb: str) -> HttpResponse:
    """Warm or evict an alias on the node(s) that own it (``node_client.alias_action``)."""
    back = reverse("fleet:nodes")
    tier, slug, name = (request.POST.get(k, "").strip() for k in ("tier", "tenant", "alias"))
    if verb not in ("warm", "evict") or tier not in node_client.TIERS:
        raise Http404("no such alias action")
    try:
        outcome = services.act_on_alias(
            tenant_slug=slug, alias=name, verb=verb, tier=tier, actor=principal_of(request).user
        )
    except DomainError as exc:
        messages.error(request, exc.message)
        return redirect(back)
    failed = [f"{r['node']}: {r['error']}" for r in outcome if "error" in r]
    reached = sorted({r["node"] for r in outcome if "error" not in r})
    if reached:
        done = "warmed into" if verb == "warm" else "evicted from"
        messages.success(request, f"{slug}/{name} {done} {tier} on {', '.join(reached)}.")
    if failed:
        messages.error(request, "Not done on " + "; ".join(failed))
    return redirect(back)


@require_POST
@require(operators, "operators")
def node_action(request: HttpRequest, node: str, verb: str) -> HttpResponse:
    back = reverse("fleet:nodes")
    tier = request.POST.get("tier", "")
    try:
        target = node_client.node_named(node)
        version_id = int(request.POST.get("version_id", ""))
    except (ValueError, DomainError):
        messages.error(request, "choose a node and a version id (a whole number)")
        return redirect(back)
    if tier not in node_client.TIERS or verb not in ("warm", "evict"):
        raise Http404("no such node action")
    version = AdapterVersion.objects.select_related("adapter__tenant").filter(pk=version_id).first()
    if version is None:
        messages.error(request, f"there is no version {version_id}")
        return redirect(back)

    def run() -> None:
        services.act_on_node(
            node=target, version=version, verb=verb, tier=tier, actor=principal_of(request).user
        )

    label = f"{version.adapter.adapter_id}@{version.version}"
    done = (
        f"{label} warmed into {tier} on {target.name}."
        if verb == "warm"
        else f"{label} evicted from {tier} on {target.name}."
    )
    return act(request, run, done, back)
