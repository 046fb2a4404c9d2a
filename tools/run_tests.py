"""`make test`: every test once, in lanes that run at the same time, then the outage tests
alone.

The suite waits more than it computes (a CI run kept 0.64 of its 2 cores busy over 25 minutes:
engines starting, nodes restarting, polling for a worker), so four pytest processes share the
machine:

- **control plane**: the tests that need neither vLLM nor a browser, in the control plane's
  virtualenv (which proves they need neither vLLM nor torch);
- **own nodes**: engine tests that start serving nodes of their own (``up``, the fleet, the
  embedded stack; marker ``own_nodes``);
- **drills and engine**: the node fault drills, which start nodes of their own too (marker
  ``faults``): each takes one to two minutes, mostly waiting for a node to start or heal, so
  they get a lane rather than lengthening the one above; beside them the tests of the
  in-process engine, which need no serving node (marker ``in_process_engine``, set by
  ``tests/conftest.py``);
- **session node**: the other engine and browser tests, around the session's node;
- **deploy**: the ``deploy`` tests, which build the images and run the compose stack with its
  two engines (``tests/deploy/``); it starts once the control plane's lane and the drills have
  ended, beside the two lanes still running.

Each lane has its own test database, Redis database and alias-change channel, so no lane sees
another's rows, tasks or broadcasts. Then the ``outage`` tests, which stop PostgreSQL or Redis
for every process on the machine, run alone.

Each lane's output goes to ``var/test-logs/<lane>.log`` and is printed whole when the lane
ends. Arguments after ``--`` go to every pytest (``make test PYTEST_ARGS=...``); a lane that
they leave without tests (pytest's exit status 5) passes. Interrupted, it interrupts every
lane, so that their fixtures stop what they started.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "var" / "test-logs"
NO_TESTS = 5  # pytest's exit status when a selection is empty


@dataclass
class Lane:
    name: str
    python: str
    marks: str
    database: str  # PostgreSQL database (pytest-django adds test_)
    redis_db: int
    # a lane that starts once these lanes have ended, beside the ones still running
    after: tuple[str, ...] = ()

    @property
    def slug(self) -> str:
        return self.name.replace(" ", "-").replace("(", "").replace(")", "")

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{self.database}",
            "CELERY_BROKER_URL": f"redis://127.0.0.1:6379/{self.redis_db}",
            "LORAHUB_EVENTS_CHANNEL": f"lorahub:changes:{self.slug}",
        }

    def start(self, args: list[str]) -> subprocess.Popen:
        LOGS.mkdir(parents=True, exist_ok=True)
        # the slowest tests of each lane, for whoever makes the suite faster
        command = [self.python, "-m", "pytest", "-m", self.marks, "--durations=12", *args]
        with (LOGS / f"{self.slug}.log").open("w") as log:  # pytest keeps its own copy
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            return subprocess.Popen(
                command, cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT
            )


def lanes(cp: str, py: str) -> tuple[list[Lane], list[Lane]]:
    engine, control = "(engine or browser)", "not engine and not browser and not deploy"
    engine = f"{engine} and not deploy"
    own = f"{engine} and own_nodes and not outage"
    # not own_nodes: a test of the in-process engine that also starts nodes runs with those
    in_process = f"{engine} and in_process_engine and not own_nodes and not outage"
    control_plane, drills = "control plane", "drills and engine"
    together = [
        Lane(control_plane, cp, f"{control} and not outage", "lorahub_cp", 13),
        Lane("own nodes", py, f"{own} and not faults", "lorahub_own", 14),
        Lane(
            drills,
            py,
            f"({own} and faults) or ({in_process})",
            "lorahub_faults",
            12,
        ),
        Lane(
            "session node",
            py,
            f"{engine} and not own_nodes and not in_process_engine and not outage",
            "lorahub",
            15,
        ),
        # the compose stack: its own containers, but two engines that need the machine's
        # cores. Started with the other lanes, its engines slowed the session node's engine
        # restart past its deadline (tests/serving/node/test_node_api.py failed); after them
        # all, it added its whole length to the run. It starts when the two lanes that end
        # first have ended, beside the two that wait on engines more than they compute.
        Lane("deploy", cp, "deploy", "lorahub_deploy", 11, after=(control_plane, drills)),
    ]
    alone = [
        Lane("outages control plane", cp, f"outage and {control}", "lorahub_cp", 13),
        Lane("outages engine", py, f"outage and {engine}", "lorahub", 15),
    ]
    return together, alone


def report(lane: Lane, status: int, seconds: float) -> bool:
    print((LOGS / f"{lane.slug}.log").read_text(), end="", flush=True)
    passed = status in (0, NO_TESTS)
    verdict = "passed" if passed else f"FAILED (pytest exit status {status})"
    print(f"=== lane '{lane.name}': {verdict} in {seconds:.0f} s ===\n", flush=True)
    return passed


def run(group: list[Lane], args: list[str]) -> bool:
    """Start every lane of ``group`` (each one named ``after`` others once those have ended);
    report each as it ends; True if all passed."""
    started = time.monotonic()
    waiting = [lane for lane in group if lane.after]
    running = {lane.name: (lane, lane.start(args)) for lane in group if not lane.after}
    ended: set[str] = set()
    print(f"lanes running: {', '.join(running)} (output: {LOGS.relative_to(ROOT)}/)", flush=True)
    ok = True
    interrupted = False
    try:
        while running or waiting:
            for name, (lane, proc) in list(running.items()):
                if proc.poll() is not None:
                    del running[name]
                    ended.add(name)
                    ok = report(lane, proc.returncode, time.monotonic() - started) and ok
            for lane in [lane for lane in waiting if ended.issuperset(lane.after)]:
                waiting.remove(lane)
                running[lane.name] = (lane, lane.start(args))
                print(
                    f"lane '{lane.name}' started at {time.monotonic() - started:.0f} s", flush=True
                )
            time.sleep(0.5)
    except KeyboardInterrupt:  # Ctrl-C reached every lane too: only wait for them
        interrupted = True
        raise
    finally:
        stop([proc for _, proc in running.values()], interrupt=not interrupted)
    return ok


def stop(procs: list[subprocess.Popen], *, interrupt: bool) -> None:
    """Interrupt pytest (its fixtures then stop their nodes and engines), then make sure."""
    for proc in procs if interrupt else ():
        proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 60
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--control-plane-python", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    args = [a for a in options.pytest_args if a != "--"]
    together, alone = lanes(options.control_plane_python, options.python)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # runs the `finally` above
    started = time.monotonic()
    ok = run(together, args)
    for lane in alone:  # one at a time: each stops a service the other uses, or needs the CPUs
        ok = run([lane], args) and ok
    print(f"=== all lanes: {'passed' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
