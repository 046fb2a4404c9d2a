"""Celery tasks of the serving side: a replay started from the console; the watch that tells
the operators' webhooks when a node goes down."""

from __future__ import annotations

import logging
import time

from celery import shared_task
from django.db import transaction
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


@shared_task
def watch_nodes() -> list[str]:
    """``node.down`` to the platform's webhooks, once, for each node that stopped heartbeating
    (lost) or whose engine died and stays dead; a node that is back may go down again later.
    A node stopped cleanly is not down. Returns the nodes reported now."""
    from apps.serving import node_registry
    from apps.serving.models import ServingNode
    from apps.tenants import webhooks

    reported = []
    now = timezone.now()
    for node in ServingNode.objects.all():
        state = node_registry.state_of(node, now)
        down = state in ("lost", "dead")
        if down and node.down_notified_at is None:
            with transaction.atomic():
                ServingNode.objects.filter(pk=node.pk).update(down_notified_at=now)
                webhooks.notify(
                    "node.down",
                    tenant=None,
                    data={
                        "node": node.name,
                        "url": node.url,
                        "state": state,
                        "heartbeat_at": node.heartbeat_at.isoformat(),
                        "reason": f"{state}: last heartbeat {node.heartbeat_at:%H:%M:%S} UTC",
                    },
                )
            reported.append(node.name)
        elif not down and node.down_notified_at is not None:
            ServingNode.objects.filter(pk=node.pk).update(down_notified_at=None)
    return reported
