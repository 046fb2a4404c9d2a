"""Signing in, usage for chargeback, a chat smoke test, the client's version."""

from __future__ import annotations

from typing import Annotated

import typer

from lorahub_client import config
from lorahub_client.cli.output import Json, emit, handles_errors, say, table
from lorahub_client.cli.session import client, options
from lorahub_client.client import Client
from lorahub_client.version import __version__


@handles_errors
def login(
    ctx: typer.Context,
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
    me = Client(url, api_key, retries=options(ctx).retries).me()
    path = config.save(config.Settings(url=url, api_key=api_key, inference_url=inference_url))
    tenants = ", ".join(f"{m.tenant} ({m.role})" for m in me.tenants)
    emit(
        as_json, {"url": url, "tenants": [m.model_dump() for m in me.tenants], "config": str(path)}
    )
    if not as_json:
        say(f"signed in to {url} for {tenants}; saved to {path}")


# --- usage -----------------------------------------------------------------------------------


@handles_errors
def usage(
    ctx: typer.Context,
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
    api = client(ctx)
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


@handles_errors
def chat(
    ctx: typer.Context,
    message: str,
    model: Annotated[str, typer.Option("--model", "-m", help="An alias, e.g. support.")],
    max_tokens: Annotated[int, typer.Option(min=1, max=4096)] = 64,
    temperature: Annotated[float, typer.Option(min=0.0, max=2.0)] = 0.0,
    as_json: Json = False,
) -> None:
    """One chat request to a serving node: a smoke test of what an alias answers."""
    answer = client(ctx).chat(model, message, max_tokens=max_tokens, temperature=temperature)
    emit(as_json, answer.as_dict())
    if not as_json:
        print(answer.text)
        say(f"— {answer.adapter} on {answer.node or 'the node'} ({answer.cache_tier or '?'})")


def show_version() -> None:
    """The client's version."""
    print(__version__)
