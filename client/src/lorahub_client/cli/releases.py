"""``lorahub release``: progressive releases, judged by the platform."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from lorahub_client.cli.aliases import version_for_alias
from lorahub_client.cli.output import OK, REFUSED, Json, Reason, emit, handles_errors, say, table
from lorahub_client.cli.session import client
from lorahub_client.client import Client
from lorahub_client.errors import NotFound
from lorahub_client.models import Release

release_app = typer.Typer(
    help="Progressive releases of an alias, judged by the platform (an admin key).",
    no_args_is_help=True,
)


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
    ctx: typer.Context,
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
    api = client(ctx)
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
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="A release id, or an alias (its active release).")],
    as_json: Json = False,
) -> None:
    """Where a release is: its step and its latest judgement."""
    found = release_for(client(ctx), ref)
    emit(as_json, found)
    if not as_json:
        show_release(found)


@release_app.command("list")
@handles_errors
def release_list(
    ctx: typer.Context,
    alias: Annotated[str | None, typer.Option(help="Only this alias's.")] = None,
    active: Annotated[bool, typer.Option("--active", help="Only those running.")] = False,
    as_json: Json = False,
) -> None:
    """The tenant's releases, newest first."""
    found = client(ctx).releases(alias=alias, active=active)
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
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="A release id, or an alias (its active release).")],
    timeout: Annotated[float, typer.Option(help="Seconds to watch at most.")] = 7 * 86400.0,
    as_json: Json = False,
) -> None:
    """Follow a release to its end: exit 0 when promoted, 3 when rolled back or aborted."""
    api = client(ctx)
    found = api.watch_release(
        release_for(api, ref).id, timeout=timeout, on_change=None if as_json else show_release
    )
    emit(as_json, found)
    if found.state != "promoted":
        raise typer.Exit(finished_code(found))


def _control(api: Client, ref: str, verb: str, as_json: bool, **kw: Any) -> None:
    release = release_for(api, ref)
    found = getattr(api, f"{verb}_release")(release.id, **kw)
    emit(as_json, found)
    if not as_json:
        show_release(found)


@release_app.command("pause")
@handles_errors
def release_pause(ctx: typer.Context, ref: str, as_json: Json = False) -> None:
    """Hold the split: no judgement moves the release until it is resumed."""
    _control(client(ctx), ref, "pause", as_json)


@release_app.command("resume")
@handles_errors
def release_resume(ctx: typer.Context, ref: str, as_json: Json = False) -> None:
    """Continue from the step it was paused at."""
    _control(client(ctx), ref, "resume", as_json)


@release_app.command("promote")
@handles_errors
def release_promote(ctx: typer.Context, ref: str, as_json: Json = False) -> None:
    """Make the candidate the stable version now, skipping the remaining gates."""
    _control(client(ctx), ref, "promote", as_json)


@release_app.command("abort")
@handles_errors
def release_abort(ctx: typer.Context, ref: str, reason: Reason = "", as_json: Json = False) -> None:
    """Roll back now: the alias to the baseline alone, the candidate cooled on every node."""
    _control(client(ctx), ref, "abort", as_json, reason=reason)
