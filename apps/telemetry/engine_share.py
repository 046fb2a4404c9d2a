"""A tenant's share of the engine per time step, against its weight: what the nodes' fair
admission (``apps/serving/fairness.py``) promises a tenant that keeps the engine busy.

The service is counted as the scheduler counts it: input tokens once, output tokens twice.
A tenant's fair share in a step is its weight over the weights of the tenants served in
that step (today's weights: tier times the operator's engine weight). A tenant that asks for
less than its share gets what it asks for; one that floods gets at least its share.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from django.db.models import Q, Sum

from apps.telemetry.dashboards import Range, _aware, _floor, _source
from apps.tenants.models import Quota, Tenant
from apps.tenants.shares import weight_of

INPUT_WEIGHT, OUTPUT_WEIGHT = 1, 2  # as FairQueue's defaults


def engine_share(tenant: Tenant, rng: Range, *, now: datetime | None = None) -> dict:
    """Per step where ``tenant`` was served: its share of every tenant's service, and its
    weighted fair share among the tenants served then."""
    end = now or datetime.now(UTC)
    qs, field = _source(rng, _floor(end - rng.span, rng.step), Q(tenant__isnull=False))
    served: dict[datetime, dict[int, float]] = defaultdict(dict)
    rows = qs.values(field, "tenant_id").annotate(
        p=Sum("prompt_tokens"), c=Sum("completion_tokens")
    )
    for row in rows:
        service = INPUT_WEIGHT * (row["p"] or 0) + OUTPUT_WEIGHT * (row["c"] or 0)
        if service:
            served[_aware(row[field])][row["tenant_id"]] = service
    present = {tid for step in served.values() for tid in step}
    priorities = dict(Tenant.objects.filter(pk__in=present).values_list("pk", "priority"))
    engine = dict(
        Quota.objects.filter(tenant__in=present).values_list("tenant_id", "engine_weight")
    )
    weights = {tid: weight_of(priorities[tid], engine.get(tid, 100)) for tid in present}
    out: dict[str, list] = {"t": [], "share": [], "fair": []}
    for t, step in sorted(served.items()):
        if tenant.pk not in step:
            continue
        out["t"].append(t.isoformat())
        out["share"].append(round(step[tenant.pk] / sum(step.values()), 4))
        out["fair"].append(round(weights[tenant.pk] / sum(weights[tid] for tid in step), 4))
    return out
