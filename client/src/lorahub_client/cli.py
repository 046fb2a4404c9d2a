"""``lorahub``: the tenant's command line.

Exit codes (docs/cli.md): 0 done; 2 usage (a bad flag, a folder that is not an adapter, no
server or key configured); 3 refused or rejected (the server's reason is printed verbatim);
4 not found; 5 the server unavailable (or failing) after the bounded retries, or a wait that
ran out. Every command takes ``--json``: the API's objects on stdout, and on failure
``{"error": {"code", "detail", "status", "exit"}}``; messages go to stderr.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from lorahub_client import __version__, config
from lorahub_client.client import Client, adapter_files, check_file_name
from lorahub_client.errors import (
    ApiError,
    LorahubError,
    NotFound,
    Refused,
    Rejected,
    TimedOut,
    Unavailable,
)
from lorahub_client.models import Alias, EvaluationRun, Release, Version

OK, USAGE, REFUSED, NOT_FOUND, UNAVAILABLE = 0, 2, 3, 4, 5
F = TypeVar("F", bound=Callable[..., Any])

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

app = typer.Typer(
    name="lorahub",
    help="Push adapters, follow their review, move aliases and run evaluations on lorahub.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
versions_app = typer.Typer(help="An adapter's versions.", no_args_is_help=True)
alias_app = typer.Typer(help="Aliases: set, canary, promote, roll back.", no_args_is_help=True)
eval_app = typer.Typer(help="Evaluation sets and runs.", no_args_is_help=True)
keys_app = typer.Typer(help="The tenant's API keys (an admin key).", no_args_is_help=True)
release_app = typer.Typer(
    help="Progressive releases of an alias, judged by the platform (an admin key).",
    no_args_is_help=True,
)
app.add_typer(versions_app, name="versions")
app.add_typer(alias_app, name="alias")
app.add_typer(eval_app, name="eval")
app.add_typer(keys_app, name="keys")
app.add_typer(release_app, name="release")

Json = Annotated[bool, typer.Option("--json", help="Print the API's JSON instead of text.")]
Reason = Annotated[str, typer.Option("--reason", help="Why: kept in the alias history.")]


class State:
    url: str | None = None
    api_key: str | None = None
    retries: int = 3


STATE = State()


@app.callback()
def main_options(
    url: Annotated[
        str | None, typer.Option(help="The control plane, e.g. http://127.0.0.1:8000.")
    ] = None,
    api_key: Annotated[str | None, typer.Option(help="A tenant API key (lh_...).")] = None,
    retries: Annotated[
        int,
        typer.Option(
            envvar="LORAHUB_RETRIES",
            min=0,
            max=10,
            help="Retries on 429/503 and refused connections.",
        ),
    ] = 3,
) -> None:
    STATE.url, STATE.api_key, STATE.retries = url, api_key, retries


def client() -> Client:
    settings = config.resolve(STATE.url, STATE.api_key)
    if not settings.url:
        raise LorahubError("no server: run `lorahub login`, or set LORAHUB_URL")
    if not settings.api_key:
        raise LorahubError("no API key: run `lorahub login`, or set LORAHUB_API_KEY")
    return Client(
        settings.url,
        settings.api_key,
        inference_url=settings.inference_url or None,
        retries=STATE.retries,
    )


def exit_code(error: LorahubError) -> int:
    if isinstance(error, Refused | Rejected):
        return REFUSED
    if isinstance(error, NotFound):
        return NOT_FOUND
    if isinstance(error, Unavailable | TimedOut | ApiError):
        return UNAVAILABLE
    return USAGE


def handles_errors(command: F) -> F:
    """A command's errors as an exit code and a message (and the JSON error with --json);
    never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except LorahubError as error:
            code = exit_code(error)
            if kwargs.get("as_json"):
                body: dict[str, Any] = {
                    "code": getattr(error, "code", "rejected" if code == REFUSED else "error"),
                    "detail": getattr(error, "detail", None)
                    or getattr(error, "reason", None)
                    or error.message,
                    "status": getattr(error, "status", None),
                    "exit": code,
                }
                print(json.dumps({"error": body}))
            err.print(f"error: {error}", markup=False, highlight=False)
            raise typer.Exit(code) from None

    return wrapper  # type: ignore[return-value]


