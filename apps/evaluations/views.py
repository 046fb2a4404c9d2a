"""Console pages of evaluations: start a run from a version's page, read a run."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.evaluations import services
from apps.evaluations.api import visible_revisions, visible_runs
from apps.registry.models import AdapterVersion
from apps.telemetry.quality import side_by_side
from apps.tenants.console import principal_of, require, signed_in
from apps.tenants.errors import DomainError, Invalid


@require(signed_in, "signed-in users")
@require_POST
def start(request: HttpRequest, version_id: int) -> HttpResponse:
    """The version page's "Evaluate against the current stable": the picked set revision,
    the candidate against what the adapter's alias serves now; then the run's page."""
    principal = principal_of(request)
    version = AdapterVersion.objects.visible_to(principal).filter(pk=version_id).first()
    if version is None:
        raise Http404(f"no adapter version {version_id} that you can see")
    revision = (
        visible_revisions(principal)
        .filter(pk=request.POST.get("set_revision_id") or 0, set__adapter=version.adapter)
        .first()
    )
    try:
        if revision is None:
            raise Invalid("pick an evaluation set of this adapter")
        run = services.start_run(principal=principal, candidate=version, set_revision=revision)
    except DomainError as exc:
        messages.error(request, exc.message)
        return redirect("registry:version", version_id)
    messages.success(request, f"Evaluation of {version.label} against {run.baseline.label} queued")
    return redirect("evaluations:run", run.pk)


@require(signed_in, "signed-in users")
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = visible_runs(principal_of(request)).filter(pk=run_id).first()
    if run is None:
        raise Http404(f"no evaluation run {run_id} that you can see")
    results = run.results.all()
    show = request.GET.get("show", "all")
    if show == "failed":
        results = results.filter(candidate_passed=False)
    elif show == "changed":
        results = results.filter(exact_match=False)
    rows = []
    for result in results:
        baseline, candidate = side_by_side(result.baseline_output, result.candidate_output)
        rows.append({"result": result, "baseline": baseline, "candidate": candidate})
    return render(
        request,
        "evaluations/run.html",
        {
            "run": run,
            "tenant": run.tenant,
            "rows": rows,
            "show": show,
            "filters": [
                ("all", "All cases"),
                ("failed", "Failed only"),
                ("changed", "Changed only"),
            ],
            "running": run.state in ("queued", "running"),
            "section": "adapters",
        },
    )
