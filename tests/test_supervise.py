"""``manage.py up``'s supervisor, with real child processes: a part that crashes is restarted
with a growing backoff and logged; the others keep running; stopping stops every part."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lorahub.supervise import Supervisor
from tests.harness.waiting import wait_until

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


# A part that starts a process of its own (as a node starts vLLM's engine core) and waits.
# The grandchild writes its pid to a file once it is set up; when asked to, it ignores
# SIGTERM, as a hung engine would.
def parent_of_grandchild(pidfile: Path, *, stubborn: bool = False) -> list[str]:
    grandchild = "\n".join(
        [
            "import os, pathlib, signal, time",
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if stubborn else "",
            f"pathlib.Path({str(pidfile)!r}).write_text(str(os.getpid()))",
            "time.sleep(600)",
        ]
    )
    script = "\n".join(
        [
            "import subprocess, sys, time",
            f"subprocess.Popen([sys.executable, '-c', {grandchild!r}])",
            "time.sleep(600)",
        ]
    )
    return [sys.executable, "-c", script]


def wait_for_pid(pidfile: Path) -> int:
    return int(
        wait_until(
            lambda: pidfile.exists() and pidfile.read_text(),
            "the part to start its process",
            every=0.02,
        )
    )


def alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_part_killed_by_sigkill_takes_what_it_started_with_it_before_its_restart(tmp_path):
    """The supervisor's clock is a stand-in, so the grace period is not raced by the machine's
    speed; the processes and signals are real."""
    pidfile = tmp_path / "grandchild.pid"
    now = [0.0]
    supervisor = Supervisor(
        {"node": (parent_of_grandchild(pidfile, stubborn=True), dict(os.environ))},
        cwd=tmp_path,
        min_backoff_s=1,
        group_grace_s=5,
        clock=lambda: now[0],
    )
    supervisor.start_all()
    try:
        first = wait_for_pid(pidfile)
        pidfile.unlink()
        node = supervisor.children["node"]
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGKILL)
        node.proc.wait()
        now[0] = 1.0
        supervisor.poll()  # the exit is seen: its group gets SIGTERM, which the grandchild ignores
        now[0] = 3.0  # past the backoff, within the grace: the restart waits for the group
        supervisor.poll()
        assert alive(first) and node.restarts == 0
        now[0] = 7.0  # past the grace: SIGKILL for what is left of the group
        supervisor.poll()
        wait_until(lambda: not alive(first), "SIGKILL to end the group", 10, every=0.02)
        supervisor.poll()  # the group is empty: now it starts again
        assert node.restarts == 1
        second = wait_for_pid(pidfile)
        assert alive(second)
    finally:
        supervisor.stop_all(grace_s=5)
    assert not alive(second)


def test_stopping_ends_every_process_the_parts_started(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    supervisor = Supervisor(
        {"node": (parent_of_grandchild(pidfile, stubborn=True), dict(os.environ))},
        cwd=tmp_path,
        group_grace_s=0.5,
    )
    supervisor.start_all()
    grandchild = wait_for_pid(pidfile)
    supervisor.stop_all(grace_s=5)
    assert not alive(grandchild)


def test_a_supervisor_killed_by_sigkill_leaves_no_part_running(tmp_path):
    """The parts get SIGTERM from the kernel when their supervisor dies (parent-death
    signal), and each then ends its own process group's work as a normal stop does."""
    pidfile = tmp_path / "part.pid"
    part = "\n".join(
        [
            "import os, pathlib, time",
            f"pathlib.Path({str(pidfile)!r}).write_text(str(os.getpid()))",
            "time.sleep(600)",
        ]
    )
    script = "\n".join(
        [
            "import os, sys",
            "from pathlib import Path",
            "from lorahub.supervise import Supervisor",
            f"s = Supervisor({{'node': ([sys.executable, '-c', {part!r}], dict(os.environ))}}, "
            "cwd=Path('.'))",
            "s.start_all()",
            "s.run(every_s=0.1)",
        ]
    )
    root = Path(__file__).resolve().parent.parent
    supervisor = subprocess.Popen([sys.executable, "-c", script], cwd=root)
    try:
        part = wait_for_pid(pidfile)
        supervisor.kill()
        supervisor.wait()
        wait_until(lambda: not alive(part), "the killed supervisor's part to end", 10, 0.05)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
