"""A small process supervisor for ``manage.py up``: one crashed part does not take the rest down.

Each child runs in its own session (Ctrl-C reaches only the supervisor, which then stops the
children in order: SIGTERM, a grace period, SIGKILL). A child that exits is started again
after a backoff that doubles with each consecutive failure (``min_backoff_s`` up to
``max_backoff_s``) and resets once the child has stayed up ``healthy_after_s``; every exit is
logged with its status and the wait before the restart.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger("lorahub.up")


@dataclass
class Child:
    name: str
    command: Sequence[str]
    env: Mapping[str, str]
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    failures: int = 0  # consecutive exits without staying up healthy_after_s
    restarts: int = 0
    restart_at: float | None = None
    exits: list[int] = field(default_factory=list)


class Supervisor:
    def __init__(
        self,
        children: Mapping[str, tuple[Sequence[str], Mapping[str, str]]],
        *,
        cwd: Path,
        min_backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        healthy_after_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.children = {
            name: Child(name, command, env) for name, (command, env) in children.items()
        }
        self.cwd = cwd
        self.min_backoff_s, self.max_backoff_s = min_backoff_s, max_backoff_s
        self.healthy_after_s = healthy_after_s
        self.clock = clock

    def _start(self, child: Child) -> None:
        child.proc = subprocess.Popen(
            list(child.command), env=dict(child.env), cwd=self.cwd, start_new_session=True
        )
        child.started_at = self.clock()
        child.restart_at = None

    def start_all(self) -> None:
        for child in self.children.values():
            self._start(child)

    def backoff(self, failures: int) -> float:
        return min(self.max_backoff_s, self.min_backoff_s * 2 ** max(0, failures - 1))

    def poll(self) -> None:
        """Notice exits and start again whatever is due."""
        now = self.clock()
        for child in self.children.values():
            if child.proc is not None and child.restart_at is None:
                status = child.proc.poll()
                if status is None:
                    continue
                child.exits.append(status)
                if now - child.started_at >= self.healthy_after_s:
                    child.failures = 0
                child.failures += 1
                delay = self.backoff(child.failures)
                child.restart_at = now + delay
                logger.error(
                    "%s exited with status %s after %.0f s; restarting it in %.1f s "
                    "(%d failure%s in a row)",
                    child.name,
                    status,
                    now - child.started_at,
                    delay,
                    child.failures,
                    "" if child.failures == 1 else "s",
                )
            if child.restart_at is not None and now >= child.restart_at:
                child.restarts += 1
                logger.warning("restarting %s (restart #%d)", child.name, child.restarts)
                self._start(child)

    def run(self, every_s: float = 0.5) -> None:
        """Supervise until Ctrl-C or SIGTERM (raised as KeyboardInterrupt by the caller)."""
        while True:
            self.poll()
            time.sleep(every_s)

    def stop_all(self, grace_s: float = 30.0) -> None:
        """SIGTERM every running child (the node drains its requests), then SIGKILL what is
        still there after ``grace_s``."""
        running = [
            c.proc for c in self.children.values() if c.proc is not None and c.proc.poll() is None
        ]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
