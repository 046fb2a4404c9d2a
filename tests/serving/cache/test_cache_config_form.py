"""The operator's cache-configuration form: errors beside the field, restarts named."""

from __future__ import annotations

import re

from apps.serving.models import CacheSettings
from apps.tenants.models import AuditEvent
from tests.helpers import user_client


def _form(page: str) -> dict[str, str]:
    """The form's fields as a browser would send them (checked boxes only)."""
    fields = {}
    for tag in re.findall(r"<(?:input|select)[^>]*>", page):
        name = re.search(r'name="([^"]+)"', tag)
        if not name or name[1] == "csrfmiddlewaretoken":
            continue
        if 'type="checkbox"' in tag:
            if " checked" in tag:
                fields[name[1]] = "on"
            continue
        value = re.search(r'value="([^"]*)"', tag)
        fields[name[1]] = value[1] if value else ""
    for name, body in re.findall(r'<select[^>]*name="([^"]+)"[^>]*>(.*?)</select>', page, re.S):
        fields[name] = re.search(r"<option selected>([^<]*)<", body)[1]
    return fields


def test_a_bad_value_is_shown_beside_its_field_and_nothing_is_stored(operator):
    otto = user_client("otto", "otto-pass-123")
    fields = _form(otto.get("/operator/cache/").content.decode())
    fields["adapter_cache.gpu_hot.max_adapters"] = "1"
    fields["adapter_cache.cpu_warm.ttl_minutes"] = "soon"
    response = otto.post("/operator/cache/", fields)
    assert response.status_code == 422
    page = response.content.decode()
    for key, text in (
        ("adapter_cache.gpu_hot.max_adapters", "greater than or equal to 2"),
        ("adapter_cache.cpu_warm.ttl_minutes", "valid number"),
    ):
        block = page.split(f'data-field="{key}"')[1].split('data-field="')[0]
        assert "field-error" in block and text in block, key
    assert not CacheSettings.objects.exists()


def test_a_good_change_is_stored_audited_and_names_what_needs_a_restart(operator):
    otto = user_client("otto", "otto-pass-123")
    fields = _form(otto.get("/operator/cache/").content.decode())
    fields["adapter_cache.gpu_hot.max_adapters"] = "6"
    fields["adapter_cache.gpu_hot.eviction_policy"] = "lru"
    response = otto.post("/operator/cache/", fields)
    assert response.status_code == 200
    assert "Needs a node restart: adapter_cache.gpu_hot.max_adapters" in response.content.decode()
    stored = CacheSettings.objects.get().data["adapter_cache"]
    assert stored["gpu_hot"]["max_adapters"] == 6 and stored["gpu_hot"]["eviction_policy"] == "lru"
    assert stored["placement"]["key_fields"]  # not on the form, carried over as it was
    assert AuditEvent.objects.filter(action="cache_config.set", actor__username="otto").exists()


def test_only_operators_see_the_cache_form(tenant_a, reviewer):
    assert user_client("alice", "alice-pass-123").get("/operator/cache/").status_code == 404
    assert user_client("rita", "rita-pass-123").post("/operator/cache/", {}).status_code == 404
