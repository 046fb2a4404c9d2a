"""Per-request statistics and their per-minute rollups, written off the request path.

The tables were created by the serving app and keep its names (``db_table``)."""

from __future__ import annotations

from django.db import models

from apps.telemetry.histograms import HISTOGRAMS, bucket_fields
from apps.tenants.models import Tenant


class RequestLog(models.Model):
    """One inference request as the node saw it. Kept for LORAHUB_REQUEST_LOG_RETENTION_DAYS."""

    at = models.DateTimeField(db_index=True)
    node = models.CharField(max_length=100)
    tenant = models.ForeignKey(Tenant, null=True, on_delete=models.SET_NULL, related_name="+")
    alias = models.CharField(max_length=63, blank=True)
    adapter_id = models.CharField(max_length=63, blank=True)
    version = models.CharField(max_length=64, blank=True)
    tier = models.CharField(max_length=8, blank=True)  # L1..L4, base, or "" if never placed
    degraded = models.BooleanField(default=False)
    load_ms = models.FloatField(default=0)
    # the load's own work (fetch, verify or check, engine add), without waits for a load
    # slot; null when the request caused no load: the replay's per-tier costs (requestlog.py)
    load_work_ms = models.FloatField(null=True)
    load_caused = models.BooleanField(default=False)  # it started the load (usage's loads)
    queue_ms = models.FloatField(default=0)
    ttft_ms = models.FloatField(null=True)
    total_ms = models.FloatField(default=0)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    status = models.PositiveSmallIntegerField()
    error = models.CharField(max_length=64, blank=True)
    # output-quality markers (apps/telemetry/quality.py)
    finish_reason = models.CharField(max_length=8, blank=True)  # stop, length, error, abort
    empty_output = models.BooleanField(default=False)
    json_valid = models.BooleanField(null=True)  # null: JSON was not asked for
    json_matches = models.BooleanField(null=True)  # null: no schema asked for
    refused = models.BooleanField(default=False)  # vLLM refused the request itself

    class Meta:
        db_table = "serving_requestlog"  # created by the serving app
        indexes = [models.Index(fields=["tenant", "at"])]

    def __str__(self) -> str:
        return f"{self.at:%H:%M:%S} {self.alias or '-'} {self.status}"


class Counts(models.Model):
    """What a rollup row counts over its period (the histograms are added below)."""

    requests = models.PositiveIntegerField(default=0)
    # What became of the requests (apps/telemetry/outcomes.py, the one definition); charts and
    # gates read server_failures.
    server_failures = models.PositiveIntegerField(default=0)
    caller_errors = models.PositiveIntegerField(default=0)
    throttled = models.PositiveIntegerField(default=0)
    cancelled = models.PositiveIntegerField(default=0)
    # minutes in this row counted before the outcomes existed, whose request log was gone
    # when they were re-derived: their outcomes are unknown (charts leave a gap)
    legacy_minutes = models.PositiveIntegerField(default=0)
    degraded = models.PositiveIntegerField(default=0)
    hits_l1 = models.PositiveIntegerField(default=0)
    hits_l2 = models.PositiveIntegerField(default=0)
    hits_l3 = models.PositiveIntegerField(default=0)
    hits_l4 = models.PositiveIntegerField(default=0)
    ttft_ms_sum = models.FloatField(default=0)
    ttft_ms_max = models.FloatField(default=0)
    ttft_count = models.PositiveIntegerField(default=0)
    load_ms_sum = models.FloatField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    # usage (apps/telemetry/usage.py): requests that made the node load their adapter (fetch,
    # verify, add to the engine), and the engine's time on the requests it answered: seconds
    # from a seat in the engine to the last token, and those seconds times the request's
    # tokens (an upper bound on its KV-cache occupancy: completion tokens arrive during it)
    loads = models.PositiveIntegerField(default=0)
    engine_ms_sum = models.FloatField(default=0)
    engine_token_s_sum = models.FloatField(default=0)
    # output-quality markers (apps/telemetry/quality.py): how answers finished, empty answers,
    # requests vLLM refused, and of the requests that asked for JSON, answers that did not
    # parse or did not match the schema asked for
    finish_stop = models.PositiveIntegerField(default=0)
    finish_length = models.PositiveIntegerField(default=0)
    finish_error = models.PositiveIntegerField(default=0)
    empty_outputs = models.PositiveIntegerField(default=0)
    refused = models.PositiveIntegerField(default=0)
    json_requests = models.PositiveIntegerField(default=0)
    json_invalid = models.PositiveIntegerField(default=0)
    json_mismatched = models.PositiveIntegerField(default=0)

    class Meta:
        abstract = True


class RollupCounts(Counts):
    """The counts of one tenant/alias/version."""

    tenant = models.ForeignKey(Tenant, null=True, on_delete=models.CASCADE, related_name="+")
    alias = models.CharField(max_length=63, blank=True)
    adapter_id = models.CharField(max_length=63, blank=True)
    version = models.CharField(max_length=64, blank=True)

    class Meta:
        abstract = True


class RequestMinute(RollupCounts):
    """Requests per minute per tenant/alias/version: what the dashboards read."""

    minute = models.DateTimeField()

    class Meta:
        db_table = "serving_requestminute"  # created by the serving app
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "tenant", "alias", "adapter_id", "version"],
                name="one_rollup_per_minute",
            )
        ]
        indexes = [models.Index(fields=["tenant", "minute"], name="rollup_tenant_minute")]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} {self.alias} x{self.requests}"


