"""The serving side's own records: the cache configuration an operator set, and the replays
started from the console."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class CacheSettings(models.Model):
    """The adapter-cache configuration an operator set at run time (one row; none means the
    node's YAML file applies). Stored in the seed's shape, validated before it is saved."""

    data = models.JSONField()
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return f"cache settings of {self.updated_at:%Y-%m-%d %H:%M}"


class ReplayRun(models.Model):
    """A replay an operator started from the console (``manage.py replay`` as a Celery task):
    what was asked, how far it got, and the report."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    spec = models.JSONField()
    state = models.CharField(max_length=8, choices=State.choices, default=State.QUEUED)
    progress = models.FloatField(default=0.0)  # 0..1
    step = models.CharField(max_length=100, blank=True)  # what it is doing now
    report = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"replay {self.pk} ({self.state})"
