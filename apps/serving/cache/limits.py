"""The cache's capacities in force, from the cache configuration (``lorahub/cacheconfig.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from lorahub.cacheconfig import CacheConfig

GIB = 1024**3


@dataclass
class Limits:
    """The capacities in force; replaced as a whole when an operator changes the config."""

    warm_bytes: int = 4 * GIB
    ttl_s: float = 7200.0
    disk_bytes: int = 10 * GIB
    max_fetches: int = 2
    max_loads: int = 1
    max_pending: int = 16
    verify_checksum: bool = False  # BLAKE3 on every L3 load, not only the stat seal

    @classmethod
    def from_config(cls, config: CacheConfig) -> Limits:
        cache = config.adapter_cache
        return cls(
            warm_bytes=int(cache.cpu_warm.max_memory_gb * GIB),
            ttl_s=cache.cpu_warm.ttl_minutes * 60.0,
            disk_bytes=int(cache.disk_cache.max_size_gb * GIB),
            max_fetches=cache.load_queue.max_concurrent_fetches,
            max_loads=cache.loads_at_once,
            max_pending=cache.load_queue.max_pending,
            verify_checksum=cache.disk_cache.verify_checksum,
        )
