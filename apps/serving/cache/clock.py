"""The cache's one reading of time.

Every tier object (``EngineTiers``, ``DiskIndex``'s rules in ``book.py``, ``DeviceGate``, the
cache manager) takes a ``Clock`` and reads the time only through it. A live node passes
nothing and gets ``monotonic``; the replay (``replay/simulate.py``) passes the virtual clock of
its event loop, so the same rules decide on a trace's timestamps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]

monotonic: Clock = time.monotonic  # the default clock: seconds, never going back
timer: Clock = time.perf_counter  # the default timer, for the durations the node reports
