"""The node's download worker: landing a version from the registry (L4) on disk (L3) runs in
a separate process at low CPU priority.

Why a process: the download, sha256 and BLAKE3 passes otherwise run beside the event loop
that streams tokens, sharing its GIL and the engine's cores. ``bench/load_tiers.py``
measures hot-request TTFT while cold loads run: on a 2-core machine, 1.33-1.38x of quiet
with the download in a thread at nice 10, 1.26x in this process at nice 10, 1.08-1.27x at
nice 19. The price of nice 19: when the engine keeps every core busy, a cold load gets
little CPU and takes longer; the request's deadline and its tier's overload action (wait,
degrade, 503) bound what a caller sees, and requests for loaded adapters are not slowed.

Nothing here imports Django models at module level: a spawned worker loads this module
before Django is set up.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any


def _start_worker() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lorahub.settings")
    import django

    django.setup()
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, 0, 19)  # yield the CPU to the engine


@functools.cache
def pool() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(
        max_workers=2, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker
    )


def _ready() -> bool:
    return True


def start() -> None:
    """Start the worker now (a second or two), not on the first cold request."""
    pool().submit(_ready).result()


def stop() -> None:
    """Stop the worker processes now: a landing in progress is abandoned (its temporary
    folder is never used: a version lands by an atomic rename after every check). Without
    the terminate, workers of a node that exits right after outlive it."""
    if pool.cache_info().currsize:
        executor = pool()
        workers = list((executor._processes or {}).values())  # no public handle before 3.14
        executor.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.join(timeout=5)
        pool.cache_clear()


def _land(root: Path, resolved: Any, store: Any, keys: dict[str, str]) -> Any:
    from apps.serving.cache.disk import DiskTier

    return DiskTier(root).land(resolved, store, keys)


def land(root: Path, resolved: Any, store: Any, keys: dict[str, str]) -> Any:
    """``DiskTier(root).land(...)`` in the worker; blocks the calling thread until done and
    raises what it raised (``IntegrityFailure``, a storage error)."""
    return pool().submit(_land, root, resolved, store, keys).result()
