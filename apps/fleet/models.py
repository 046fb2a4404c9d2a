"""The fleet's records: the serving nodes as they registered themselves, and the versions a
node quarantined. The tables were created by the serving app and keep its names."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ServingNode(models.Model):
    """A serving node as it registered itself: where the control plane reaches it, what it
    serves, and when it last said it was alive. Written by the node (start, heartbeat, stop);
    read by the console, the REST API and ``manage.py haproxy_config``. Nothing here is
    authoritative for routing: HAProxy's health checks decide which node takes traffic."""

    name = models.CharField(max_length=100, unique=True)
    url = models.CharField(max_length=200)  # the node's own HTTP address (API and /internal/)
    base_model = models.CharField(max_length=200, blank=True)
    base_model_revision = models.CharField(max_length=100, blank=True)
    max_loras = models.PositiveIntegerField(default=0)
    max_cpu_loras = models.PositiveIntegerField(default=0)
    max_lora_rank = models.PositiveIntegerField(default=0)
    engine = models.CharField(max_length=16, blank=True)  # starting, ready, restarting, dead
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    # when the operators' webhooks were told it went down (tasks.watch_nodes); cleared when
    # it is back
    down_notified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "serving_servingnode"  # created by the serving app
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.url})"


class Quarantine(models.Model):
    """A node refused a version because its registry bytes failed the signed manifest. Open
    until an operator lifts it (after the registry copy verifies again); every node refuses
    the version while it has an open record of its own."""

    version = models.ForeignKey(
        "registry.AdapterVersion", on_delete=models.CASCADE, related_name="quarantines"
    )
    node = models.CharField(max_length=100)
    tier = models.CharField(max_length=4, default="L4")
    reason = models.TextField()
    at = models.DateTimeField(auto_now_add=True)
    lifted_at = models.DateTimeField(null=True, blank=True)
    lifted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    lift_note = models.TextField(blank=True)
    # when the control plane checked the node's report and audited and announced it
    # (``quarantine.announce``): a node writes the row only, never the audit row or a webhook
    announced_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "serving_quarantine"  # created by the serving app
        ordering = ["-at"]
        constraints = [
            models.UniqueConstraint(
                fields=["version", "node"],
                condition=models.Q(lifted_at__isnull=True),
                name="one_open_quarantine_per_node",
            )
        ]

    def __str__(self) -> str:
        return f"version {self.version_id} on {self.node}"
