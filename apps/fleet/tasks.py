"""Celery tasks of the fleet: the watch that tells the operators' webhooks when a node goes
down."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import transaction
from django.utils import timezone

logger = logging.getLogger(__name__)


@shared_task
def watch_nodes() -> list[str]:
    """``node.down`` to the platform's webhooks, once, for each node that stopped heartbeating
    (lost) or whose engine died and stays dead; a node that is back may go down again later.
    A node stopped cleanly is not down. Returns the nodes reported now."""
    from apps.fleet import node_registry
    from apps.fleet.models import ServingNode
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


@shared_task
def announce_quarantines() -> list[int]:
    """Nodes' quarantine reports, checked, audited and sent to webhooks (``quarantine.py``)."""
    from apps.fleet import quarantine

    return quarantine.announce()
