"""Read-side services of the telemetry for pages other apps own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db.models import Sum

from apps.telemetry.models import RequestMinute


def requests_per_tenant(tenant_ids: list[int], *, hours: float = 24) -> dict[int, int]:
    """Requests per tenant over the last ``hours``, from the minute rollups."""
    since = datetime.now(UTC) - timedelta(hours=hours)
    return dict(
        RequestMinute.objects.filter(tenant_id__in=tenant_ids, minute__gte=since)
        .values("tenant_id")
        .annotate(n=Sum("requests"))
        .values_list("tenant_id", "n")
    )
