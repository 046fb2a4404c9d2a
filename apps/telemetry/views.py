"""Console pages of the telemetry: the tenant's and the operator's dashboards and the
data behind their charts."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse

from apps.registry.models import Adapter
from apps.telemetry import charts, dashboards, usage
from apps.telemetry.engine_share import engine_share
from apps.tenants import services as tenant_services
from apps.tenants.console import (
    operators,
    principal_of,
    require,
    signed_in,
    tenant_or_404,
)
from apps.tenants.errors import Invalid


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
            "data_url": reverse("telemetry:dashboard_data", args=[tenant.slug]),
            "charts": [
                "chart-ttft",
                "chart-hits",
                "chart-requests",
                "chart-outcomes",
                "chart-quality",
                "chart-engine-share",
                "chart-queue",
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
        **charts.engine(data, engine_share(tenant, rng)),
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
            "data_url": reverse("telemetry:operator_dashboard_data"),
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


def _month(request: HttpRequest, tenant_ids, stack: str) -> dict:
    try:
        return usage.month_summary(request.GET.get("month"), tenant_ids, stack)
    except Invalid as exc:
        raise Http404(exc.message) from None


def _usage_page(request: HttpRequest, tenant, summary: dict, stack: str) -> HttpResponse:
    return render(
        request,
        "serving/usage.html",
        {
            "tenant": tenant,
            "summary": summary,
            "figure": charts.usage(summary["days"], summary["stacks"], stack),
            "csv_url": (
                reverse("telemetry:usage_csv", args=[tenant.slug])
                if tenant
                else reverse("telemetry:operator_usage_csv")
            ),
            "section": "usage" if tenant else "operator_usage",
        },
    )


def _csv(summary: dict, name: str) -> HttpResponse:
    response = HttpResponse(
        usage.to_csv(summary["query"], summary["rows"]), content_type="text/csv"
    )
    response["Content-Disposition"] = (
        f'attachment; filename="usage-{name}-{summary["month"]:%Y-%m}.csv"'
    )
    return response


@require(signed_in, "signed-in users")
def tenant_usage(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_or_404(principal_of(request), slug)
    return _usage_page(request, tenant, _month(request, [tenant.id], "alias"), "alias")


@require(signed_in, "signed-in users")
def tenant_usage_csv(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_or_404(principal_of(request), slug)
    return _csv(_month(request, [tenant.id], "alias"), tenant.slug)


@require(operators, "operators")
def operator_usage(request: HttpRequest) -> HttpResponse:
    return _usage_page(request, None, _month(request, None, "tenant"), "tenant")


@require(operators, "operators")
def operator_usage_csv(request: HttpRequest) -> HttpResponse:
    return _csv(_month(request, None, "tenant"), "all-tenants")