def emit(as_json: bool, data: BaseModel | Sequence[BaseModel] | dict[str, Any]) -> None:
    if isinstance(data, list | tuple):
        payload: Any = [item.model_dump(mode="json", by_alias=True) for item in data]
    elif isinstance(data, BaseModel):
        payload = data.model_dump(mode="json", by_alias=True)
    else:
        payload = data
    if as_json:
        print(json.dumps(payload, indent=2))


def table(title: str, columns: Iterable[str], rows: Iterable[Iterable[Any]]) -> None:
    grid = Table(title=title, title_justify="left")
    for column in columns:
        grid.add_column(column)
    for row in rows:
        grid.add_row(*("—" if v is None or v == "" else str(v) for v in row))
    out.print(grid)


def say(message: str) -> None:
    err.print(message, markup=False, highlight=False)


# --- login -----------------------------------------------------------------------------------


@app.command()
@handles_errors
def login(
    url: Annotated[str, typer.Option(prompt="lorahub URL", help="The control plane's address.")],
    api_key: Annotated[
        str,
        typer.Option(prompt="API key", hide_input=True, envvar="LORAHUB_API_KEY", help="lh_..."),
    ],
    inference_url: Annotated[
        str, typer.Option(help="A node (or the fleet's router) for `lorahub chat`.")
    ] = "",
    as_json: Json = False,
) -> None:
    """Check a URL and key against the server and store them (mode 0600) for later commands."""
    me = Client(url, api_key, retries=STATE.retries).me()
    path = config.save(config.Settings(url=url, api_key=api_key, inference_url=inference_url))
    tenants = ", ".join(f"{m.tenant} ({m.role})" for m in me.tenants)
    emit(
        as_json, {"url": url, "tenants": [m.model_dump() for m in me.tenants], "config": str(path)}
    )
    if not as_json:
        say(f"signed in to {url} for {tenants}; saved to {path}")


# --- push ------------------------------------------------------------------------------------


