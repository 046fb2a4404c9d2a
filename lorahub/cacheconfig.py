"""The adapter-cache configuration, in the seed's YAML shape, validated at start-up.

Every error names the key it is about (``adapter_cache.gpu_hot.max_adapters: ...``), so an
operator can fix the file without reading code. The loaded object is frozen: a change at run
time makes a new object, it never mutates a shared one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from django.core.exceptions import ImproperlyConfigured
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

REQUIRED_KEY_FIELDS = ("tenant_id", "adapter_id", "adapter_version", "base_model_revision")
PolicyName = Literal["weighted", "weighted_lru", "lru", "lfu", "gdsf", "linear"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuHot(_Section):
    max_adapters: int = Field(4, ge=2, description="vLLM max_loras; one slot stays for rotation")
    max_memory_gb: float = Field(1.0, gt=0)
    max_lora_rank: int = Field(16, ge=1, le=512)
    eviction_policy: PolicyName = "weighted"


class CpuWarm(_Section):
    max_adapters: int = Field(16, ge=1, description="vLLM max_cpu_loras")
    max_memory_gb: float = Field(4.0, gt=0)
    ttl_minutes: float = Field(120, gt=0)


class DiskCache(_Section):
    max_size_gb: float = Field(10.0, gt=0)
    verify_checksum: bool = False  # BLAKE3 on every L3 load; off: the stat seal + idle scrubs


class Registry(_Section):
    require_signature: bool = True
    allow_unapproved_adapter: bool = False

    @field_validator("require_signature")
    @classmethod
    def _signature_required(cls, value: bool) -> bool:
        if not value:
            raise ValueError("lorahub only loads signed versions; remove the key or set it to true")
        return value

    @field_validator("allow_unapproved_adapter")
    @classmethod
    def _approval_required(cls, value: bool) -> bool:
        if value:
            raise ValueError(
                "lorahub never serves unapproved versions; remove the key or set it to false"
            )
        return value


SlaName = Literal["batch", "standard", "premium"]  # the tenant priorities, by name


class SlaTier(_Section):
    """What a request of one tenant tier does when its adapter is not in the engine.

    ``deadline_ms``: how long it may wait for the load (0: not at all). ``on_overload``: what
    happens when the load queue is full or the deadline passes — ``wait`` (queue for a place
    until the deadline, then 503), ``degrade`` (answer with the base model, marked
    ``X-Lorahub-Degraded: 1``) or ``reject`` (503 with ``Retry-After`` at once). The load
    itself goes on, so the next request finds the adapter warm.
    """

    deadline_ms: int = Field(ge=0, le=600_000)
    on_overload: Literal["wait", "degrade", "reject"]


def _default_sla() -> dict[str, SlaTier]:
    return {
        "premium": SlaTier(deadline_ms=30_000, on_overload="wait"),
        "standard": SlaTier(deadline_ms=10_000, on_overload="degrade"),
        "batch": SlaTier(deadline_ms=5_000, on_overload="reject"),
    }


class LoadQueue(_Section):
    max_concurrent_fetches: int = Field(2, ge=1, le=64, description="L4 to L3 downloads")
    max_concurrent_loads: int = Field(
        4, ge=1, le=16, description="L3 to L2 engine adds (at most a quarter of cpu_warm slots)"
    )
    max_pending: int = Field(16, ge=1, le=10_000, description="versions loading or queued")
    sla: dict[SlaName, SlaTier] = Field(default_factory=_default_sla)

    @field_validator("sla")
    @classmethod
    def _every_tier(cls, value: dict[str, SlaTier]) -> dict[str, SlaTier]:
        missing = [name for name in ("batch", "standard", "premium") if name not in value]
        if missing:
            raise ValueError(f"name every tenant tier; missing {', '.join(missing)}")
        return value


class Prewarm(_Section):
    """At node start: the versions most requested recently, plus a fixed list."""

    from_stats_hours: float = Field(24, ge=0, description="0 turns the statistics off")
    top: int = Field(8, ge=0, le=1000)
    aliases: tuple[str, ...] = Field((), description="'tenant-slug/alias' entries")

    @field_validator("aliases")
    @classmethod
    def _tenant_slash_alias(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [entry for entry in value if entry.count("/") != 1 or entry.startswith("/")]
        if bad:
            raise ValueError(f"write each entry as 'tenant-slug/alias', not {bad[0]!r}")
        return value


class PlacementKey(_Section):
    """``placement:`` in the YAML: what identifies a cached adapter. Always the seed's four
    fields: the node keys its tiers by the registry's version id (one per tenant, adapter and
    version) and admits a version only on its own base revision, so the key cannot be
    narrowed; listing fewer is refused rather than silently ignored."""

    key_fields: tuple[str, ...] = REQUIRED_KEY_FIELDS

    @field_validator("key_fields")
    @classmethod
    def _complete_key(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        missing = [f for f in REQUIRED_KEY_FIELDS if f not in value]
        unknown = [f for f in value if f not in REQUIRED_KEY_FIELDS]
        if missing:
            raise ValueError(
                f"must include {', '.join(missing)}: a key without them lets old weights or "
                "another base revision answer a request"
            )
        if unknown:
            raise ValueError(
                f"unknown field(s) {', '.join(unknown)}; allowed: {REQUIRED_KEY_FIELDS}"
            )
        return value


class AdapterCache(_Section):
    gpu_hot: GpuHot = GpuHot()
    cpu_warm: CpuWarm = CpuWarm()
    disk_cache: DiskCache = DiskCache()
    registry: Registry = Registry()
    placement: PlacementKey = PlacementKey()
    load_queue: LoadQueue = LoadQueue()
    prewarm: Prewarm = Prewarm()

    @property
    def loads_at_once(self) -> int:
        """``load_queue.max_concurrent_loads``, at most a quarter of the host slots: each
        load under way keeps a slot for itself, and with more so kept loads would evict
        each other's fresh versions."""
        return min(self.load_queue.max_concurrent_loads, max(1, self.cpu_warm.max_adapters // 4))

    @model_validator(mode="after")
    def _warm_holds_hot(self) -> AdapterCache:
        if self.cpu_warm.max_adapters < self.gpu_hot.max_adapters:
            raise ValueError(
                f"cpu_warm.max_adapters ({self.cpu_warm.max_adapters}) must be at least "
                f"gpu_hot.max_adapters ({self.gpu_hot.max_adapters}): "
                "every hot adapter is also warm"
            )
        return self


class CacheConfig(_Section):
    base_model: str = Field(min_length=1)
    base_model_revision: str = Field("r1", min_length=1)
    adapter_cache: AdapterCache = AdapterCache()

    def restart_fields(self, other: CacheConfig) -> list[str]:
        """The settings that differ from ``other`` and take effect only when the node
        restarts: vLLM fixes its LoRA slots, host slots and rank when it starts, and a node
        starts its engine from the configuration in force when the node process starts."""
        fields = {
            "base_model": lambda c: c.base_model,
            "base_model_revision": lambda c: c.base_model_revision,
            "adapter_cache.gpu_hot.max_adapters": lambda c: c.adapter_cache.gpu_hot.max_adapters,
            "adapter_cache.gpu_hot.max_lora_rank": lambda c: c.adapter_cache.gpu_hot.max_lora_rank,
            "adapter_cache.cpu_warm.max_adapters": lambda c: c.adapter_cache.cpu_warm.max_adapters,
        }
        return [name for name, get in fields.items() if get(self) != get(other)]


def config_problems(data: object) -> dict[str, str]:
    """Each bad key of ``data`` (dotted path, as in the YAML) with what is wrong; {} if valid."""
    if not isinstance(data, dict):
        return {"(top level)": "expected a mapping at the top level"}
    try:
        CacheConfig.model_validate(data)
    except ValidationError as exc:
        problems: dict[str, str] = {}
        for err in exc.errors():
            where = ".".join(str(part) for part in err["loc"]) or "(top level)"
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                message = NOT_CONFIG_KEYS.get(where, "unknown key (check its spelling and nesting)")
            problems.setdefault(where, message)
        return problems
    return {}


# Keys someone may look for here that are set elsewhere: what the error says instead
NOT_CONFIG_KEYS = {
    "adapter_cache.disk_cache.path": (
        "not a cache-config key: a node's disk cache is the folder LORAHUB_NODE_CACHE_DIR "
        "names (one per node); remove this key"
    ),
}


def parse_cache_config(data: object, *, source: str = "cache config") -> CacheConfig:
    """Validate a mapping in the seed's shape; raise ImproperlyConfigured naming each bad key."""
    problems = config_problems(data)
    if problems:
        raise ImproperlyConfigured(
            f"{source}: " + "; ".join(f"{where}: {message}" for where, message in problems.items())
        )
    return CacheConfig.model_validate(data)


def load_cache_config(path: Path) -> CacheConfig:
    """Read and validate the YAML file at ``path``."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ImproperlyConfigured(f"cannot read cache config {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ImproperlyConfigured(f"{path}: not valid YAML: {exc}") from None
    return parse_cache_config(data, source=str(path))
