"""Repeated bad API keys from one client address: after ``LORAHUB_BAD_KEY_LIMIT`` of them
(moving window), every key from that address gets 429 with ``Retry-After`` until the window
has room again.

Why every key, a good one too: a guesser must learn nothing while it is throttled, so a
throttled address gets the same answer whatever it sends. People behind the same address
wait with it (as with the console's login lockout); a client that sends only good keys is
never counted. A missing key is not counted either: it guesses nothing.

The counts live in ``LORAHUB_BAD_KEY_STORAGE`` (``memory://`` per process by default;
``redis://...`` shares them between processes and machines), through the ``limits`` library.
"""

from __future__ import annotations

import functools
import math
import time

from django.conf import settings
from limits import parse
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

NAMESPACE = "lorahub-bad-key"


class BadKeyThrottle:
    def __init__(self, limit: str, storage_uri: str = "memory://") -> None:
        self.limit = parse(limit)
        self._limiter = MovingWindowRateLimiter(storage_from_string(storage_uri))

    def wait_s(self, client: str) -> int:
        """Whole seconds this address must wait before sending a key again; 0 if it may now."""
        if self._limiter.test(self.limit, NAMESPACE, client):
            return 0
        stats = self._limiter.get_window_stats(self.limit, NAMESPACE, client)
        return max(1, math.ceil(stats.reset_time - time.time()))

    def failed(self, client: str) -> None:
        """Count one bad key from this address."""
        self._limiter.hit(self.limit, NAMESPACE, client)


@functools.cache
def bad_keys() -> BadKeyThrottle:
    """The process's throttle, from settings (a test that changes them clears this cache)."""
    return BadKeyThrottle(settings.LORAHUB_BAD_KEY_LIMIT, settings.LORAHUB_BAD_KEY_STORAGE)


def message(wait_s: int) -> str:
    return (
        "too many invalid API keys from this address; wait "
        f"{wait_s} s, then send a valid key (a new key is issued on the console's Keys page)"
    )