@app.command()
@handles_errors
def push(
    path: Annotated[
        Path,
        typer.Argument(
            exists=True, help="A PEFT output folder (save_pretrained) or a .zip/.tar.gz."
        ),
    ],
    adapter: Annotated[str, typer.Option("--adapter", "-a", help="The adapter's id.")],
    version: Annotated[
        str | None, typer.Option(help="The version string (default: the server picks one).")
    ] = None,
    base_model_revision: Annotated[str, typer.Option(help="The base model's revision.")] = "",
    summary: Annotated[str, typer.Option(help="What it was trained on, for reviewers.")] = "",
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow validation to pending review (or rejection).")
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds --wait waits at most.")] = 600.0,
    as_json: Json = False,
) -> None:
    """Upload an adapter as a new immutable version."""
    if path.is_dir():
        chosen, skipped = adapter_files(path)
        if skipped:
            say(f"leaving out {', '.join(skipped)} (not part of an adapter upload)")
        total = sum(p.stat().st_size for p in chosen)
    else:
        total = path.stat().st_size
    api = client()
    with Progress(
        TextColumn("uploading"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        transient=True,
        disable=as_json or not err.is_terminal,
    ) as bar:
        task = bar.add_task("upload", total=total)
        found = api.upload(
            adapter,
            path,
            version=version,
            base_model_revision=base_model_revision,
            training_data_summary=summary,
            progress=lambda done, _: bar.update(task, completed=done),
        )
    if not as_json:
        say(f"uploaded {found.label} (id {found.id}); validating")
    if wait:
        with err.status("validating", spinner="dots") if not as_json else nullcontext():
            found = api.wait_for_verdict(found.id, timeout=timeout)
        if not as_json:
            say(f"{found.label} (id {found.id}) is {found.state.replace('_', ' ')}")
    emit(as_json, found)
    if not as_json and not wait:
        out.print(f"{found.id}")


# --- versions --------------------------------------------------------------------------------


def version_rows(found: list[Version]) -> list[list[Any]]:
    return [
        [v.id, v.label, v.state, v.rank, v.uploaded_by, v.created_at.strftime("%Y-%m-%d %H:%M")]
        for v in found
    ]


@versions_app.command("list")
@handles_errors
def versions_list(
    adapter: Annotated[str | None, typer.Option("--adapter", "-a")] = None,
    state: Annotated[
        str | None, typer.Option(help="validating, pending_review, approved, rejected…")
    ] = None,
    as_json: Json = False,
) -> None:
    """Versions you can see (of one adapter with --adapter)."""
    found = client().versions(adapter, state=state)
    emit(as_json, found)
    if not as_json:
        table("versions", ["id", "version", "state", "rank", "by", "uploaded"], version_rows(found))


@versions_app.command("show")
@handles_errors
def versions_show(
    ref: Annotated[str, typer.Argument(help="An id, adapter@version, or a version with -a.")],
    adapter: Annotated[str | None, typer.Option("--adapter", "-a")] = None,
    as_json: Json = False,
) -> None:
    """One version: state, review, signature, files."""
    found = client().find_version(ref, adapter_id=adapter)
    emit(as_json, found)
    if not as_json:
        table(
            "version", ["id", "version", "state", "rank", "by", "uploaded"], version_rows([found])
        )
        if found.rejection_reason:
            out.print(f"rejected: {found.rejection_reason}", markup=False)
        if found.review_note:
            out.print(f"review note ({found.reviewer}): {found.review_note}", markup=False)
        out.print(f"signed: {found.signed} {found.signing_key_id}", markup=False)


# --- aliases ---------------------------------------------------------------------------------


def show_alias(alias: Alias) -> None:
    rows = [["stable", alias.version.label, f"{100 - alias.canary_percent} %"]]
    if alias.canary_version:
        keys = f" + keys {', '.join(alias.canary_api_keys)}" if alias.canary_api_keys else ""
        rows.append(["canary", alias.canary_version.label, f"{alias.canary_percent} %{keys}"])
    if alias.shadow_version:
        rows.append(["shadow", alias.shadow_version.label, f"copy of {alias.shadow_percent} %"])
    table(f"alias {alias.name}", ["role", "version", "traffic"], rows)


def version_for_alias(api: Client, name: str, ref: str, adapter: str | None) -> Version:
    if ref.isdigit() or "@" in ref:
        return api.find_version(ref)
    if adapter is None:
        try:
            adapter = api.alias(name).adapter_id
        except NotFound:
            adapter = name
    return api.find_version(ref, adapter_id=adapter)


@alias_app.command("list")
@handles_errors
def alias_list(as_json: Json = False) -> None:
    """The tenant's aliases and what each serves."""
    found = client().aliases()
    emit(as_json, found)
    if not as_json:
        rows = [
            [
                a.name,
                a.version.label,
                f"{a.canary_version.label} {a.canary_percent} %" if a.canary_version else None,
                f"{a.shadow_version.label} {a.shadow_percent} %" if a.shadow_version else None,
            ]
            for a in found
        ]
        table("aliases", ["alias", "stable", "canary", "shadow"], rows)


@alias_app.command("show")
@handles_errors
def alias_show(name: str, as_json: Json = False) -> None:
    """One alias: its split and its history."""
    found = client().alias(name)
    emit(as_json, found)
    if not as_json:
        show_alias(found)
        table(
            "history",
            ["at", "action", "to", "by", "reason"],
            [
                [e.at.strftime("%Y-%m-%d %H:%M:%S"), e.action, e.to_version, e.actor, e.reason]
                for e in found.history[:10]
            ],
        )


@alias_app.command("set")
@handles_errors
def alias_set(
    name: str,
    version: Annotated[str, typer.Argument(help="An id, adapter@version, or a version string.")],
    adapter: Annotated[str | None, typer.Option("--adapter", "-a")] = None,
    reason: Reason = "",
    as_json: Json = False,
) -> None:
    """Point the alias's stable traffic at an approved version (creates the alias)."""
    api = client()
    target = version_for_alias(api, name, version, adapter)
    found = api.set_alias(name, target.id, reason=reason)
    emit(as_json, found)
    if not as_json:
        show_alias(found)


@alias_app.command("canary")
@handles_errors
def alias_canary(
    name: str,
    version: Annotated[
        str | None, typer.Argument(help="The canary version (omit with --clear).")
    ] = None,
    percent: Annotated[int, typer.Option(min=0, max=100, help="Share of requests.")] = 0,
    key: Annotated[
        list[str] | None, typer.Option("--key", help="An API key prefix that always gets it.")
    ] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Stop the canary.")] = False,
    adapter: Annotated[str | None, typer.Option("--adapter", "-a")] = None,
    reason: Reason = "",
    as_json: Json = False,
) -> None:
    """Send a share of the alias's requests to a canary version (or --clear it)."""
    if clear == (version is not None):
        raise typer.BadParameter("give a VERSION, or --clear (not both)")
    api = client()
    target = None if clear else version_for_alias(api, name, version or "", adapter).id
    found = api.canary(name, target, percent=percent, api_keys=key or [], reason=reason)
    emit(as_json, found)
    if not as_json:
        show_alias(found)


@alias_app.command("promote")
@handles_errors
def alias_promote(name: str, reason: Reason = "", as_json: Json = False) -> None:
    """Make the canary the stable version."""
    found = client().promote(name, reason=reason)
    emit(as_json, found)
    if not as_json:
        show_alias(found)


@alias_app.command("rollback")
@handles_errors
def alias_rollback(name: str, reason: Reason = "", as_json: Json = False) -> None:
    """Back to the previous stable version, canary cleared: one call."""
    found = client().rollback(name, reason=reason)
    emit(as_json, found)
    if not as_json:
        show_alias(found)


# --- evaluations -----------------------------------------------------------------------------


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
    adapter: Annotated[str, typer.Option("--adapter", "-a")], as_json: Json = False
) -> None:
    """An adapter's evaluation sets, each with its latest revision."""
    found = client().evaluation_sets(adapter)
    emit(as_json, found)
    if not as_json:
        rows = [[s.name, s.latest.revision, s.latest.id, s.latest.case_count] for s in found]
        table("evaluation sets", ["set", "revision", "revision id", "cases"], rows)


