"""Handing work to the Celery worker, for every app the same way.

Tasks are sent by name (each task module imports the services that send it, so the services
cannot import the tasks), without a result (``ignore_result``: subscribing to a result against
a dead Redis retries for 20 s, then breaks the process's result consumer for good), and once
the transaction that asked for the work has committed (``enqueue_on_commit``: the worker must
find the rows). A broker that does not answer never fails the caller: ``on_unqueued`` says what
happens instead (a sweep picks the work up later, or the row is marked failed with a message
that says so). pretix's ``TransactionAwareTask`` is the model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import transaction

logger = logging.getLogger(__name__)


def send(task: str, *args: object, on_unqueued: Callable[[], None] | None = None) -> bool:
    """Queue ``task`` now; False (and ``on_unqueued`` called) if the broker did not answer."""
    from lorahub.celery import app

    try:
        app.send_task(task, args=args, ignore_result=True)
    except Exception as exc:  # kombu's OperationalError, or any other broker failure
        logger.warning("could not queue %s%r: %s", task, args, exc)
        if on_unqueued is not None:
            on_unqueued()
        return False
    return True


def enqueue_on_commit(
    task: str, *args: object, on_unqueued: Callable[[], None] | None = None
) -> None:
    """Queue ``task`` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: send(task, *args, on_unqueued=on_unqueued))
