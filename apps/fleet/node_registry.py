"""The node registry: each serving node registers itself, heartbeats, and says when it stops.

A node writes its own row (``heartbeat`` at start and every ``LORAHUB_NODE_HEARTBEAT_S``,
``deregister`` on a clean stop); the control plane reads the rows
(``listing``) to show the fleet and to render HAProxy's backend list. A node that stops
heartbeating is ``lost`` after ``LORAHUB_NODE_LOST_AFTER_S``; its row stays so an operator sees
what went away, and it comes back by itself when the node restarts under the same name.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from apps.fleet.models import ServingNode

STATES = ("ready", "starting", "restarting", "draining", "dead", "lost", "stopped")


@dataclass(frozen=True)
class Identity:
    """What a node says about itself."""

    name: str
    url: str
    base_model: str = ""
    base_model_revision: str = ""
    max_loras: int = 0
    max_cpu_loras: int = 0
    max_lora_rank: int = 0

    def fields(self) -> dict:
        return {
            "url": self.url,
            "base_model": self.base_model,
            "base_model_revision": self.base_model_revision,
            "max_loras": self.max_loras,
            "max_cpu_loras": self.max_cpu_loras,
            "max_lora_rank": self.max_lora_rank,
        }


def node_header() -> dict[str, str]:
    """``X-Lorahub-Node: <this node's name>``, on every answer of a node, so a caller behind a
    router (and a test) can tell which node answered."""
    return {"X-Lorahub-Node": settings.LORAHUB_NODE_NAME}


def heartbeat(identity: Identity, *, engine: str, started_at: datetime) -> None:
    """Write the node's row: at start, every few seconds after, and when its engine changes
    state (re-creating the row if it was deleted, e.g. a database restored)."""
    now = timezone.now()
    ServingNode.objects.update_or_create(
        name=identity.name,
        defaults={
            **identity.fields(),
            "engine": engine,
            "started_at": started_at,
            "heartbeat_at": now,
            "stopped_at": None,
        },
    )


def deregister(name: str, *, started_at: datetime) -> None:
    """A clean stop: the row stays, marked stopped (only this run's row, not a newer one's)."""
    ServingNode.objects.filter(name=name, started_at=started_at).update(
        stopped_at=timezone.now(), engine="stopped"
    )


def state_of(node: ServingNode, now: datetime | None = None) -> str:
    now = now or timezone.now()
    if node.stopped_at is not None:
        return "stopped"
    if now - node.heartbeat_at > timedelta(seconds=settings.LORAHUB_NODE_LOST_AFTER_S):
        return "lost"
    return node.engine if node.engine in STATES else "starting"


def listing() -> list[dict]:
    """Every registered node with its state and how long ago it was heard from."""
    now = timezone.now()
    return [
        {
            "name": node.name,
            "url": node.url,
            "state": state_of(node, now),
            "base_model": node.base_model,
            "base_model_revision": node.base_model_revision,
            "lora": {
                "max_loras": node.max_loras,
                "max_cpu_loras": node.max_cpu_loras,
                "max_lora_rank": node.max_lora_rank,
            },
            "started_at": node.started_at,
            "heartbeat_at": node.heartbeat_at,
            "heartbeat_age_s": round((now - node.heartbeat_at).total_seconds(), 1),
            "stopped_at": node.stopped_at,
        }
        for node in ServingNode.objects.all()
    ]


def routable() -> list[ServingNode]:
    """The nodes HAProxy should know: every node not stopped cleanly. A lost node stays in the
    list (its health check keeps it out of rotation until it answers again)."""
    return list(ServingNode.objects.filter(stopped_at__isnull=True))