@eval_app.command("push-set")
@handles_errors
def eval_push_set(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JSONL cases.")],
    adapter: Annotated[str, typer.Option("--adapter", "-a")],
    name: Annotated[str, typer.Option("--name", help="The set's name.")],
    as_json: Json = False,
) -> None:
    """Attach a JSONL evaluation set (its next immutable revision)."""
    found = client().upload_evaluation_set(adapter, name, file)
    emit(as_json, found)
    if not as_json:
        say(f"{name} revision {found.revision} (id {found.id}): {found.case_count} cases")


@eval_app.command("run")
@handles_errors
def eval_run(
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
    api = client()
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
    run_id: int,
    cases: Annotated[bool, typer.Option("--cases", help="Each case's two answers too.")] = False,
    failed: Annotated[bool, typer.Option("--failed", help="Cases the candidate failed.")] = False,
    changed: Annotated[bool, typer.Option("--changed", help="Cases whose answers differ.")] = False,
    as_json: Json = False,
) -> None:
    """A run's state and summary (and cases)."""
    api = client()
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


# --- releases --------------------------------------------------------------------------------


def where(release: Release) -> str:
    if release.state == "canary" or release.paused_from == "canary":
        step = f"step {release.step + 1} of {release.steps} ({release.canary_percent} %)"
        return f"{release.state} {step}" if release.state == "paused" else f"canary {step}"
    return release.state


def show_release(release: Release) -> None:
    say(
        f"release #{release.id} of {release.alias}: {release.baseline} → {release.candidate}: "
        f"{where(release)}" + (f" — {release.outcome}" if release.outcome else "")
    )
    gates = release.last_check.get("gates") or []
    if gates and not release.finished:
        table(
            "latest judgement",
            ["gate", "value", "needs", "verdict", "detail"],
            [
                [
                    g["gate"],
                    g["value"],
                    f"{g['op']} {g['threshold']}" if g["threshold"] is not None else "",
                    g["verdict"],
                    g["detail"],
                ]
                for g in gates
            ],
        )


