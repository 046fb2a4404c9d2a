"""A small process supervisor for ``manage.py up``: one crashed part does not take the rest down.

Each child runs in its own session, so it leads a process group that holds everything it
starts (a serving node's vLLM ``EngineCore`` and ``Worker`` processes are spawned into it).
Ctrl-C reaches only the supervisor, which then stops the children in order: SIGTERM to each
child (a node drains and shuts its engine down), a grace period, then SIGKILL to whatever is
left of each child's group.

A child that exits is started again after a backoff that doubles with each consecutive
failure (``min_backoff_s`` up to ``max_backoff_s``) and resets once the child has stayed up
``healthy_after_s``; every exit is logged with its status and the wait before the restart.
When a child dies, what it started dies with it: its group gets SIGTERM and, after
``group_grace_s``, SIGKILL, and the restart waits until the group is empty. Otherwise a
node killed by SIGKILL or the OOM killer left its engine (~1.5 GB here) running as an orphan
beside the restarted node's new one. Each child also gets SIGTERM when the supervisor itself
dies (Linux's parent-death signal), so a supervisor killed by SIGKILL does not leave its
children running either.

Why not supervisord or circus: they would bring a daemon with its own configuration file and
control socket to a command that a new user runs in a terminal, for the ~150 lines here that
`tests/test_supervise.py` checks with real processes; the group handling above is what
supervisord's ``stopasgroup``/``killasgroup`` do.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
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
    # the group of a child that exited: SIGKILL for what is left of it from this time on
    group_kill_at: float | None = None


PR_SET_PDEATHSIG = 1


def _die_with_supervisor(supervisor_pid: int) -> None:
    """In the child, before it runs its command: SIGTERM when the supervisor dies."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != supervisor_pid:  # it died before the line above took effect
            os.kill(os.getpid(), signal.SIGTERM)


def live_processes() -> dict[int, tuple[int, int]]:
    """Every live (not zombie) process, read from /proc: pid -> (parent pid, process group)."""
    found: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            found[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return found


def group_alive(pgid: int) -> bool:
    """Whether a live process (not a zombie) is left in the process group ``pgid``.

    Read from /proc on Linux: a zombie still counts for ``killpg(pgid, 0)``, and where
    nothing reaps orphans (a container whose first process does not), a restart that waited
    on ``killpg`` would wait for ever."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # a member we may not signal is still a member
            return True
        return True
    return any(group == pgid for _, group in live_processes().values())


def signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


class Supervisor:
    def __init__(
        self,
        children: Mapping[str, tuple[Sequence[str], Mapping[str, str]]],
        *,
        cwd: Path,
        min_backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        healthy_after_s: float = 60.0,
        group_grace_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.children = {
            name: Child(name, command, env) for name, (command, env) in children.items()
        }
        self.cwd = cwd
        self.min_backoff_s, self.max_backoff_s = min_backoff_s, max_backoff_s
        self.healthy_after_s = healthy_after_s
        self.group_grace_s = group_grace_s
        self.clock = clock

    def _start(self, child: Child) -> None:
        supervisor_pid = os.getpid()
        child.proc = subprocess.Popen(
            list(child.command),
            env=dict(child.env),
            cwd=self.cwd,
            start_new_session=True,  # its own process group: see the module's docstring
            preexec_fn=lambda: _die_with_supervisor(supervisor_pid),
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
                # what it started (a node's engine) goes with it: nothing can drain it now
                signal_group(child.proc.pid, signal.SIGTERM)
                child.group_kill_at = now + self.group_grace_s
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
            if child.group_kill_at is not None and child.proc is not None:
                if not group_alive(child.proc.pid):
                    child.group_kill_at = None
                elif now >= child.group_kill_at:
                    logger.warning(
                        "%s's processes outlived it by %.0f s; killing them",
                        child.name,
                        self.group_grace_s,
                    )
                    signal_group(child.proc.pid, signal.SIGKILL)
                    continue  # the restart waits for the group to be empty
                else:
                    continue
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
        """SIGTERM every running child (the node drains its requests and shuts its engine
        down), SIGKILL a child still there after ``grace_s``; then whatever is left in any
        child's process group gets SIGTERM and, after ``group_grace_s``, SIGKILL. Returns
        when every group is empty."""
        started = [c.proc for c in self.children.values() if c.proc is not None]
        running = [proc for proc in started if proc.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        left = [proc.pid for proc in started if group_alive(proc.pid)]
        for pgid in left:
            signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.group_grace_s
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [pgid for pgid in left if group_alive(pgid)]
        for pgid in left:
            logger.warning("processes of group %d outlived their parent; killing them", pgid)
            signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 10  # SIGKILL cannot be refused; this is only a bound
        while any(group_alive(pgid) for pgid in left) and time.monotonic() < deadline:
            time.sleep(0.05)
