"""The node's Prometheus metrics (the seed's list), on a registry of the node's own.

Label cardinality is bounded: per-adapter series exist for at most ``MAX_ADAPTER_LABELS``
(tenant, adapter) pairs, the first ones seen since start; later pairs are counted under
``adapter="other"`` for their tenant, and tenants past ``MAX_TENANT_LABELS`` under
``tenant="other"``. Versions are never labels (they are unbounded over time); tiers are a fixed
set. So a node serving thousands of adapters exports a few hundred series, not millions.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

MAX_ADAPTER_LABELS = 200
MAX_TENANT_LABELS = 100
MS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000)
TIERS = ("L1", "L2", "L3", "L4", "base")


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._cache_metrics(self.registry)
        self._request_metrics(self.registry)
        self._node_metrics(self.registry)
        self._lock = threading.Lock()
        self._adapter_labels: set[tuple[str, str]] = set()
        self._tenant_labels: set[str] = set()
        self._tier_counts = dict.fromkeys(TIERS, 0)

    def _cache_metrics(self, r: CollectorRegistry) -> None:
        self.cache_lookups = Counter(
            "adapter_cache_lookups",
            "Adapter requests by the tier that answered them",
            ["tier"],
            registry=r,
        )
        self.hit_rate = Gauge(
            "adapter_cache_hit_rate",
            "Share of adapter requests answered from a tier (L1, L2: no load needed)",
            ["tier"],
            registry=r,
        )
        self.load_latency = Histogram(
            "adapter_load_latency_ms",
            "Time to make an adapter usable, by the tier it came from",
            ["source_tier"],
            buckets=MS_BUCKETS,
            registry=r,
        )
        self.load_boundaries = Counter(
            "adapter_engine_loads",
            "Adapter loads into the engine, by the engine step boundaries they cost before "
            "their request could run (1: the request's own step loads it; 2: an add first)",
            ["boundaries"],
            registry=r,
        )
        self.gpu_memory = Gauge(
            "adapter_gpu_memory_mb", "Size of the adapters in the engine's device slots", registry=r
        )
        self.evictions = Counter(
            "adapter_eviction_count", "Adapters evicted, by tier", ["tier"], registry=r
        )
        self.fetched_bytes = Counter(
            "adapter_fetched_bytes",
            "Bytes of adapter versions fetched from the registry's object store (L4)",
            registry=r,
        )
        self.prefetches = Counter(
            "adapter_prefetches",
            "Loads started ahead of demand, for versions whose request rate is rising",
            registry=r,
        )
        self.version_mismatch = Counter(
            "adapter_version_mismatch",
            "Requests refused because the version's base revision differs from the node's",
            registry=r,
        )
        self.quota_usage = Gauge(
            "per_tenant_adapter_quota_usage",
            "Adapters of a tenant in the engine (L1 + L2) as a share of its warm quota",
            ["tenant"],
            registry=r,
        )

    def _request_metrics(self, r: CollectorRegistry) -> None:
        self.tenant_queue = Histogram(
            "node_tenant_queue_seconds",
            "Time a request waited for a seat in the engine's batch, by tenant (the fair "
            "share: apps/serving/fairness.py)",
            ["tenant"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.tenant_tokens = Counter(
            "node_tenant_tokens",
            "Tokens the engine served each tenant: prompt (input) and completion (output)",
            ["tenant", "kind"],
            registry=r,
        )
        self.ttft = Histogram(
            "ttft_by_adapter",
            "Time to first token (ms)",
            ["tenant", "adapter"],
            buckets=MS_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "adapter_requests",
            "Inference requests by outcome (apps/telemetry/outcomes.py): ok, server_failure, "
            "caller_error, throttled, cancelled",
            ["tenant", "adapter", "outcome"],
            registry=r,
        )
        self.errors = Counter(
            "error_rate_by_adapter",
            "Server failures (5xx, failed generations) by code: rate() of this over rate() of "
            "adapter_requests is the error rate; callers' 4xx and 429 are not counted here",
            ["tenant", "adapter", "code"],
            registry=r,
        )
        self.output_markers = Counter(
            "adapter_output_markers",
            "Answers with an output-quality marker: cut (by max_tokens), empty, refused (by "
            "vLLM), json_invalid, json_mismatched (of JSON requests), failed (generation)",
            ["tenant", "adapter", "marker"],
            registry=r,
        )
        self.shadow_requests = Counter(
            "shadow_requests",
            "Copies of alias requests for their shadow version, by outcome: compared, error "
            "(the shadow failed; the caller did not), dropped_busy, dropped_budget",
            ["outcome"],
            registry=r,
        )
        self.degraded = Counter(
            "adapter_degraded",
            "Requests answered by the base model because an adapter could not be loaded in time",
            ["tenant"],
            registry=r,
        )
        self.overloaded = Counter(
            "node_overload_rejections",
            "Requests refused with 503 because the node was full",
            registry=r,
        )

    def _node_metrics(self, r: CollectorRegistry) -> None:
        self.integrity_failures = Counter(
            "adapter_integrity_failures",
            "Adapter files that failed their seal (L3, replaced) or signed manifest "
            "(L4, quarantined)",
            ["tier"],
            registry=r,
        )
        self.engine_restarts = Counter(
            "engine_restarts",
            "Times the watchdog restarted a dead vLLM engine",
            registry=r,
        )
        self.engine_ready = Gauge(
            "engine_ready",
            "1 while the engine answers, 0 while it starts, restarts or the node drains",
            registry=r,
        )
        self.load_queue = Gauge(
            "adapter_load_queue",
            "Adapter versions loading or queued to load",
            registry=r,
        )
        self.in_flight = Gauge(
            "engine_requests_in_flight",
            "Requests the engine is generating or has queued",
            registry=r,
        )
        self.stats_dropped = Counter(
            "request_stats_dropped",
            "Request statistics dropped because the writer fell behind",
            registry=r,
        )
        self.stats_backlog = Gauge(
            "request_stats_backlog",
            "Request statistics recorded but not written yet (the database is slow or away)",
            registry=r,
        )

    def labels_for(self, tenant: str, adapter: str) -> tuple[str, str]:
        """Bounded (tenant, adapter) labels: see the module docstring."""
        with self._lock:
            if tenant not in self._tenant_labels:
                if len(self._tenant_labels) >= MAX_TENANT_LABELS:
                    return "other", "other"
                self._tenant_labels.add(tenant)
            pair = (tenant, adapter)
            if pair in self._adapter_labels:
                return pair
            if len(self._adapter_labels) >= MAX_ADAPTER_LABELS:
                return tenant, "other"
            self._adapter_labels.add(pair)
            return pair

    def tenant_label(self, tenant: str) -> str:
        """A bounded tenant label (see the module docstring)."""
        return self.labels_for(tenant, "")[0]

    def loaded(self, tier: str, ms: float, size_bytes: int, boundaries: int = 2) -> None:
        """A version's load finished: its time by the tier it came from, the step boundaries
        it cost; its bytes, where it came from the object store."""
        self.load_latency.labels(source_tier=tier).observe(ms)
        self.load_boundaries.labels(boundaries=str(boundaries)).inc()
        if tier == "L4":
            self.fetched_bytes.inc(size_bytes)

    def waited(self, tenant: str, seconds: float) -> None:
        self.tenant_queue.labels(tenant=self.tenant_label(tenant)).observe(seconds)

    def served(self, tenant: str, prompt: int, completion: int) -> None:
        label = self.tenant_label(tenant)
        if prompt:
            self.tenant_tokens.labels(tenant=label, kind="prompt").inc(prompt)
        if completion:
            self.tenant_tokens.labels(tenant=label, kind="completion").inc(completion)

    def count_tier(self, tier: str) -> None:
        self.cache_lookups.labels(tier=tier).inc()
        with self._lock:
            self._tier_counts[tier] = self._tier_counts.get(tier, 0) + 1
            total = sum(count for t, count in self._tier_counts.items() if t != "base") or 1
            for t in TIERS:
                if t != "base":
                    self.hit_rate.labels(tier=t).set(self._tier_counts.get(t, 0) / total)

    def render(self) -> bytes:
        return generate_latest(self.registry)
