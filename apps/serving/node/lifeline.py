"""A node's engine processes never outlive the node, however it stops.

Three parts, each for a way a node can go:

- ``become_subreaper``: the node adopts what its children leave behind (an ``EngineCore``
  that dies leaves its ``Worker`` processes), so ``end_descendants`` can find them;
- ``end_descendants``: the last step of a node's stop: SIGTERM to every process below it
  that is still there (an engine whose start outlasted the stop, a worker, vLLM's helpers),
  SIGKILL after a grace period. Without it, a node stopped while vLLM started left
  ``EngineCore`` and ``Worker`` (~1.3 GB) running with parent 1;
- ``register``, a ``vllm.general_plugins`` entry point that vLLM loads in each of its engine
  processes: a thread that ends the process when its parent is gone (SIGKILL of the node, the
  OOM killer), where no code of the node's runs any more.

Linux only (``/proc``, ``prctl``); elsewhere each part does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from lorahub.supervise import live_processes

logger = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Orphans of this process's descendants are re-parented to it, not to init."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def descendants(pid: int | None = None) -> list[int]:
    """Live processes below ``pid`` (default: this one), children first."""
    if not Path("/proc").is_dir():
        return []
    root = os.getpid() if pid is None else pid
    parents = {pid: parent for pid, (parent, _) in live_processes().items()}
    below: list[int] = []
    level = [root]
    while level:
        level = [child for child, parent in parents.items() if parent in level]
        below.extend(level)
    return below


def end_descendants(grace_s: float = 5.0) -> list[int]:
    """SIGTERM every live descendant, SIGKILL those still there after ``grace_s``, reap them.
    Returns the pids that had to be ended (none after a clean engine shutdown)."""
    left = descendants()
    if not left:
        return []
    logger.warning("ending %d process(es) the node left running: %s", len(left), left)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (alive := set(descendants()) & set(left)):
        _reap(alive)
        time.sleep(0.1)
    for pid in set(descendants()) & set(left):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    _reap(set(left))
    return left


def _reap(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _watch_parent(parent: int, every_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(every_s)
    # The parent is gone: SIGTERM lets vLLM's engine core end its workers as it does on a
    # clean shutdown; SIGKILL if that does not end this process.
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5.0)
    os.kill(os.getpid(), signal.SIGKILL)


def watch_parent(every_s: float = 1.0) -> None:
    """End this process when its parent is gone (a daemon thread, checking each second)."""
    thread = threading.Thread(
        target=_watch_parent, args=(os.getppid(), every_s), name="lorahub-lifeline", daemon=True
    )
    thread.start()


_watching = False


def register() -> None:
    """Entry point for ``vllm.general_plugins``: in an engine process (one that
    ``multiprocessing`` started), end it when its parent is gone. Loaded twice: one watcher."""
    global _watching
    import multiprocessing

    if _watching or multiprocessing.parent_process() is None:
        return  # the node itself, or a stock vLLM server's API process: its parent may be init
    _watching = True
    watch_parent()
