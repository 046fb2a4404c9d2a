"""Celery tasks of the serving side: a replay started from the console."""

from __future__ import annotations

import logging
import time

from celery import shared_task
from django.utils import timezone

from apps.serving.models import ReplayRun
from apps.serving.replay import run

logger = logging.getLogger(__name__)


@shared_task(acks_late=True)
def run_replay(run_id: int) -> str:
    """Run a stored replay spec and store its report (a run already finished is left alone)."""
    row = ReplayRun.objects.filter(pk=run_id).first()
    if row is None or row.state in (ReplayRun.State.DONE, ReplayRun.State.FAILED):
        return "gone" if row is None else row.state
    ReplayRun.objects.filter(pk=run_id).update(
        state=ReplayRun.State.RUNNING, step="building the trace"
    )
    last = 0.0

    def progress(done: int, total: int, what: str) -> None:
        nonlocal last
        if time.monotonic() - last < 0.5 and done < total:  # at most two writes a second
            return
        last = time.monotonic()
        ReplayRun.objects.filter(pk=run_id).update(progress=done / total, step=what[:100])

    try:
        report = run.execute(run.Spec.from_json(row.spec), progress=progress)
    except Exception as exc:  # the operator sees why; the worker goes on
        logger.exception("replay %s failed", run_id)
        ReplayRun.objects.filter(pk=run_id).update(
            state=ReplayRun.State.FAILED,
            error=getattr(exc, "message", None) or str(exc) or type(exc).__name__,
            finished_at=timezone.now(),
        )
        return ReplayRun.State.FAILED
    ReplayRun.objects.filter(pk=run_id).update(
        state=ReplayRun.State.DONE,
        progress=1.0,
        step="done",
        report=report,
        finished_at=timezone.now(),
    )
    return ReplayRun.State.DONE
