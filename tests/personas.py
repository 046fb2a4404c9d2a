"""The people and things most tests start from, as rows (healthchecks' ``hc/test.py`` is the
model): tenant A administered by alice, rita the reviewer, the demo base model, and tenant A's
approved ``support`` versions."""

from __future__ import annotations

import json
from pathlib import Path

from apps.demo import corpus
from apps.registry import services
from apps.tenants import services as tenant_services
from apps.tenants.choices import PlatformRole, Priority, TenantRole
from tests.helpers import publish


def make_tenant_a():
    """Tenant A (premium), administered by alice."""
    tenant = tenant_services.create_tenant(
        slug="tenant-a", name="Tenant A", priority=Priority.PREMIUM
    )
    user = tenant_services.ensure_user(username="alice", password="alice-pass-123")
    tenant_services.add_member(tenant=tenant, user=user, role=TenantRole.ADMIN)
    return tenant


def make_reviewer():
    """rita, a platform reviewer."""
    user = tenant_services.ensure_user(username="rita", password="rita-pass-123")
    tenant_services.grant_platform_role(user=user, role=PlatformRole.REVIEWER)
    return user


def register_demo_base_model(demo_dir: Path):
    config = json.loads((demo_dir / "base-model" / "config.json").read_text())
    return services.register_base_model(
        name=corpus.BASE_MODEL_NAME,
        revision=corpus.BASE_MODEL_REVISION,
        model_config=config,
        max_lora_rank=16,
    )


def publish_support_versions(tenant, reviewer_user, demo_dir: Path) -> dict[str, int]:
    """Three approved versions of the tenant's 'support' adapter: v1, v2 (rank 16), v3."""
    folder = demo_dir / "adapters"
    return {
        name: publish(tenant, "support", name, folder / src, reviewer_user)
        for name, src in (("v1", "support-v1"), ("v2", "support-v2"), ("v3", "support-v1"))
    }
