"""``lorahub alias``: set, canary, promote, roll back."""

from __future__ import annotations

from typing import Annotated

import typer

from lorahub_client.cli.output import Json, Reason, emit, handles_errors, table
from lorahub_client.cli.session import client
from lorahub_client.client import Client
from lorahub_client.errors import NotFound
from lorahub_client.models import Alias, Version

alias_app = typer.Typer(help="Aliases: set, canary, promote, roll back.", no_args_is_help=True)


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
def alias_list(ctx: typer.Context, as_json: Json = False) -> None:
    """The tenant's aliases and what each serves."""
    found = client(ctx).aliases()
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
def alias_show(ctx: typer.Context, name: str, as_json: Json = False) -> None:
    """One alias: its split and its history."""
    found = client(ctx).alias(name)
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
    ctx: typer.Context,
    name: str,
    version: Annotated[str, typer.Argument(help="An id, adapter@version, or a version string.")],
    adapter: Annotated[str | None, typer.Option("--adapter", "-a")] = None,
    reason: Reason = "",
    as_json: Json = False,
) -> None:
    """Point the alias's stable traffic at an approved version (creates the alias)."""
    api = client(ctx)
    target = version_for_alias(api, name, version, adapter)
    found = api.set_alias(name, target.id, reason=reason)
    emit(as_json, found)
    if not as_json:
        show_alias(found)


@alias_app.command("canary")
@handles_errors
def alias_canary(
    ctx: typer.Context,
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
    api = client(ctx)
    target = None if clear else version_for_alias(api, name, version or "", adapter).id
    found = api.canary(name, target, percent=percent, api_keys=key or [], reason=reason)
    emit(as_json, found)
    if not as_json:
        show_alias(found)


@alias_app.command("promote")
@handles_errors
def alias_promote(
    ctx: typer.Context, name: str, reason: Reason = "", as_json: Json = False
) -> None:
    """Make the canary the stable version."""
    found = client(ctx).promote(name, reason=reason)
    emit(as_json, found)
    if not as_json:
        show_alias(found)


@alias_app.command("rollback")
@handles_errors
def alias_rollback(
    ctx: typer.Context, name: str, reason: Reason = "", as_json: Json = False
) -> None:
    """Back to the previous stable version, canary cleared: one call."""
    found = client(ctx).rollback(name, reason=reason)
    emit(as_json, found)
    if not as_json:
        show_alias(found)
