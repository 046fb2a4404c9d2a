"""What became of an inference request: the one definition of an error on the platform.

The request log, the rollups, the dashboards, the release gates and charts, the evaluation
summaries and the node's Prometheus metrics all count through here, so a release page's gate
and its chart cannot disagree about what failed:

- ``server_failure``: the platform failed the caller: a 5xx (the engine failed or restarted,
  the node was overloaded, draining or aborted the request), or a generation that ended in an
  error;
- ``caller_error``: the caller's request was wrong (4xx other than 429 and 499: a bad body, an
  unknown model, a bad key);
- ``throttled``: 429, the caller went over its rate limit (or sent too many bad keys);
- ``cancelled``: 499, the caller went away before the answer was complete;
- ``ok``: answered.

Only server failures count against a version: callers' mistakes and their rate limits say
nothing about it.
"""

from __future__ import annotations

from enum import StrEnum

from django.db.models import Q

CANCELLED_STATUS = 499  # nginx's "client closed request", which the node records


class Outcome(StrEnum):
    OK = "ok"
    SERVER_FAILURE = "server_failure"
    CALLER_ERROR = "caller_error"
    THROTTLED = "throttled"
    CANCELLED = "cancelled"


# the rollups' counter of each outcome but ok (apps/serving/models.py Counts)
COUNTERS = {
    Outcome.SERVER_FAILURE: "server_failures",
    Outcome.CALLER_ERROR: "caller_errors",
    Outcome.THROTTLED: "throttled",
    Outcome.CANCELLED: "cancelled",
}


def classify(status: int, finish_reason: str = "") -> Outcome:
    if status == CANCELLED_STATUS:
        return Outcome.CANCELLED
    if status == 429:
        return Outcome.THROTTLED
    if status >= 500:
        return Outcome.SERVER_FAILURE
    if status >= 400:
        return Outcome.CALLER_ERROR
    if finish_reason == "error":  # answered 200, then the generation failed
        return Outcome.SERVER_FAILURE
    return Outcome.OK


def q(outcome: Outcome) -> Q:
    """The request-log rows (``status``, ``finish_reason``) of ``outcome``, for queries."""
    if outcome is Outcome.CANCELLED:
        return Q(status=CANCELLED_STATUS)
    if outcome is Outcome.THROTTLED:
        return Q(status=429)
    if outcome is Outcome.SERVER_FAILURE:
        return Q(status__gte=500) | Q(status__lt=400, finish_reason="error")
    if outcome is Outcome.CALLER_ERROR:
        return Q(status__gte=400, status__lt=500) & ~Q(status__in=[429, CANCELLED_STATUS])
    return Q(status__lt=400) & ~Q(finish_reason="error")
