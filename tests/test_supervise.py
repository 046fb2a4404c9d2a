"""``manage.py up``'s supervisor, with real child processes: a part that crashes is restarted
with a growing backoff and logged; the others keep running; stopping stops every part."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from lorahub.supervise import Supervisor

CRASH = [sys.executable, "-c", "import sys; sys.exit(3)"]
STAY = [sys.executable, "-c", "import time; time.sleep(600)"]


def run_for(supervisor: Supervisor, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        supervisor.poll()
        time.sleep(0.02)


def test_a_crashing_part_is_restarted_with_backoff_and_the_others_keep_running(caplog, tmp_path):
    env = dict(os.environ)
    supervisor = Supervisor(
        {"worker": (CRASH, env), "console": (STAY, env)},
        cwd=tmp_path,
        min_backoff_s=0.1,
        max_backoff_s=0.4,
        healthy_after_s=60,
    )
    caplog.set_level(logging.WARNING, logger="lorahub.up")
    supervisor.start_all()
    console = supervisor.children["console"].proc
    try:
        run_for(supervisor, 2.0)
        worker = supervisor.children["worker"]
        assert worker.restarts >= 3
        assert set(worker.exits) == {3}
        assert console is not None and console.poll() is None  # untouched
        assert supervisor.children["console"].restarts == 0
        assert "worker exited with status 3" in caplog.text
        assert "restarting it in 0.1 s (1 failure in a row)" in caplog.text
        assert "restarting it in 0.4 s (3 failures in a row)" in caplog.text
        waits = [supervisor.backoff(n) for n in range(1, 6)]
        assert waits == [0.1, 0.2, 0.4, 0.4, 0.4]  # doubles, then capped
    finally:
        supervisor.stop_all(grace_s=5)
    assert console.poll() is not None  # stopped with the rest


def test_a_part_that_stayed_up_starts_its_backoff_again(tmp_path):
    now = [0.0]
    supervisor = Supervisor(
        {"node": ([sys.executable, "-c", "pass"], dict(os.environ))},
        cwd=Path(tmp_path),
        min_backoff_s=1,
        healthy_after_s=60,
        clock=lambda: now[0],
    )
    supervisor.start_all()
    node = supervisor.children["node"]
    assert node.proc is not None
    node.proc.wait()
    node.failures = 4  # it had been failing...
    now[0] = 120.0  # ...then stayed up two minutes before this exit
    supervisor.poll()
    assert node.failures == 1 and node.restart_at == 121.0
    supervisor.stop_all(grace_s=1)
