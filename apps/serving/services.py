"""Serving workflows that console pages and the REST API share.

- ``start_replay``: a replay run row, its task queued once the row is committed.
"""

from __future__ import annotations

import functools
import logging

from django.db import transaction

from apps.serving.models import ReplayRun

logger = logging.getLogger(__name__)


QUEUE_DOWN = (
    "The replay could not be queued: the task queue (Redis) did not answer. Nothing runs; "
    "start it again once the queue is back."
)


def start_replay(*, spec: dict, actor) -> ReplayRun:
    """A replay run of ``spec``; its task is queued once the row is committed (a worker
    never looks for a row that is not there yet). A task queue that does not answer leaves
    the run failed with ``QUEUE_DOWN`` as its error."""
    with transaction.atomic():
        row = ReplayRun.objects.create(spec=spec, created_by=actor)
        transaction.on_commit(functools.partial(_queue_replay, row.pk))
    row.refresh_from_db(fields=["state", "error"])
    return row


def _queue_replay(run_id: int) -> None:
    from kombu.exceptions import OperationalError

    from apps.serving import tasks

    try:
        # progress and report live in the row: no result to subscribe to (that would retry
        # 20 s against a dead Redis, then break the process's result consumer)
        tasks.run_replay.apply_async((run_id,), ignore_result=True)
    except OperationalError:
        logger.warning("could not queue replay %s: the task queue is unreachable", run_id)
        ReplayRun.objects.filter(pk=run_id).update(state=ReplayRun.State.FAILED, error=QUEUE_DOWN)
