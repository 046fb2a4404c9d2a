"""The serving node process: not ready until the engine is, then healthy with its limits."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import ROOT, child_database_url, free_port, stop, wait_for_port

pytestmark = pytest.mark.engine


def test_node_reports_503_while_starting_then_the_model_and_lora_limits(
    demo_dir, django_db_setup, tmp_path
):
    from django.conf import settings

    from lorahub.cacheconfig import load_cache_config

    config = load_cache_config(settings.LORAHUB_CACHE_CONFIG)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runnode", "--port", str(port)],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": child_database_url(),
            "LORAHUB_NODE_CACHE_DIR": str(tmp_path / "cache"),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc, timeout=60)
        url = f"http://127.0.0.1:{port}/healthz"
        first = httpx.get(url, timeout=5)
        statuses = [first.status_code]
        if first.status_code == 503:
            assert first.headers["Retry-After"]
            assert first.json()["engine"] in {"starting", "stopped"}
        deadline = time.monotonic() + 180
        response = first
        while response.status_code != 200 and time.monotonic() < deadline:
            assert proc.poll() is None, "the node exited while starting"
            time.sleep(0.5)
            response = httpx.get(url, timeout=5)
            statuses.append(response.status_code)
        assert response.status_code == 200, statuses[-5:]
        body = response.json()
        assert body["status"] == "ok"
        assert body["base_model"] == config.base_model
        assert body["base_model_revision"] == config.base_model_revision
        assert body["lora"] == {
            "max_loras": config.adapter_cache.gpu_hot.max_adapters,
            "max_cpu_loras": config.adapter_cache.cpu_warm.max_adapters,
            "max_lora_rank": config.adapter_cache.gpu_hot.max_lora_rank,
        }
        assert 503 in statuses  # it never claimed to be ready before the engine was
    finally:
        stop(proc)
