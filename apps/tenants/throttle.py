"""Repeated bad API keys from one caller address: past ``LORAHUB_BAD_KEY_LIMIT`` of them
(moving window), each further bad key from that address gets 429 with ``Retry-After`` until
the window has room again.

A valid key is never refused here: the throttle counts failures, and a failure by one caller
must not cost another (behind one router, or one NAT, many callers share an address; an
attacker who can send from, or claim, a victim's address must not lock the victim out). Keys
are 256-bit random secrets, so the throttle is not what stops guessing; it bounds the noise and
the lookups a guesser causes. A missing key is not counted: it guesses nothing. The caller's
address is ``lorahub/addresses.py``'s.

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

    def failed(self, client: str) -> int:
        """Count one bad key from this address: 0 while the address is within its limit,
        else the whole seconds it must wait before its bad keys are answered 401 again."""
        if self._limiter.hit(self.limit, NAMESPACE, client):
            return 0
        stats = self._limiter.get_window_stats(self.limit, NAMESPACE, client)
        return max(1, math.ceil(stats.reset_time - time.time()))


@functools.cache
def bad_keys() -> BadKeyThrottle:
    """The process's throttle, from settings (a test that changes them clears this cache)."""
    return BadKeyThrottle(settings.LORAHUB_BAD_KEY_LIMIT, settings.LORAHUB_BAD_KEY_STORAGE)


def message(wait_s: int) -> str:
    return (
        f"too many invalid API keys from this address; wait {wait_s} s before trying another "
        "(a valid key is always answered; a new key is issued on the console's Keys page)"
    )


ANONYMOUS_AUDIT = "lorahub-anonymous-audit"


@functools.cache
def _anonymous_audit_limiter() -> MovingWindowRateLimiter:
    return MovingWindowRateLimiter(storage_from_string(settings.LORAHUB_BAD_KEY_STORAGE))


def may_audit_anonymous(client: str) -> bool:
    """Whether an event by nobody signed in (a failed sign-in, a provider's error) from this
    address is written: at most ``LORAHUB_ANONYMOUS_AUDIT_LIMIT`` (default 30 a minute), so
    anyone on the network cannot fill the audit log; past it, the event is logged only."""
    return _anonymous_audit_limiter().hit(
        parse(settings.LORAHUB_ANONYMOUS_AUDIT_LIMIT), ANONYMOUS_AUDIT, client
    )