class RequestRollup(RollupCounts):
    """The same counts per 5 minutes and per hour (``step_s`` 300 or 3600), written with the
    minute rows: a week's chart reads ~2,000 five-minute rows and 90 days ~2,000 hourly rows
    per alias instead of grouping 10,080 or 129,600 minutes at read time."""

    step_s = models.PositiveIntegerField()
    start = models.DateTimeField()

    class Meta:
        db_table = "serving_requestrollup"  # created by the serving app
        constraints = [
            models.UniqueConstraint(
                fields=["step_s", "start", "tenant", "alias", "adapter_id", "version"],
                name="one_rollup_per_step",
            )
        ]
        indexes = [
            models.Index(fields=["step_s", "tenant", "start"], name="rollup_step_tenant_start")
        ]

    def __str__(self) -> str:
        return f"{self.start:%Y-%m-%d %H:%M} +{self.step_s}s {self.alias} x{self.requests}"


class PlatformRollup(Counts):
    """Every tenant's counts together per minute, 5 minutes and hour (``step_s`` 60, 300,
    3600), written with the per-tenant rows: the operator's charts read one row per step
    instead of grouping every tenant's and alias's rows at read time (a day of minutes for
    100 tenants of 10 aliases is 1.4 million rows; here it is 1,440)."""

    step_s = models.PositiveIntegerField()
    start = models.DateTimeField()

    class Meta:
        db_table = "serving_platformrollup"  # created by the serving app
        constraints = [
            models.UniqueConstraint(fields=["step_s", "start"], name="one_platform_row_per_step")
        ]

    def __str__(self) -> str:
        return f"{self.start:%Y-%m-%d %H:%M} +{self.step_s}s platform x{self.requests}"


# Latency histograms (``histograms.BOUNDS_MS``): ttft_b00..b15, load_l3_b00.., load_l4_b00..,
# one count per bucket, so that percentiles over any range are sums of columns.
for _model in (RequestMinute, RequestRollup, PlatformRollup):
    for _prefix in HISTOGRAMS:
        for _name in bucket_fields(_prefix):
            _model.add_to_class(_name, models.PositiveIntegerField(default=0))


class ShadowMinute(models.Model):
    """Shadow traffic per minute per (alias, live version, shadow version): requests mirrored,
    dropped (the node was busy, or shadow work was over its budget), and how the shadow's
    answers compared with the live ones. Prompts and answers are never stored here."""

    minute = models.DateTimeField()
    tenant = models.ForeignKey(Tenant, null=True, on_delete=models.CASCADE, related_name="+")
    alias = models.CharField(max_length=63)
    version = models.CharField(max_length=64)  # the live answer's version
    shadow_version = models.CharField(max_length=64)
    mirrored = models.PositiveIntegerField(default=0)  # offered to the shadow
    dropped_busy = models.PositiveIntegerField(default=0)
    dropped_budget = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)  # the shadow failed (the caller did not)
    compared = models.PositiveIntegerField(default=0)
    exact = models.PositiveIntegerField(default=0)
    similarity_sum = models.FloatField(default=0)
    length_ratio_sum = models.FloatField(default=0)  # shadow length / live length
    finish_agree = models.PositiveIntegerField(default=0)
    json_compared = models.PositiveIntegerField(default=0)
    json_agree = models.PositiveIntegerField(default=0)
    ttft_ms_sum = models.FloatField(default=0)  # the shadow's
    ttft_count = models.PositiveIntegerField(default=0)
    ttft_ms_max = models.FloatField(default=0)
    live_ttft_ms_sum = models.FloatField(default=0)
    live_ttft_count = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "serving_shadowminute"  # created by the serving app
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "tenant", "alias", "version", "shadow_version"],
                name="one_shadow_minute",
            )
        ]
        indexes = [models.Index(fields=["tenant", "alias", "minute"], name="shadow_alias_minute")]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} {self.alias} shadow {self.shadow_version}"


class ShadowExample(models.Model):
    """A request with its live and shadow answers, kept only for an alias whose shadow keeps
    examples: the newest ``SHADOW_EXAMPLES`` per (alias, shadow version), for
    ``LORAHUB_SHADOW_EXAMPLE_RETENTION_DAYS``; texts cut at ``EXAMPLE_CHARS``."""

    at = models.DateTimeField()
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    alias = models.CharField(max_length=63)
    version = models.CharField(max_length=64)
    shadow_version = models.CharField(max_length=64)
    request = models.TextField()  # the prompt, or the chat messages as JSON
    live_output = models.TextField(blank=True)
    shadow_output = models.TextField(blank=True)
    similarity = models.FloatField(default=0)

    class Meta:
        db_table = "serving_shadowexample"  # created by the serving app
        indexes = [
            models.Index(fields=["tenant", "alias", "shadow_version", "-at"], name="shadow_example")
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.alias} shadow {self.shadow_version}"


class CacheMinute(models.Model):
    """A node's adapter cache per minute and tenant: evictions from the engine (L2) and from
    disk (L3), and the most versions held in the device slots (hot) and the engine (warm).
    Written only for minutes in which something was evicted or residency changed."""

    minute = models.DateTimeField()
    node = models.CharField(max_length=100)
    tenant = models.ForeignKey(Tenant, null=True, on_delete=models.CASCADE, related_name="+")
    evictions_l2 = models.PositiveIntegerField(default=0)
    evictions_l3 = models.PositiveIntegerField(default=0)
    hot = models.PositiveIntegerField(default=0)
    warm = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "serving_cacheminute"  # created by the serving app
        constraints = [
            models.UniqueConstraint(fields=["minute", "node", "tenant"], name="one_cache_minute")
        ]
        indexes = [models.Index(fields=["tenant", "minute"], name="cache_tenant_minute")]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} {self.node} hot={self.hot} warm={self.warm}"
