"""GET/PUT /api/cache-config: operators change the node's cache at run time."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ImproperlyConfigured

from apps.serving.cache.device_budget import device_slot_bytes
from apps.serving.config import effective_config, set_config
from apps.serving.models import CacheSettings
from apps.serving.node.engine import EngineSettings
from apps.tenants.models import AuditEvent
from lorahub.cacheconfig import parse_cache_config
from tests.helpers import key_client, user_client

pytestmark = pytest.mark.django_db


def put(client, data):
    return client.put("/api/cache-config", json.dumps(data), content_type="application/json")


def test_an_operator_reads_the_file_config_in_the_seeds_shape(operator):
    body = user_client("otto", "otto-pass-123").get("/api/cache-config").json()
    assert body["adapter_cache"]["gpu_hot"]["eviction_policy"] == "weighted"
    assert set(body["adapter_cache"]) >= {"gpu_hot", "cpu_warm", "disk_cache", "load_queue"}
    assert body["adapter_cache"]["load_queue"]["sla"]["batch"]["on_overload"] == "reject"


def test_a_change_is_stored_audited_and_says_what_waits_for_a_restart(operator):
    client = user_client("otto", "otto-pass-123")
    config = client.get("/api/cache-config").json()
    config["adapter_cache"]["gpu_hot"]["eviction_policy"] = "gdsf"
    config["adapter_cache"]["gpu_hot"]["max_adapters"] = 8
    config["adapter_cache"]["cpu_warm"]["max_adapters"] = 32
    response = put(client, config)
    assert response.status_code == 200, response.content
    assert response.json()["needs_restart"] == [
        "adapter_cache.gpu_hot.max_adapters",
        "adapter_cache.cpu_warm.max_adapters",
    ]
    assert client.get("/api/cache-config").json()["adapter_cache"]["gpu_hot"] == {
        **config["adapter_cache"]["gpu_hot"]
    }
    assert effective_config().adapter_cache.gpu_hot.eviction_policy == "gdsf"
    event = AuditEvent.objects.get(action="cache_config.set")
    assert event.actor.username == "otto"
    assert event.before["adapter_cache"]["gpu_hot"]["eviction_policy"] == "weighted"
    assert event.after["adapter_cache"]["gpu_hot"]["eviction_policy"] == "gdsf"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda c: c["adapter_cache"]["gpu_hot"].update(eviction_policy="random"),
            "adapter_cache.gpu_hot.eviction_policy",
        ),
        (
            lambda c: c["adapter_cache"]["cpu_warm"].update(max_adapters=1),
            "cpu_warm.max_adapters (1) must be at least gpu_hot.max_adapters",
        ),
        (
            lambda c: c["adapter_cache"]["load_queue"]["sla"].pop("batch"),
            "missing batch",
        ),
        (lambda c: c["adapter_cache"].update(gpu_hott={}), "adapter_cache.gpu_hott: unknown key"),
        (
            lambda c: c["adapter_cache"]["prewarm"].update(aliases=["support"]),
            "'tenant-slug/alias'",
        ),
        (  # 4 device slots of rank 16 on the demo model reserve 1.47 MB
            lambda c: c["adapter_cache"]["gpu_hot"].update(max_memory_gb=0.001),
            "adapter_cache.gpu_hot.max_memory_gb: 4 device slots of rank 16 for "
            "lorahub-demo-tiny reserve 1.5 MB (0.37 MB each), over the 0.001 GB budget; raise "
            "max_memory_gb to at least 0.00143 or lower max_adapters (at most 2 fit)",
        ),
    ],
)
def test_a_bad_config_is_refused_naming_the_key_and_nothing_is_stored(
    operator, demo_dir, edit, message
):
    # (demo_dir: the base model must be built for the device-slot budget to be checked)
    client = user_client("otto", "otto-pass-123")
    config = client.get("/api/cache-config").json()
    edit(config)
    response = put(client, config)
    assert response.status_code == 422
    assert message in response.json()["detail"]
    assert not CacheSettings.objects.exists()
    assert not AuditEvent.objects.filter(action="cache_config.set").exists()


def test_only_operators_read_or_change_it(tenant_a, operator):
    tenant = key_client(tenant_a)
    assert tenant.get("/api/cache-config").status_code == 403
    assert put(tenant, {"base_model": "x"}).status_code == 403
    assert (
        user_client("otto", "otto-pass-123")
        .put("/api/cache-config", "not json", content_type="application/json")
        .status_code
        == 422
    )
    assert not CacheSettings.objects.exists()


def test_the_stored_config_wins_over_the_file(operator):
    data = effective_config().model_dump(mode="json")
    data["adapter_cache"]["disk_cache"]["max_size_gb"] = 1.5
    set_config(data=data, principal=None)
    assert effective_config().adapter_cache.disk_cache.max_size_gb == 1.5


def test_the_device_slot_reservation_is_what_vllm_allocates(demo_dir):
    """vLLM reserves A and B buffers per slot for every projection, the embedding and the LM
    head at max_lora_rank. Demo model (hidden 128, MLP 256, 2 layers, vocab 704, float32):
    per layer q k v o 4 x 16 x (128 + 128) + gate up down 3 x 16 x (128 + 256) = 34,816,
    x 2 layers + embedding and head 2 x 16 x (704 + 128) = 96,256 floats = 385,024 bytes —
    the sum of a real engine's lora_a/lora_b buffers per slot."""
    demo = json.loads((demo_dir / "base-model" / "config.json").read_text())
    assert device_slot_bytes(demo, 16, "float32") == 385_024
    assert device_slot_bytes(demo, 8, "bfloat16") == 385_024 // 4  # half the rank, half the bytes
    llama3_8b = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
    }
    assert device_slot_bytes(llama3_8b, 16, "bfloat16") == 92_356_608  # ~88 MB a slot
    assert device_slot_bytes({"model_type": "mamba"}, 16, "float32") is None  # not checked


def test_a_node_whose_device_slots_exceed_the_budget_refuses_to_start_saying_why(demo_dir):
    config = effective_config().model_dump(mode="json")
    config["adapter_cache"]["gpu_hot"]["max_memory_gb"] = 0.001
    refused = r"the engine cannot start: adapter_cache\.gpu_hot\.max_memory_gb"
    with pytest.raises(ImproperlyConfigured, match=refused):
        EngineSettings.from_django_settings(parse_cache_config(config))
    assert EngineSettings.from_django_settings(effective_config()).max_loras == 4


def test_settings_stored_with_the_unread_disk_path_lose_it_and_still_load():
    """The console used to save ``disk_cache.path`` unedited with every change; the key is
    refused now, so migration 0015 drops it from the stored row, which then loads as before
    (everything else kept)."""
    from importlib import import_module

    from django.apps import apps as registry

    from apps.serving.config import SETTINGS_ID, file_config, stored_config

    data = file_config().model_dump(mode="json")
    data["adapter_cache"]["disk_cache"]["path"] = ""
    data["adapter_cache"]["disk_cache"]["max_size_gb"] = 3.0
    CacheSettings.objects.update_or_create(pk=SETTINGS_ID, defaults={"data": data})
    with pytest.raises(ImproperlyConfigured, match=r"disk_cache\.path: not a cache-config key"):
        stored_config()
    import_module("apps.serving.migrations.0015_cache_settings_without_disk_path").drop_disk_path(
        registry, None
    )
    assert stored_config().adapter_cache.disk_cache.max_size_gb == 3.0
