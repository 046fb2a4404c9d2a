"""The console's endpoints for machines: ``/healthz`` for load balancers and Kubernetes'
probes (200 while this process reaches its database, 503 otherwise; anonymous, and it says
nothing more), and ``/metrics`` for Prometheus (the platform's state, from the database).

A middleware, first in the chain, not views: probes and scrapers call a pod by its address,
which is no host name in ``LORAHUB_ALLOWED_HOSTS``, over plain HTTP, which production
redirects to HTTPS. Every other path still goes through both checks.

``/metrics`` names tenants' versions and releases by count only, and still needs the internal
token (``Authorization: Bearer``), as the nodes' does; with no token set (the embedded
default) only this machine may read it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from django.conf import settings
from django.db import connection
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from lorahub.tokens import bearer_matches

logger = logging.getLogger(__name__)


def database_answers() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:
        logger.warning("healthz: the database does not answer", exc_info=True)
        return False
    return True


class PlatformCollector:
    """Gauges read from the database at each scrape, so every console process (gunicorn's
    workers, several pods) answers the same numbers."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from apps.fleet import node_registry
        from apps.fleet.models import Quarantine
        from apps.registry.models import AdapterVersion
        from apps.releases.models import Release

        nodes = GaugeMetricFamily(
            "lorahub_nodes", "Serving nodes in the registry, by state", labels=["state"]
        )
        by_state: dict[str, int] = dict.fromkeys(node_registry.STATES, 0)
        for node in node_registry.listing():
            by_state[node["state"]] = by_state.get(node["state"], 0) + 1
        for state, count in sorted(by_state.items()):
            nodes.add_metric([state], count)
        yield nodes
        yield _by_state(
            "lorahub_adapter_versions",
            "Adapter versions, by state",
            AdapterVersion.objects.values_list("state").annotate(n=Count("id")),
        )
        yield _by_state(
            "lorahub_releases",
            "Progressive releases, by state (rolled_back counts every rollback so far)",
            Release.objects.values_list("state").annotate(n=Count("id")),
        )
        quarantines = GaugeMetricFamily(
            "lorahub_quarantines_active", "Versions quarantined and not lifted"
        )
        quarantines.add_metric([], Quarantine.objects.filter(lifted_at__isnull=True).count())
        yield quarantines


def _by_state(name: str, documentation: str, rows) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=["state"])
    for state, count in sorted(rows):
        family.add_metric([state], count)
    return family


_registry = CollectorRegistry(auto_describe=False)
_registry.register(PlatformCollector())  # type: ignore[arg-type]


def _may_scrape(request: HttpRequest) -> bool:
    token = settings.LORAHUB_INTERNAL_TOKEN
    if not token:
        return request.META.get("REMOTE_ADDR") in ("127.0.0.1", "::1")
    return bearer_matches(request.headers.get("authorization", ""), token)


class HealthCheckMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method not in ("GET", "HEAD") or request.path not in ("/healthz", "/metrics"):
            return self.get_response(request)
        if request.path == "/metrics":
            if not _may_scrape(request):
                return HttpResponse("metrics need the internal token\n", status=401)
            return HttpResponse(
                generate_latest(_registry), content_type="text/plain; version=0.0.4"
            )
        if database_answers():
            return JsonResponse({"status": "ok"})
        return JsonResponse({"status": "database unavailable"}, status=503)