def finished_code(release: Release) -> int:
    return OK if release.state == "promoted" else REFUSED


def plan_overrides(plan_file: Path | None, settings: list[str] | None) -> dict[str, Any]:
    plan: dict[str, Any] = {}
    if plan_file is not None:
        try:
            plan.update(json.loads(plan_file.read_text()))
        except ValueError as exc:
            raise typer.BadParameter(f"{plan_file} is not JSON: {exc}") from None
    for item in settings or []:
        key, sep, raw = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"--set {item}: write it as field=value, e.g. interval_s=10")
        try:
            plan[key.strip()] = json.loads(raw)
        except ValueError:
            plan[key.strip()] = raw
    return plan


@release_app.command("start")
@handles_errors
def release_start(
    alias: str,
    version: Annotated[str, typer.Argument(help="The candidate: id, adapter@version or version.")],
    plan_file: Annotated[
        Path | None, typer.Option("--plan", exists=True, dir_okay=False, help="A JSON plan.")
    ] = None,
    setting: Annotated[
        list[str] | None,
        typer.Option("--set", help="A plan field, e.g. --set shadow_percent=25 (repeatable)."),
    ] = None,
    watch: Annotated[
        bool, typer.Option("--watch", help="Follow it to the end (exit 3 if rolled back).")
    ] = False,
    as_json: Json = False,
) -> None:
    """Start a release of ALIAS to VERSION with the tenant's plan (and overrides)."""
    api = client()
    target = version_for_alias(api, alias, version, None)
    found = api.start_release(alias, target.id, plan=plan_overrides(plan_file, setting))
    if not as_json:
        show_release(found)
    if watch:
        found = api.watch_release(found.id, on_change=None if as_json else show_release)
    emit(as_json, found)
    if watch and found.state != "promoted":
        raise typer.Exit(finished_code(found))


def release_for(api: Client, ref: str) -> Release:
    """A release by id, or an alias's active release."""
    if ref.isdigit():
        return api.release(int(ref))
    active = api.releases(alias=ref, active=True)
    if not active:
        raise NotFound(404, "not_found", f"alias '{ref}' has no active release")
    return active[0]


@release_app.command("status")
@handles_errors
def release_status(
    ref: Annotated[str, typer.Argument(help="A release id, or an alias (its active release).")],
    as_json: Json = False,
) -> None:
    """Where a release is: its step and its latest judgement."""
    found = release_for(client(), ref)
    emit(as_json, found)
    if not as_json:
        show_release(found)


@release_app.command("list")
@handles_errors
def release_list(
    alias: Annotated[str | None, typer.Option(help="Only this alias's.")] = None,
    active: Annotated[bool, typer.Option("--active", help="Only those running.")] = False,
    as_json: Json = False,
) -> None:
    """The tenant's releases, newest first."""
    found = client().releases(alias=alias, active=active)
    emit(as_json, found)
    if not as_json:
        table(
            "releases",
            ["id", "alias", "from → to", "state", "outcome"],
            [
                [r.id, r.alias, f"{r.baseline} → {r.candidate}", where(r), r.outcome[:60]]
                for r in found
            ],
        )


@release_app.command("watch")
@handles_errors
def release_watch(
    ref: Annotated[str, typer.Argument(help="A release id, or an alias (its active release).")],
    timeout: Annotated[float, typer.Option(help="Seconds to watch at most.")] = 7 * 86400.0,
    as_json: Json = False,
) -> None:
    """Follow a release to its end: exit 0 when promoted, 3 when rolled back or aborted."""
    api = client()
    found = api.watch_release(
        release_for(api, ref).id, timeout=timeout, on_change=None if as_json else show_release
    )
    emit(as_json, found)
    if found.state != "promoted":
        raise typer.Exit(finished_code(found))


def _control(ref: str, verb: str, as_json: bool, **kw: Any) -> None:
    api = client()
    release = release_for(api, ref)
    found = getattr(api, f"{verb}_release")(release.id, **kw)
    emit(as_json, found)
    if not as_json:
        show_release(found)


