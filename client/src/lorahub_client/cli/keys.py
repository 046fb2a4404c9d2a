"""``lorahub keys`` and ``lorahub audit``: the tenant's API keys and its audit log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from lorahub_client.cli.output import Json, emit, handles_errors, say, table
from lorahub_client.cli.session import client

keys_app = typer.Typer(help="The tenant's API keys (an admin key).", no_args_is_help=True)


@keys_app.command("list")
@handles_errors
def keys_list(ctx: typer.Context, as_json: Json = False) -> None:
    """The tenant's keys (needs an admin key)."""
    found = client(ctx).keys()
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
    ctx: typer.Context,
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
    found = client(ctx).create_key(name, expires_at=expires_at)
    emit(as_json, found)
    if not as_json:
        until = f", valid until {found.expires_at:%Y-%m-%d %H:%M} UTC" if found.expires_at else ""
        say(f"key '{found.name}' created{until}; it is shown only now:")
        print(found.key)


@keys_app.command("revoke")
@handles_errors
def keys_revoke(
    ctx: typer.Context,
    prefix: Annotated[str, typer.Argument(help="lh_<prefix> or the key")],
    as_json: Json = False,
) -> None:
    """Revoke a key: every node refuses it within a second (needs an admin key)."""
    found = client(ctx).revoke_key(prefix)
    emit(as_json, found)
    if not as_json:
        say(f"key '{found.name}' (lh_{found.prefix}_…) is revoked")


@handles_errors
def audit(
    ctx: typer.Context,
    action: Annotated[str | None, typer.Option(help="Actions starting with this.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    as_json: Json = False,
) -> None:
    """The tenant's audit log, newest first (needs an admin key)."""
    found = client(ctx).audit(action=action, limit=limit)
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
