"""Console pages of the serving side: the overview, quota usage, dashboards, the cache
configuration and the nodes' live cache state.

Node state is read server-side from each node's internal API (``node_client.py``) with the internal
token; the browser never talks to a node.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib import messages
from django.db.models import Count, Sum
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.registry.choices import VersionState
from apps.registry.models import Adapter, AdapterVersion, Alias
from apps.serving import config, quarantine, services
from apps.serving.cache.policies import POLICIES
from apps.serving.console import charts, dashboards, node_client
from apps.serving.models import RequestMinute
from apps.tenants import services as tenant_services
from apps.tenants.choices import Priority
from apps.tenants.console import (
    act,
    operators,
    principal_of,
    require,
    second_factor_page,
    signed_in,
    tenant_or_404,
)
from apps.tenants.errors import DomainError, Invalid, SecondFactorRequired
from apps.tenants.models import Membership, Tenant
from lorahub.cacheconfig import config_problems

# Cache-config keys that are not edited in the form (carried over as they are).
FIXED_KEYS = ("adapter_cache.placement.key_fields", "adapter_cache.disk_cache.path")
CHOICES = {
    "adapter_cache.gpu_hot.eviction_policy": POLICIES,
    "on_overload": ("wait", "degrade", "reject"),
}
RESTART_KEYS = (
    "base_model",
    "base_model_revision",
    "adapter_cache.gpu_hot.max_adapters",
    "adapter_cache.gpu_hot.max_lora_rank",
    "adapter_cache.cpu_warm.max_adapters",
)


# --- overview ----------------------------------------------------------------------------------


@require(signed_in, "signed-in users")
def home(request: HttpRequest) -> HttpResponse:
    principal = principal_of(request)
    memberships = list(
        Membership.objects.filter(user=principal.user)
        .select_related("tenant")
        .order_by("tenant__slug")
    )
    tenant_ids = [m.tenant_id for m in memberships]
    adapters = dict(
        Adapter.objects.filter(tenant_id__in=tenant_ids)
        .values("tenant_id")
        .annotate(n=Count("id"))
        .values_list("tenant_id", "n")
    )
    aliases = dict(
        Alias.objects.filter(tenant_id__in=tenant_ids)
        .values("tenant_id")
        .annotate(n=Count("id"))
        .values_list("tenant_id", "n")
    )
    since = datetime.now(UTC) - timedelta(hours=24)
    traffic = dict(
        RequestMinute.objects.filter(tenant_id__in=tenant_ids, minute__gte=since)
        .values("tenant_id")
        .annotate(n=Sum("requests"))
        .values_list("tenant_id", "n")
    )
    rows = [
        {
            "membership": m,
            "adapters": adapters.get(m.tenant_id, 0),
            "aliases": aliases.get(m.tenant_id, 0),
            "requests_24h": traffic.get(m.tenant_id, 0),
        }
        for m in memberships
    ]
    pending = None
    if principal.is_reviewer:
        pending = (
            AdapterVersion.objects.filter(state=VersionState.PENDING_REVIEW)
            .exclude(adapter__tenant_id__in=principal.tenant_ids)
            .count()
        )
    return render(
        request,
        "serving/home.html",
        {
            "rows": rows,
            "pending": pending,
            "nodes": node_client.configured_nodes(),
            "section": "home",
        },
    )


# --- quota usage -------------------------------------------------------------------------------


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
            "can_edit": principal.is_operator,
            "section": "quota",
        },
    )


# --- dashboards --------------------------------------------------------------------------------


def _range(request: HttpRequest, where=dashboards.PLATFORM) -> dashboards.Range:
    """The range asked for; without one, the range that holds the data (``where``'s)."""
    asked = dashboards.RANGES.get(request.GET.get("range", ""))
    return asked or dashboards.default_range(where)


@require(signed_in, "signed-in users")
def tenant_dashboard(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_or_404(principal_of(request), slug)
    where = dashboards.scope(tenant=tenant, adapter_id=request.GET.get("adapter", ""))
    adapter_ids = list(
        Adapter.objects.filter(tenant=tenant)
        .order_by("adapter_id")
        .values_list("adapter_id", flat=True)
    )
    return render(
        request,
        "serving/dashboard.html",
        {
            "tenant": tenant,
            "adapter_ids": adapter_ids,
            "adapter": request.GET.get("adapter", ""),
            "ranges": dashboards.RANGES.values(),
            "range": _range(request, where).key,
            "data_url": reverse("serving:dashboard_data", args=[tenant.slug]),
            "charts": [
                "chart-ttft",
                "chart-hits",
                "chart-requests",
                "chart-outcomes",
                "chart-quality",
                "chart-loads",
                "chart-cache",
            ],
            "section": "dashboard",
        },
    )


@require(signed_in, "signed-in users")
def tenant_dashboard_data(request: HttpRequest, slug: str) -> JsonResponse:
    tenant = tenant_or_404(principal_of(request), slug)
    adapter_id = request.GET.get("adapter", "")
    where = dashboards.scope(tenant=tenant, adapter_id=adapter_id)
    rng = _range(request, where)
    data = dashboards.series(where, rng)
    quota = tenant_services.get_quota(tenant)
    figures = {
        **charts.timeline(data),
        "chart-cache": charts.cache(
            dashboards.cache_series(rng, tenant=tenant),
            hot_quota=quota.max_hot_adapters,
            warm_quota=quota.max_warm_adapters,
        ),
    }
    versions = (
        dashboards.by_version(rng, tenant=tenant, adapter_id=adapter_id) if adapter_id else []
    )
    return JsonResponse(
        {"figures": figures, "totals": data["totals"], "versions": versions, "range": rng.key}
    )


@require(operators, "operators")
def operator_dashboard(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "serving/dashboard.html",
        {
            "tenant": None,
            "ranges": dashboards.RANGES.values(),
            "range": _range(request).key,
            "data_url": reverse("serving:operator_dashboard_data"),
            "charts": [
                "chart-fairness",
                "chart-ttft",
                "chart-hits",
                "chart-requests",
                "chart-outcomes",
                "chart-quality",
                "chart-loads",
            ],
            "section": "operator_dashboard",
        },
    )


@require(operators, "operators")
def operator_dashboard_data(request: HttpRequest) -> JsonResponse:
    rng = _range(request)
    data = dashboards.series(dashboards.scope(), rng)
    fair = dashboards.fairness(rng)
    return JsonResponse(
        {
            "figures": {
                **charts.fairness(fair),
                **charts.timeline(data),
                "chart-cache": charts.cache(dashboards.cache_series(rng)),
            },
            "totals": data["totals"],
            "tenants": fair,
            "range": rng.key,
        }
    )


# --- cache configuration -----------------------------------------------------------------------


def _leaves(data: dict, prefix: str = "") -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out += _leaves(value, f"{path}.")
        else:
            out.append((path, value))
    return out


def _set(data: dict, path: str, value: object) -> None:
    *parents, last = path.split(".")
    for part in parents:
        data = data.setdefault(part, {})
    data[last] = value


def _parse(raw: str, current: object) -> object:
    """A form value in the type of the current value; left as text when it does not parse,
    so that validation names the field and says what it expects."""
    raw = raw.strip()
    if isinstance(current, bool):
        return raw == "on"
    if isinstance(current, int):
        try:
            return int(raw)
        except ValueError:
            return raw
    if isinstance(current, float):
        try:
            return float(raw)
        except ValueError:
            return raw
    if isinstance(current, list):
        return [item.strip() for item in raw.split(",") if item.strip()]
    return raw


def _fields(values: dict, errors: dict[str, str], restart: list[str]) -> list[dict]:
    fields = []
    for path, value in _leaves(values):
        if path in FIXED_KEYS:
            continue
        choices = CHOICES.get(path) or CHOICES.get(path.rsplit(".", 1)[-1])
        kind = (
            "checkbox"
            if isinstance(value, bool)
            else "select"
            if choices
            else "number"
            if isinstance(value, int | float)
            else "text"
        )
        fields.append(
            {
                "path": path,
                "section": path.rsplit(".", 1)[0] if "." in path else "model",
                "label": path.rsplit(".", 1)[-1].replace("_", " "),
                "value": ", ".join(value) if isinstance(value, list) else value,
                "kind": kind,
                "choices": choices,
                "step": "any" if isinstance(value, float) else "1",
                "error": errors.get(path),
                "restart": path in RESTART_KEYS,
                "needs_restart": path in restart,
            }
        )
    return fields


@require(operators, "operators")
def cache_config(request: HttpRequest) -> HttpResponse:
    current = config.effective_config().model_dump(mode="json")
    errors: dict[str, str] = {}
    restart: list[str] = []
    values = current
    status = 200
    if request.method == "POST":
        values = {}
        for path, value in _leaves(current):
            raw = value if path in FIXED_KEYS else _parse(request.POST.get(path, ""), value)
            _set(values, path, raw)
        errors = config_problems(values)
        if errors:
            status = 422
            messages.error(request, "Nothing was saved: fix the fields marked below.")
        else:
            try:
                _, restart = config.set_config(data=values, principal=principal_of(request))
            except SecondFactorRequired as exc:
                return second_factor_page(request, exc)
            except Invalid as exc:  # validated above; a race with another operator's change
                messages.error(request, exc.message)
                status = 422
            else:
                messages.success(
                    request,
                    "Saved. Nodes apply it at once"
                    + (
                        f", except {', '.join(restart)}: that needs a node restart."
                        if restart
                        else "."
                    ),
                )
    return render(
        request,
        "serving/cache_config.html",
        {
            "fields": _fields(values, errors, restart),
            "restart": restart,
            "section": "cache",
        },
        status=status,
    )


# --- nodes -------------------------------------------------------------------------------------


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
    back = reverse("serving:nodes")
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
    back = reverse("serving:nodes")
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
    back = reverse("serving:nodes")
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