@release_app.command("pause")
@handles_errors
def release_pause(ref: str, as_json: Json = False) -> None:
    """Hold the split: no judgement moves the release until it is resumed."""
    _control(ref, "pause", as_json)


@release_app.command("resume")
@handles_errors
def release_resume(ref: str, as_json: Json = False) -> None:
    """Continue from the step it was paused at."""
    _control(ref, "resume", as_json)


@release_app.command("promote")
@handles_errors
def release_promote(ref: str, as_json: Json = False) -> None:
    """Make the candidate the stable version now, skipping the remaining gates."""
    _control(ref, "promote", as_json)


@release_app.command("abort")
@handles_errors
def release_abort(ref: str, reason: Reason = "", as_json: Json = False) -> None:
    """Roll back now: the alias to the baseline alone, the candidate cooled on every node."""
    _control(ref, "abort", as_json, reason=reason)


# --- keys and the audit log ------------------------------------------------------------------


@keys_app.command("list")
@handles_errors
def keys_list(as_json: Json = False) -> None:
    """The tenant's keys (needs an admin key)."""
    found = client().keys()
    emit(as_json, found)
    if not as_json:
        rows = [
            [
                k.name,
                f"lh_{k.prefix}_…",
                "admin" if k.admin else "member",
                k.state,
                k.expires_at.strftime("%Y-%m-%d %H:%M") if k.expires_at else "never",
                k.last_used_at.strftime("%Y-%m-%d %H:%M") if k.last_used_at else "never",
                k.last_used_from or "",
            ]
            for k in found
        ]
        table(
            "API keys",
            ["name", "key", "kind", "state", "expires", "last used", "from"],
            rows,
        )


@keys_app.command("create")
@handles_errors
def keys_create(
    name: str,
    expires_in: Annotated[
        int | None,
        typer.Option(
            "--expires-in", min=1, help="Days until the key stops working (default: never)."
        ),
    ] = None,
    as_json: Json = False,
) -> None:
    """A new member key, printed once (needs an admin key)."""
    expires_at = datetime.now(UTC) + timedelta(days=expires_in) if expires_in is not None else None
    found = client().create_key(name, expires_at=expires_at)
    emit(as_json, found)
    if not as_json:
        until = f", valid until {found.expires_at:%Y-%m-%d %H:%M} UTC" if found.expires_at else ""
        say(f"key '{found.name}' created{until}; it is shown only now:")
        print(found.key)


@keys_app.command("revoke")
@handles_errors
def keys_revoke(
    prefix: Annotated[str, typer.Argument(help="lh_<prefix> or the key")], as_json: Json = False
) -> None:
    """Revoke a key: every node refuses it within a second (needs an admin key)."""
    found = client().revoke_key(prefix)
    emit(as_json, found)
    if not as_json:
        say(f"key '{found.name}' (lh_{found.prefix}_…) is revoked")


