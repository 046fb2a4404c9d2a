"""What a serving node knows of the registry: frozen values, no Django.

The registry's workflow (``aliases.py``, ``services.py``) and its loaders (``snapshots.py``)
build these; the node's cache (``apps/serving/cache``) and the replay (``apps/serving/replay``)
read only these, so the tier rules import no ORM (``tests/test_architecture.py``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

CANARY_BUCKETS = 10_000


@dataclass(frozen=True)
class ResolvedVersion:
    """What an alias means for one request: an immutable version and how to check it."""

    tenant_id: int
    tenant_slug: str
    alias: str
    adapter_id: str
    version_id: int
    version: str
    base_model: str
    base_model_revision: str
    rank: int
    storage_prefix: str
    files: tuple[tuple[str, str, int], ...]  # (name, sha256, size)
    manifest: dict[str, Any]
    signature: str
    signing_key_id: str
    is_canary: bool
    servable: bool = True

    @property
    def cache_key(self) -> tuple[int, str, str, str]:
        return (self.tenant_id, self.adapter_id, self.version, self.base_model_revision)

    @property
    def size_bytes(self) -> int:
        return sum(size for _, _, size in self.files)

    @property
    def label(self) -> str:
        return f"{self.adapter_id}@{self.version}"


@dataclass(frozen=True)
class AliasSnapshot:
    """An alias as a serving node caches it: both targets resolved, the split rule kept."""

    alias_id: int
    tenant_id: int
    name: str
    stable: ResolvedVersion
    canary: ResolvedVersion | None
    canary_percent: int
    canary_api_keys: frozenset[str]
    shadow: ResolvedVersion | None = None
    shadow_percent: int = 0
    shadow_keep_examples: bool = False

    def mirror(self, request_key: str) -> ResolvedVersion | None:
        """The shadow version, for the share of request keys that get a copy mirrored to it
        (its own buckets, independent of the canary's)."""
        if self.shadow is None or self.shadow_percent <= 0:
            return None
        bucket = canary_bucket(self.alias_id, -self.shadow.version_id, request_key)
        return self.shadow if bucket < self.shadow_percent * (CANARY_BUCKETS // 100) else None

    def choose(self, request_key: str, api_key_prefix: str | None = None) -> ResolvedVersion:
        """Listed API keys always get the canary; other request keys get it when their
        bucket falls under the canary percentage. Deterministic per request key."""
        if self.canary is not None and (
            (api_key_prefix is not None and api_key_prefix in self.canary_api_keys)
            or canary_bucket(self.alias_id, self.canary.version_id, request_key)
            < self.canary_percent * (CANARY_BUCKETS // 100)
        ):
            return self.canary
        return self.stable


def canary_bucket(alias_id: int, canary_version_id: int, request_key: str) -> int:
    """A stable bucket in [0, 10000) for this alias, canary version and request key."""
    seed = f"{alias_id}:{canary_version_id}:{request_key}".encode()
    return int.from_bytes(hashlib.sha256(seed).digest()[:8], "big") % CANARY_BUCKETS
