"""Blocking work the node's event loop hands to a thread: database reads, disk and engine
calls.

Each call first drops the thread's database connection if it is broken or past its age
(``close_old_connections``). Outside Django's request cycle nothing else does that, so after a
PostgreSQL restart a pooled thread would otherwise keep its dead connection and fail every
query for ever; with it, the first query after the restart reconnects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import close_old_connections

P = ParamSpec("P")
T = TypeVar("T")


async def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` in a worker thread, with a usable database connection."""

    def call() -> T:
        close_old_connections()
        return fn(*args, **kwargs)

    return await asyncio.to_thread(call)
