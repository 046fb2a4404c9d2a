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
    until: Callable[[T], object] | None = None,
    describe: Callable[[T], object] | None = None,
    ignore: tuple[type[BaseException], ...] = (),
    on_timeout: Callable[[], object] | None = None,
) -> T:
    """Call ``check`` every ``every`` seconds until it returns something true, and return
    that; after ``timeout`` seconds fail the test, naming ``what`` and the last value seen
    (``describe(value)``, or ``on_timeout()``). With ``until``, the value is returned once
    ``until(value)`` is true instead (a state read each time, then tested). Exceptions of
    the types in ``ignore`` count as not yet."""
    deadline = time.monotonic() + timeout
    last: object = None
    seen = False

    def _shown(value: object) -> str:
        if on_timeout:
            value = on_timeout()
        elif describe and seen:
            value = describe(value)  # type: ignore[arg-type]
        return value if isinstance(value, str) else repr(value)

    while True:
        with contextlib.suppress(*ignore):
            last, seen = check(), True
            if until(last) if until else last:  # type: ignore[arg-type]
                return last  # type: ignore[return-value]
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:.0f} s for {what}; last seen: {_shown(last)}")
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
