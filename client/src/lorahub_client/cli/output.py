"""How a command speaks: its exit codes, its stdout (the API's JSON with ``--json``, tables
otherwise) and its stderr (messages), and the one wrapper that turns an error into both."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from lorahub_client.errors import (
    ApiError,
    LorahubError,
    NotFound,
    Refused,
    Rejected,
    TimedOut,
    Unavailable,
)

OK, USAGE, REFUSED, NOT_FOUND, UNAVAILABLE = 0, 2, 3, 4, 5
F = TypeVar("F", bound=Callable[..., Any])

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

Json = Annotated[bool, typer.Option("--json", help="Print the API's JSON instead of text.")]
Reason = Annotated[str, typer.Option("--reason", help="Why: kept in the alias history.")]


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
