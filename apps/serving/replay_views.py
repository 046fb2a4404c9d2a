"""The operator's replay page: start a replay (a Celery task), watch it, compare policies,
and apply the chosen policy and capacities to the cache configuration."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from django import forms
from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.serving import config, services
from apps.serving.cache.policies import POLICIES
from apps.serving.models import ReplayRun
from apps.serving.replay import run
from apps.serving.replay.simulate import Capacity
from apps.telemetry import charts
from apps.telemetry.requestlog import costs_from_log
from apps.tenants.console import operators, principal_of, require, second_factor_page
from apps.tenants.errors import Invalid, SecondFactorRequired

GIB = run.GIB
AZURE = "azure-llm-2023-conv.csv"
logger = logging.getLogger(__name__)


def azure_trace() -> Path | None:
    path = Path(settings.LORAHUB_TRACES_DIR) / AZURE
    return path if path.is_file() else None


def source_choices() -> list[tuple[str, str]]:
    choices = [
        ("zipf", "Synthetic: independent Zipf"),
        ("shift", "Synthetic: shifting hot set"),
        ("bursty", "Synthetic: bursty on/off"),
        ("scan", "Synthetic: Zipf with a scan of one-off adapters"),
        ("db", "This platform's request log"),
    ]
    if azure_trace():
        choices.insert(0, ("azure", "Azure LLM conversation trace (1 h, 19,366 requests)"))
    return choices


class ReplayForm(forms.Form):
    source = forms.ChoiceField(choices=())
    since_hours = forms.FloatField(
        initial=24, min_value=0.1, max_value=24 * 90, label="Log window (hours)"
    )
    alpha = forms.FloatField(initial=1.0, min_value=0.1, max_value=3.0, label="Zipf exponent")
    drift = forms.FloatField(
        initial=0.2, min_value=0.0, max_value=1.0, label="Rank drift per 10 min"
    )
    adapters = forms.IntegerField(initial=1000, min_value=2, max_value=100_000)
    tenants = forms.IntegerField(initial=30, min_value=1, max_value=10_000)
    sizes = forms.ChoiceField(
        choices=[("uniform", "uniform (27 MB)"), ("mixed", "mixed ranks 8-64")]
    )
    seed = forms.IntegerField(initial=7, min_value=0)
    requests = forms.IntegerField(
        initial=50_000, min_value=100, max_value=500_000, label="Requests (synthetic)"
    )
    policies = forms.MultipleChoiceField(
        choices=[(p, p) for p in POLICIES],
        initial=list(POLICIES),
        widget=forms.CheckboxSelectMultiple,
    )
    l1 = forms.IntegerField(min_value=1, max_value=4096, label="L1 device slots")
    l2 = forms.IntegerField(min_value=1, max_value=65_536, label="L2 engine slots")
    l2_gb = forms.FloatField(min_value=0, max_value=4096, label="L2 memory (GB, 0: no cap)")
    l3_gb = forms.FloatField(min_value=0, max_value=100_000, label="L3 disk (GB, 0: no cap)")
    warm_disk = forms.BooleanField(
        required=False,
        initial=False,
        label="Start with every version on disk (a prewarmed node)",
    )
    sweep = forms.BooleanField(
        required=False, initial=True, label="Sweep L2 capacity (4-256 slots)"
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        source = self.fields["source"]
        assert isinstance(source, forms.ChoiceField)
        source.choices = source_choices()

    FIELDSETS = (
        (
            "Traffic",
            (
                "source",
                "since_hours",
                "alpha",
                "drift",
                "adapters",
                "tenants",
                "sizes",
                "seed",
                "requests",
            ),
        ),
        ("Tiers and policies", ("l1", "l2", "l2_gb", "l3_gb", "warm_disk", "sweep", "policies")),
    )

    def fieldsets(self) -> list[tuple[str, list]]:
        return [(legend, [self[name] for name in names]) for legend, names in self.FIELDSETS]

    def clean(self):
        data = super().clean()
        if data.get("l1") and data.get("l2") and data["l1"] > data["l2"]:
            self.add_error(
                "l1", "L1 slots cannot exceed L2 slots: every device slot is in the engine"
            )
        return data

    def spec(self) -> run.Spec:
        d = self.cleaned_data
        source = d["source"]
        trace = run.TraceSpec(
            source="csv" if source == "azure" else source,
            path=str(azure_trace()) if source == "azure" else "",  # chosen here, never sent
            since_hours=d["since_hours"],
            alpha=d["alpha"],
            drift=d["drift"],
            adapters=d["adapters"],
            tenants=d["tenants"],
            sizes=d["sizes"],
            seed=d["seed"],
            requests=d["requests"],
        )
        capacity = dataclasses.replace(
            run.capacity_from_config(),
            l1_slots=d["l1"],
            l2_slots=d["l2"],
            l2_bytes=int(d["l2_gb"] * GIB) or None,
            l3_bytes=int(d["l3_gb"] * GIB) or None,
            warm_disk=d["warm_disk"],
        )
        sweep = tuple(v for v in run.L2_SWEEP if v >= d["l1"]) if d["sweep"] else ()
        policies = tuple(p for p in POLICIES if p in d["policies"])  # the default first
        # load costs as the nodes measured them where they have (else the bench's)
        costs = costs_from_log(since_hours=max(d["since_hours"], 24.0))
        return run.Spec(
            trace=trace, policies=policies, capacity=capacity, costs=costs, sweep_l2=sweep
        )


def _initial() -> dict:
    capacity = run.capacity_from_config()
    return {
        "source": "azure" if azure_trace() else "zipf",
        "l1": capacity.l1_slots,
        "l2": capacity.l2_slots,
        "l2_gb": round((capacity.l2_bytes or 0) / GIB, 3),
        "l3_gb": round((capacity.l3_bytes or 0) / GIB, 3),
    }


@require(operators, "operators")
def replay_page(request: HttpRequest) -> HttpResponse:
    status = 200
    if request.method == "POST":
        form = ReplayForm(request.POST)
        if form.is_valid():
            row = services.start_replay(
                spec=form.spec().to_json(), actor=principal_of(request).user
            )
            if row.state == ReplayRun.State.FAILED:
                messages.error(request, row.error)
            return redirect("serving:replay_run", run_id=row.pk)
        messages.error(request, "Nothing was started: fix the fields marked below.")
        status = 422
    else:
        form = ReplayForm(initial=_initial())
    runs = ReplayRun.objects.select_related("created_by").defer("report")[:20]
    return render(
        request,
        "serving/replay.html",
        {"form": form, "runs": runs, "section": "replay"},
        status=status,
    )


def _run_or_404(run_id: int) -> ReplayRun:
    return get_object_or_404(ReplayRun, pk=run_id)


@require(operators, "operators")
def replay_run(request: HttpRequest, run_id: int) -> HttpResponse:
    row = _run_or_404(run_id)
    report = row.report or {}
    rows = charts.replay_runs(report) if report else []
    tenants = _tenant_rows(report, rows) if rows else []
    return render(
        request,
        "serving/replay_run.html",
        {
            "run": row,
            "report": report,
            "rows": rows,
            "tenants": tenants,
            "best": report.get("optimum", {}),
            "section": "replay",
        },
    )


def _tenant_rows(report: dict, runs: list[dict], limit: int = 15) -> list[dict]:
    """The busiest tenants' hit rate and p95 TTFT under each policy (for fairness)."""
    first = runs[0]["tenants"]
    busiest = sorted(first, key=lambda t: -first[t]["requests"])[:limit]
    names, priorities = report.get("tenant_names", {}), report.get("tenant_priorities", {})
    return [
        {
            "name": names.get(tenant, f"t{tenant}"),
            "priority": priorities.get(tenant, ""),
            "requests": first[tenant]["requests"],
            "cells": [run["tenants"].get(tenant, {}) for run in runs],
        }
        for tenant in busiest
    ]


