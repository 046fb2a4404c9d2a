"""Serving workflows that console pages and the REST API share.

- ``start_replay``: a replay run row, its task queued once the row is committed.
"""

from __future__ import annotations

import functools
import logging

from django.db import transaction

from apps.serving.models import ReplayRun
from lorahub import queueing

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
        # progress and report live in the row: no result to subscribe to
        queueing.enqueue_on_commit(
            "apps.serving.tasks.run_replay",
            row.pk,
            on_unqueued=functools.partial(_unqueued, row.pk),
        )
    row.refresh_from_db(fields=["state", "error"])
    return row


def _unqueued(run_id: int) -> None:
    ReplayRun.objects.filter(pk=run_id).update(state=ReplayRun.State.FAILED, error=QUEUE_DOWN)
