"""The serving node process: not ready until the engine is, then healthy with its limits.

It reads what the session's node answered on /healthz while it started (``wait_ready`` keeps
every answer), so no engine is started for this test alone."""

from __future__ import annotations

import pytest
import yaml

from tests.harness.processes import NODE_CACHE_CONFIG

pytestmark = pytest.mark.engine


def test_node_reports_503_while_starting_then_the_model_and_lora_limits(session_node):
    config = yaml.safe_load(NODE_CACHE_CONFIG)
    *starting, ready = session_node.startup
    # the port opens before the engine is up: a load balancer saw 503s first, never a 200
    assert starting, "the node answered 200 on its first /healthz: it cannot have been starting"
    for response in starting:
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"]
        assert response.json()["engine"] in {"starting", "stopped"}
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["status"] == "ok"
    assert body["base_model"] == config["base_model"]
    assert body["base_model_revision"] == config["base_model_revision"]
    cache = config["adapter_cache"]
    assert body["lora"] == {
        "max_loras": cache["gpu_hot"]["max_adapters"],
        "max_cpu_loras": cache["cpu_warm"]["max_adapters"],
        "max_lora_rank": cache["gpu_hot"]["max_lora_rank"],
    }
