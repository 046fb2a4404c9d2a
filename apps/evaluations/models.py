"""Evaluation sets (immutable revisions of JSONL cases attached to an adapter) and evaluation
runs (a candidate version against a baseline on one set revision, case by case)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.registry.models import Adapter, AdapterVersion
from apps.tenants.models import ApiKey, Tenant


class EvaluationSet(models.Model):
    """A named set of cases of one adapter; its content lives in immutable revisions."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="evaluation_sets")
    name = models.CharField(max_length=63)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["adapter", "name"], name="one_set_name_per_adapter")
        ]

    def __str__(self) -> str:
        return f"{self.adapter.adapter_id}/{self.name}"


class EvaluationSetRevision(models.Model):
    """One upload of a set: never changed; a new upload is a new revision."""

    set = models.ForeignKey(EvaluationSet, on_delete=models.CASCADE, related_name="revisions")
    revision = models.PositiveIntegerField()
    cases = models.JSONField()  # [Case.as_json(), ...] as validated
    case_count = models.PositiveIntegerField()
    size_bytes = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by_key = models.ForeignKey(
        ApiKey, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["set", "revision"], name="one_revision_number_per_set")
        ]

    def __str__(self) -> str:
        return f"{self.set}#{self.revision}"

    @property
    def label(self) -> str:
        return f"{self.set.name}#{self.revision}"


class EvaluationRun(models.Model):
    """A candidate version against a baseline on one set revision. Read-only for the
    registry: a run never moves an alias."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    set_revision = models.ForeignKey(
        EvaluationSetRevision, on_delete=models.PROTECT, related_name="runs"
    )
    candidate = models.ForeignKey(AdapterVersion, on_delete=models.PROTECT, related_name="+")
    baseline = models.ForeignKey(AdapterVersion, on_delete=models.PROTECT, related_name="+")
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    cases_done = models.PositiveIntegerField(default=0)
    cases_total = models.PositiveIntegerField(default=0)
    node = models.CharField(max_length=100, blank=True)
    summary = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by_key = models.ForeignKey(
        ApiKey, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        indexes = [models.Index(fields=["tenant", "-created_at"], name="eval_run_tenant_created")]

    def __str__(self) -> str:
        return f"run {self.pk}: {self.candidate.label} vs {self.baseline.label}"


class EvaluationCaseResult(models.Model):
    """One case of a run: both versions' answers, and how each was judged."""

    run = models.ForeignKey(EvaluationRun, on_delete=models.CASCADE, related_name="results")
    index = models.PositiveIntegerField()
    case_id = models.CharField(max_length=100)
    candidate_output = models.TextField(blank=True)
    baseline_output = models.TextField(blank=True)
    candidate_checks = models.JSONField(default=dict)  # expectation -> passed
    baseline_checks = models.JSONField(default=dict)
    candidate_passed = models.BooleanField(default=False)
    baseline_passed = models.BooleanField(default=False)
    exact_match = models.BooleanField(default=False)
    similarity = models.FloatField(default=0)  # 0..1, token level (rapidfuzz)
    candidate_tokens = models.PositiveIntegerField(default=0)
    baseline_tokens = models.PositiveIntegerField(default=0)
    candidate_ttft_ms = models.FloatField(null=True)
    baseline_ttft_ms = models.FloatField(null=True)
    candidate_error = models.CharField(max_length=200, blank=True)
    baseline_error = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["index"]
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="one_result_per_case")]

    def __str__(self) -> str:
        return f"{self.run_id}/{self.case_id}"
