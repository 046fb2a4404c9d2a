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
PolicyName = Literal["lru", "lfu", "weighted", "weighted_lru", "gdsf"]


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
    verify_checksum: bool = True
    path: str = ""


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


class Placement(_Section):
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
    placement: Placement = Placement()

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


def parse_cache_config(data: object, *, source: str = "cache config") -> CacheConfig:
    """Validate a mapping in the seed's shape; raise ImproperlyConfigured naming each bad key."""
    if not isinstance(data, dict):
        raise ImproperlyConfigured(f"{source}: expected a mapping at the top level")
    try:
        return CacheConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(part) for part in err["loc"]) or "(top level)"
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                message = "unknown key (check its spelling and nesting)"
            problems.append(f"{where}: {message}")
        raise ImproperlyConfigured(f"{source}: " + "; ".join(problems)) from None


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
