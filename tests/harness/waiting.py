"""Waiting for something a test started: one ``wait_until``, one ``free_port``."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_until(
    check: Callable[[], T],
    what: str,
    timeout: float = 30.0,
    every: float = 0.1,
    *,
    ignore: tuple[type[BaseException], ...] = (),
    on_timeout: Callable[[], object] | None = None,
) -> T:
    """Call ``check`` every ``every`` seconds until it returns something true, and return
    that; after ``timeout`` seconds fail the test, naming ``what`` and the last value seen (or
    ``on_timeout()``). Exceptions of the types in ``ignore`` count as not yet."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        with contextlib.suppress(*ignore):
            last = check()
            if last:
                return last  # type: ignore[return-value]
        if time.monotonic() > deadline:
            seen = on_timeout() if on_timeout else last
            pytest.fail(f"waited {timeout:.0f} s for {what}; last seen: {seen!r}")
        time.sleep(every)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    """Until something listens on ``port``; fails at once if ``proc`` exits first."""

    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    wait_until(listening, f"something listening on port {port}", timeout)