@app.command()
@handles_errors
def audit(
    action: Annotated[str | None, typer.Option(help="Actions starting with this.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    as_json: Json = False,
) -> None:
    """The tenant's audit log, newest first (needs an admin key)."""
    found = client().audit(action=action, limit=limit)
    emit(as_json, found)
    if not as_json:
        rows = [
            [
                e.at.strftime("%Y-%m-%d %H:%M:%S"),
                e.action,
                e.actor,
                f"{e.object_type} {e.object_id}",
            ]
            for e in found
        ]
        table("audit log", ["at", "action", "by", "object"], rows)


# --- usage -----------------------------------------------------------------------------------


@app.command()
@handles_errors
def usage(
    start: Annotated[
        str | None,
        typer.Option("--from", help="A date or whole UTC hour (default: this month's start)."),
    ] = None,
    to: Annotated[str | None, typer.Option("--to", help="Exclusive (default: now).")] = None,
    group_by: Annotated[
        str | None, typer.Option(help="Some of tenant,alias,version (default: all three).")
    ] = None,
    granularity: Annotated[str, typer.Option(help="day or hour.")] = "day",
    as_csv: Annotated[bool, typer.Option("--csv", help="Print the rows as CSV.")] = False,
    as_json: Json = False,
) -> None:
    """Requests, tokens, cache loads and engine time per day (or hour) and alias: what the
    platform bills (docs/usage.md)."""
    window = {"from": start, "to": to, "group_by": group_by, "granularity": granularity}
    api = client()
    if as_csv:
        print(api.usage_csv(**window), end="")
        return
    found = api.usage(**window)
    emit(as_json, found)
    if not as_json:
        groups = found.group_by
        rows = [
            [
                row.period.strftime(
                    "%Y-%m-%d %H:%M" if found.granularity == "hour" else "%Y-%m-%d"
                ),
                *(getattr(row, g) for g in groups),
                row.requests,
                row.prompt_tokens,
                row.completion_tokens,
                row.cache_loads,
                f"{row.engine_seconds:.1f}",
            ]
            for row in found.rows
        ]
        columns = ["period", *groups, "requests", "prompt", "completion", "loads", "engine s"]
        table(
            f"usage from {found.from_:%Y-%m-%d %H:%M} to {found.to:%Y-%m-%d %H:%M}", columns, rows
        )
        total = sum(row.total_tokens for row in found.rows)
        say(f"{total:,} tokens in {sum(row.requests for row in found.rows):,} requests")


# --- chat ------------------------------------------------------------------------------------


@app.command()
@handles_errors
def chat(
    message: str,
    model: Annotated[str, typer.Option("--model", "-m", help="An alias, e.g. support.")],
    max_tokens: Annotated[int, typer.Option(min=1, max=4096)] = 64,
    temperature: Annotated[float, typer.Option(min=0.0, max=2.0)] = 0.0,
    as_json: Json = False,
) -> None:
    """One chat request to a serving node: a smoke test of what an alias answers."""
    answer = client().chat(model, message, max_tokens=max_tokens, temperature=temperature)
    emit(as_json, answer.as_dict())
    if not as_json:
        print(answer.text)
        say(f"— {answer.adapter} on {answer.node or 'the node'} ({answer.cache_tier or '?'})")


# --- pull ------------------------------------------------------------------------------------


def version_to_pull(api: Client, ref: str) -> Version:
    """``tenant/name@version`` (the tenant optional; ``name`` an alias or an adapter; without
    ``@version``, what the alias serves) as a version."""
    tenant, _, rest = ref.rpartition("/")
    if tenant and tenant != api.tenant:
        raise NotFound(404, "not_found", f"this key acts for tenant '{api.tenant}', not '{tenant}'")
    name, _, version = rest.partition("@")
    if not name:
        raise LorahubError(f"'{ref}' names nothing: give tenant/alias@version, e.g. acme/support@3")
    try:
        alias = api.alias(name)
    except NotFound:
        if not version:
            raise
        return api.find_version(f"{name}@{version}")  # an adapter's own name
    if not version:
        return api.version(alias.version.id)
    return api.find_version(f"{alias.adapter_id}@{version}")


@app.command()
@handles_errors
def pull(
    ref: Annotated[str, typer.Argument(help="tenant/alias@version, e.g. acme/support@3.")],
    to: Annotated[
        Path | None, typer.Option("--to", help="A new folder (default: ./adapter@version).")
    ] = None,
    as_json: Json = False,
) -> None:
    """Download an approved version's files and its OpenSSF model-signing bundle (model.sig),
    each file checked against the registry's SHA-256; check the bundle with
    `model_signing verify key --signature <folder>/model.sig --public_key lorahub.pub <folder>`."""
    api = client()
    version = version_to_pull(api, ref)
    folder = to or Path(check_file_name(version.label, version.label))
    names = api.pull(version, folder)
    emit(
        as_json, {"version": version.model_dump(mode="json"), "folder": str(folder), "files": names}
    )
    if not as_json:
        say(f"pulled {version.label} into {folder}: {', '.join(names)}")
        say(
            "check it: model_signing verify key --signature "
            f"{folder / 'model.sig'} --public_key lorahub.pub {folder}"
        )


@app.command("version")
def show_version() -> None:
    """The client's version."""
    print(__version__)


def main() -> None:
    # Typer's own usage errors exit 2; everything else is handled per command.
    app(prog_name="lorahub")


if __name__ == "__main__":  # pragma: no cover
    main()
