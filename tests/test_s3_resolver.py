"""The stock-s3 server's resolver plugin (``bench/s3_resolver.py``): what a vLLM user with
adapters in S3 writes, kept fair — one download per adapter however many first uses race,
then the local copy; a name that is not an adapter in the bucket resolves to nothing."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.s3_resolver import S3Resolver, plugin_path

pytestmark = pytest.mark.engine  # vLLM's LoRARequest: the engine's environment


def test_an_adapter_is_downloaded_once_however_many_first_uses_race(s3_server, tmp_path):
    import boto3

    s3 = boto3.client(
        "s3", endpoint_url=s3_server, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip
    bucket = "resolver-test"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="fleet/a1/v1/adapter_config.json", Body=b"{}")
    s3.put_object(Bucket=bucket, Key="fleet/a1/v1/adapter_model.safetensors", Body=b"x" * 1000)
    stats = tmp_path / "downloads.txt"
    resolver = S3Resolver(
        client=s3, bucket=bucket, prefix="fleet/", suffix="/v1", cache_dir=tmp_path, stats=stats
    )

    async def race():
        return await asyncio.gather(*(resolver.resolve_lora("base", "a1") for _ in range(5)))

    requests = asyncio.run(race())
    assert resolver.downloads == 1 and resolver.bytes == 1002
    assert stats.read_text().split()[:2] == ["a1", "1002"]  # one line per download
    assert {r.lora_path for r in requests} == {str(tmp_path / "a1")}
    assert len({r.lora_int_id for r in requests}) == 1
    assert sorted(p.name for p in (tmp_path / "a1").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    again = asyncio.run(resolver.resolve_lora("base", "a1"))
    assert again.lora_path == str(tmp_path / "a1") and resolver.downloads == 1
    assert asyncio.run(resolver.resolve_lora("base", "nope")) is None
    assert asyncio.run(resolver.resolve_lora("base", "../a1")) is None
    assert not any(p.name.endswith(".partial") for p in tmp_path.iterdir() if p.is_dir())

    found = plugin_path(tmp_path / "plugin")
    entry = next(found.glob("*.dist-info")) / "entry_points.txt"
    assert "lorahub_bench_s3_resolver:register" in entry.read_text()
