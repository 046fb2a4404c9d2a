"""What a vLLM user with adapters in S3 writes: a LoRA resolver plugin for stock vLLM that
downloads an adapter from S3 on its first use and serves it from a local folder afterwards —
the stock-s3 server of ``bench/many_adapters.py --profile seed`` (issue 53).

Kept small and fair: ``s3://$LH_S3_RESOLVER_BUCKET/$LH_S3_RESOLVER_PREFIX<name>$LH_S3_RESOLVER_SUFFIX/``
(the suffix: e.g. ``/1``, a version folder under the name) is
downloaded once per name (concurrent first uses wait for the one download), into
``$LH_S3_RESOLVER_CACHE_DIR/<name>`` through a temporary folder renamed when complete; the
folder is never evicted (the disk is the cache; vLLM's own ``max_cpu_loras`` LRU decides what
stays in memory), like vLLM's filesystem resolver over a folder. Credentials and endpoint
from ``LH_S3_RESOLVER_ENDPOINT``, ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY``. With
``LH_S3_RESOLVER_STATS`` set, each download appends "name bytes ms" to that file (what the
benchmark counts as this server's S3 traffic).

vLLM finds it through a ``vllm.general_plugins`` entry point: ``plugin_path`` writes one to a
folder for PYTHONPATH (nothing is installed); start stock vLLM with
``VLLM_PLUGINS=lorahub_bench_s3_resolver,lorahub_lora_fix`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (as for vLLM's filesystem resolver).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import zlib
from pathlib import Path
from typing import Any

PLUGIN = "lorahub_bench_s3_resolver"


class S3Resolver:
    def __init__(
        self,
        *,
        client: Any,
        bucket: str,
        prefix: str,
        cache_dir: Path,
        suffix: str = "",
        stats: Path | None = None,
    ) -> None:
        self.client, self.bucket, self.prefix, self.cache_dir = client, bucket, prefix, cache_dir
        self.suffix, self.stats = suffix, stats
        self._locks: dict[str, asyncio.Lock] = {}
        self.downloads = 0  # whole adapters fetched from S3
        self.bytes = 0

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> Any:
        from vllm.lora.request import LoRARequest

        if "/" in lora_name or lora_name.startswith("."):
            return None  # a model name is not a path
        folder = self.cache_dir / lora_name
        async with self._locks.setdefault(lora_name, asyncio.Lock()):
            if not folder.is_dir() and not await asyncio.to_thread(self._download, lora_name):
                return None
        # a stable id per name, as vLLM's filesystem resolver (which uses hash(); this one
        # does not change between processes)
        return LoRARequest(lora_name, zlib.crc32(lora_name.encode()) + 1, str(folder))

    def _download(self, name: str) -> bool:
        """The adapter's objects into its folder; False when S3 has none."""
        started = time.perf_counter()
        where = f"{self.prefix}{name}{self.suffix}/"
        listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix=where)
        keys = [item["Key"] for item in listed.get("Contents", [])]
        if not keys:
            return False
        partial = self.cache_dir / f".{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        got = 0
        for key in keys:
            target = partial / key.rsplit("/", 1)[1]
            self.client.download_file(self.bucket, key, str(target))
            got += target.stat().st_size
        partial.rename(self.cache_dir / name)
        self.downloads += 1
        self.bytes += got
        if self.stats is not None:
            ms = (time.perf_counter() - started) * 1000
            with self.stats.open("a") as fh:
                fh.write(f"{name} {got} {ms:.1f}\n")
        return True


def register() -> None:
    """vLLM's plugin hook: register the resolver when its settings are there."""
    if not os.environ.get("LH_S3_RESOLVER_ENDPOINT"):
        return
    import boto3
    from vllm.lora.resolver import LoRAResolverRegistry

    cache_dir = Path(os.environ["LH_S3_RESOLVER_CACHE_DIR"])
    cache_dir.mkdir(parents=True, exist_ok=True)
    client = boto3.client(
        "s3", endpoint_url=os.environ["LH_S3_RESOLVER_ENDPOINT"], region_name="us-east-1"
    )
    resolver = S3Resolver(
        client=client,
        bucket=os.environ["LH_S3_RESOLVER_BUCKET"],
        prefix=os.environ.get("LH_S3_RESOLVER_PREFIX", ""),
        suffix=os.environ.get("LH_S3_RESOLVER_SUFFIX", ""),
        cache_dir=cache_dir,
        stats=Path(os.environ["LH_S3_RESOLVER_STATS"])
        if os.environ.get("LH_S3_RESOLVER_STATS")
        else None,
    )
    LoRAResolverRegistry.register_resolver("lorahub bench S3 resolver", resolver)


def plugin_path(work: Path) -> Path:
    """A folder for PYTHONPATH that holds this module and the entry point vLLM finds it by."""
    where = work / "s3-resolver"
    dist = where / f"{PLUGIN}-0.dist-info"
    dist.mkdir(parents=True)
    shutil.copy2(Path(__file__), where / f"{PLUGIN}.py")
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN}\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\n{PLUGIN} = {PLUGIN}:register\n"
    )
    return where
