"""What every command shares: the root options (``--url``, ``--api-key``, ``--retries``),
kept on Typer's context for the command that runs, and the API client they make."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer

from lorahub_client import config
from lorahub_client.client import Client
from lorahub_client.errors import LorahubError


@dataclass(frozen=True)
class Options:
    url: str | None = None
    api_key: str | None = None
    retries: int = 3


def main_options(
    ctx: typer.Context,
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
    ctx.obj = Options(url, api_key, retries)


def options(ctx: typer.Context) -> Options:
    """The root options of the command that is running (``ctx``: its context)."""
    return ctx.find_object(Options) or Options()


def client(ctx: typer.Context) -> Client:
    """The API client for the configured server and key (``lorahub login``, the environment
    or the root options); a usage error naming what is missing."""
    chosen = options(ctx)
    settings = config.resolve(chosen.url, chosen.api_key)
    if not settings.url:
        raise LorahubError("no server: run `lorahub login`, or set LORAHUB_URL")
    if not settings.api_key:
        raise LorahubError("no API key: run `lorahub login`, or set LORAHUB_API_KEY")
    return Client(
        settings.url,
        settings.api_key,
        inference_url=settings.inference_url or None,
        retries=chosen.retries,
    )
