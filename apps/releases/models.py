"""A release of an alias, its timeline, and each tenant's default plan."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.registry.models import AdapterVersion, Alias
from apps.tenants.models import ApiKey, Tenant


class Release(models.Model):
    class State(models.TextChoices):
        PREWARMING = "prewarming"
        EVALUATING = "evaluating"
        SHADOWING = "shadowing"
        CANARY = "canary"
        PAUSED = "paused"
        PROMOTED = "promoted"
        ROLLED_BACK = "rolled_back"
        ABORTED = "aborted"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    alias = models.ForeignKey(Alias, on_delete=models.CASCADE, related_name="releases")
    candidate = models.ForeignKey(AdapterVersion, on_delete=models.PROTECT, related_name="+")
    baseline = models.ForeignKey(AdapterVersion, on_delete=models.PROTECT, related_name="+")
    plan = models.JSONField()  # plan.Plan, validated, as started
    state = models.CharField(max_length=16, choices=State.choices)
    paused_from = models.CharField(max_length=16, blank=True)  # the state resume returns to
    step = models.PositiveSmallIntegerField(default=0)  # the canary step (0-based)
    step_started_at = models.DateTimeField()  # the evidence window of the current step
    consecutive_failures = models.PositiveSmallIntegerField(default=0)
    # per-phase bookkeeping: the evaluation runs the release started
    evidence = models.JSONField(default=dict, blank=True)
    last_check = models.JSONField(default=dict, blank=True)  # the latest judgement, verbatim
    last_judged_at = models.DateTimeField(null=True, blank=True)
    outcome = models.TextField(blank=True)  # why it ended: the failed gate, or who aborted
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    ACTIVE = (
        State.PREWARMING,
        State.EVALUATING,
        State.SHADOWING,
        State.CANARY,
        State.PAUSED,
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["alias"],
                condition=models.Q(
                    state__in=["prewarming", "evaluating", "shadowing", "canary", "paused"]
                ),
                name="one_active_release_per_alias",
            )
        ]

    def __str__(self) -> str:
        return f"release #{self.pk} of {self.alias.name}"

    @property
    def holder(self) -> str:
        """How the alias names this release while it drives it (``Alias.held_by``)."""
        return f"release #{self.pk}"

    @property
    def is_active(self) -> bool:
        return self.state in self.ACTIVE


class ReleaseEvent(models.Model):
    """One entry of a release's timeline: a transition (with the gate values that decided it),
    a failed or waiting check, a control pressed, the cool-down after a rollback."""

    release = models.ForeignKey(Release, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True)
    kind = models.CharField(max_length=16)  # start, advance, check, pause, resume, promote, …
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    step = models.PositiveSmallIntegerField(default=0)
    gates = models.JSONField(default=list, blank=True)  # [{gate, value, threshold, verdict, …}]
    note = models.TextField(blank=True)
    actor = models.CharField(max_length=150, blank=True)
    timings = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"release #{self.release_id} {self.kind} at {self.at:%H:%M:%S}"


class ReleaseDefaults(models.Model):
    """A tenant's default plan (overrides of the platform's; a release may override again)."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="+")
    plan = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"release defaults of tenant {self.tenant_id}"