@require(operators, "operators")
def replay_data(request: HttpRequest, run_id: int) -> JsonResponse:
    row = _run_or_404(run_id)
    body = {"state": row.state, "progress": row.progress, "step": row.step, "error": row.error}
    if row.state == ReplayRun.State.DONE and row.report:
        body["figures"] = charts.replay(row.report)
    return JsonResponse(body)


@require_POST
@require(operators, "operators")
def replay_apply(request: HttpRequest, run_id: int) -> HttpResponse:
    """Set the cache configuration's policy and capacities to what this run replayed."""
    row = _run_or_404(run_id)
    back = reverse("serving:replay_run", kwargs={"run_id": row.pk})
    policy = request.POST.get("policy", "")
    if row.state != ReplayRun.State.DONE or policy not in (row.report or {}).get("policies", {}):
        messages.error(request, "Pick one of this finished run's policies to apply.")
        return redirect(back)
    capacity = Capacity(**{**row.spec["capacity"], "warm_quotas": {}})
    data = config.effective_config().model_dump(mode="json")
    cache = data["adapter_cache"]
    cache["gpu_hot"]["eviction_policy"] = policy
    cache["gpu_hot"]["max_adapters"] = capacity.l1_slots
    cache["cpu_warm"]["max_adapters"] = capacity.l2_slots
    if capacity.l2_bytes:
        cache["cpu_warm"]["max_memory_gb"] = round(capacity.l2_bytes / GIB, 3)
    if capacity.l3_bytes:
        cache["disk_cache"]["max_size_gb"] = round(capacity.l3_bytes / GIB, 3)
    try:
        _, restart = config.set_config(data=data, principal=principal_of(request))
    except SecondFactorRequired as exc:
        return second_factor_page(request, exc)
    except Invalid as exc:
        messages.error(request, f"Nothing was changed: {exc.message}")
        return redirect(back)
    messages.success(
        request,
        f"The cache configuration now uses {policy} with {capacity.describe()}. Nodes apply it "
        "at once"
        + (f", except {', '.join(restart)}: that needs a node restart." if restart else "."),
    )
    return redirect(reverse("serving:cache_config"))
