"""``lorahub eval``: evaluation sets and runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lorahub_client.cli.output import Json, emit, handles_errors, say, table
from lorahub_client.cli.session import client
from lorahub_client.errors import NotFound, Unavailable
from lorahub_client.models import EvaluationRun

eval_app = typer.Typer(help="Evaluation sets and runs.", no_args_is_help=True)


def show_run(run: EvaluationRun) -> None:
    summary = run.summary or {}
    rows = [["state", f"{run.state} ({run.cases_done}/{run.cases_total} cases)"]]
    for side in ("candidate", "baseline"):
        rate = (summary.get(side) or {}).get("pass_rate")
        label = run.candidate if side == "candidate" else run.baseline
        rows.append([f"{side} pass rate", f"{label}: {rate if rate is not None else '—'}"])
    for key in ("agreement", "mean_similarity"):
        if key in summary:
            rows.append([key.replace("_", " "), summary[key]])
    if run.error:
        rows.append(["error", run.error])
    table(f"evaluation run {run.id} · {run.set}", ["", ""], rows)


@eval_app.command("sets")
@handles_errors
def eval_sets(
    ctx: typer.Context,
    adapter: Annotated[str, typer.Option("--adapter", "-a")],
    as_json: Json = False,
) -> None:
    """An adapter's evaluation sets, each with its latest revision."""
    found = client(ctx).evaluation_sets(adapter)
    emit(as_json, found)
    if not as_json:
        rows = [[s.name, s.latest.revision, s.latest.id, s.latest.case_count] for s in found]
        table("evaluation sets", ["set", "revision", "revision id", "cases"], rows)


@eval_app.command("push-set")
@handles_errors
def eval_push_set(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JSONL cases.")],
    adapter: Annotated[str, typer.Option("--adapter", "-a")],
    name: Annotated[str, typer.Option("--name", help="The set's name.")],
    as_json: Json = False,
) -> None:
    """Attach a JSONL evaluation set (its next immutable revision)."""
    found = client(ctx).upload_evaluation_set(adapter, name, file)
    emit(as_json, found)
    if not as_json:
        say(f"{name} revision {found.revision} (id {found.id}): {found.case_count} cases")


@eval_app.command("run")
@handles_errors
def eval_run(
    ctx: typer.Context,
    version: Annotated[str, typer.Argument(help="The candidate: id or adapter@version.")],
    set_name: Annotated[str, typer.Option("--set", help="The set (its latest revision).")],
    adapter: Annotated[str | None, typer.Option("--adapter", "-a")] = None,
    baseline: Annotated[
        str | None, typer.Option(help="Default: what the adapter's alias serves now.")
    ] = None,
    alias: Annotated[str | None, typer.Option(help="Compare with what this alias serves.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the run to its end.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds --wait waits at most.")] = 1800.0,
    as_json: Json = False,
) -> None:
    """Compare a candidate with the baseline on a set, on a serving node."""
    api = client(ctx)
    candidate = api.find_version(version, adapter_id=adapter)
    sets = {s.name: s for s in api.evaluation_sets(candidate.adapter_id)}
    if set_name not in sets:
        names = ", ".join(sorted(sets)) or "none yet: `lorahub eval push-set`"
        raise NotFound(
            404, "not_found", f"{candidate.adapter_id} has no set '{set_name}' ({names})"
        )
    base = api.find_version(baseline, adapter_id=candidate.adapter_id).id if baseline else None
    run = api.start_evaluation(
        candidate.id, sets[set_name].latest.id, baseline_version_id=base, alias=alias
    )
    if not as_json:
        say(f"evaluation run {run.id}: {run.candidate} against {run.baseline}")
    if wait:
        run = api.wait_for_evaluation(run.id, timeout=timeout)
    emit(as_json, run)
    if not as_json:
        show_run(run)
    if run.state == "failed":
        raise Unavailable(f"evaluation run {run.id} failed: {run.error}")


@eval_app.command("show")
@handles_errors
def eval_show(
    ctx: typer.Context,
    run_id: int,
    cases: Annotated[bool, typer.Option("--cases", help="Each case's two answers too.")] = False,
    failed: Annotated[bool, typer.Option("--failed", help="Cases the candidate failed.")] = False,
    changed: Annotated[bool, typer.Option("--changed", help="Cases whose answers differ.")] = False,
    as_json: Json = False,
) -> None:
    """A run's state and summary (and cases)."""
    api = client(ctx)
    run = api.evaluation(run_id)
    results = (
        api.evaluation_cases(run_id, failed=failed, changed=changed)
        if cases or failed or changed
        else None
    )
    if as_json:
        payload = run.model_dump(mode="json")
        if results is not None:
            payload["cases"] = [c.model_dump(mode="json") for c in results]
        emit(True, payload)
        return
    show_run(run)
    if results is not None:
        table(
            "cases",
            ["case", "candidate", "baseline", "passed", "similarity"],
            [
                [
                    c.case_id or c.index,
                    c.candidate_output[:60],
                    c.baseline_output[:60],
                    f"{'✓' if c.candidate_passed else '✗'} / {'✓' if c.baseline_passed else '✗'}",
                    f"{c.similarity:.2f}",
                ]
                for c in results
            ],
        )
