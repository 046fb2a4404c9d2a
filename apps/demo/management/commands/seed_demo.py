from __future__ import annotations

import json
import secrets
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import transaction

from apps.registry import aliases, review, services
from apps.registry.choices import VersionState
from apps.registry.models import AdapterVersion
from apps.tenants import services as tenant_services
from apps.tenants.auth import principal_for_user
from apps.tenants.choices import PlatformRole, Priority, TenantRole
from apps.tenants.models import ApiKey, Tenant
from lorahub.cacheconfig import load_cache_config

DEMO_USERS = {
    "alice": "tenant admin of 'acme'",
    "bob": "tenant admin of 'globex'",
    "rita": "reviewer",
    "otto": "operator",
}
# tenant -> adapter id -> demo adapter folders (versions, in order); the alias points at the first
DEMO_ADAPTERS = {
    "acme": {"support": ["support-v1", "support-v2"]},
    "globex": {"legal": ["legal-v1"]},
}


def publish_folder(tenant, owner, reviewer, adapter_id, version, folder) -> AdapterVersion:
    """Upload ``folder``'s files as ``adapter_id`` ``version``, validate them in this process and
    approve them, skipping the steps already done (the demo seed, benchmarks)."""
    existing = AdapterVersion.objects.filter(
        adapter__tenant=tenant, adapter__adapter_id=adapter_id, version=version
    ).first()
    if existing is None:
        files = [p for p in sorted(folder.iterdir()) if p.is_file()]
        handles = [p.open("rb") for p in files]
        try:
            existing = services.upload_version(
                principal=owner,
                tenant=tenant,
                adapter_id=adapter_id,
                version=version,
                files=[
                    services.UploadFile(p.name, h, p.stat().st_size)
                    for p, h in zip(files, handles, strict=True)
                ],
                training_data_summary=f"demo adapter {folder.name}",
            )
        finally:
            for h in handles:
                h.close()
    if existing.state == VersionState.VALIDATING:
        existing = services.validate_version(version_id=existing.pk)
    if existing.state == VersionState.PENDING_REVIEW:
        existing = review.approve_version(
            version_id=existing.pk, principal=reviewer, note="demo seed"
        )
    return existing


class Command(BaseCommand):
    help = (
        "Create the demo tenants, users, API keys and published demo adapters (idempotent) "
        "and print the credentials."
    )

    def handle(self, *args, **options) -> None:
        secrets_ = self._secrets()
        with transaction.atomic():
            tenants = {
                "acme": self._tenant("acme", "Acme Support", Priority.PREMIUM),
                "globex": self._tenant("globex", "Globex Legal", Priority.STANDARD),
            }
            users = {
                name: tenant_services.ensure_user(username=name, password=secrets_[name])
                for name in DEMO_USERS
            }
            tenant_services.add_member(
                tenant=tenants["acme"], user=users["alice"], role=TenantRole.ADMIN
            )
            tenant_services.add_member(
                tenant=tenants["globex"], user=users["bob"], role=TenantRole.ADMIN
            )
            tenant_services.grant_platform_role(user=users["rita"], role=PlatformRole.REVIEWER)
            tenant_services.grant_platform_role(user=users["otto"], role=PlatformRole.OPERATOR)
            self._register_base_model()
        for slug, tenant in tenants.items():
            self._demo_key(tenant, secrets_, f"{slug}-key")
        self._save_secrets(secrets_)
        self._publish_adapters(tenants, users)
        self.stdout.write("Demo accounts (sign in at the console):")
        for name, what in DEMO_USERS.items():
            self.stdout.write(f"  {name:<6} password {secrets_[name]}   ({what})")
        self.stdout.write("Demo API keys (Authorization: Bearer <key>):")
        for slug in tenants:
            self.stdout.write(f"  {slug:<6} {secrets_[f'{slug}-key']}")

    def _tenant(self, slug: str, name: str, priority: int) -> Tenant:
        return Tenant.objects.filter(slug=slug).first() or tenant_services.create_tenant(
            slug=slug, name=name, priority=priority
        )

    def _register_base_model(self) -> None:
        config_path = Path(settings.LORAHUB_BASE_MODEL_DIR) / "config.json"
        if not config_path.exists():
            self.stdout.write(f"no base model at {config_path}; run build_demo_assets first")
            return
        cache = load_cache_config(settings.LORAHUB_CACHE_CONFIG)
        services.register_base_model(
            name=cache.base_model,
            revision=cache.base_model_revision,
            model_config=json.loads(config_path.read_text()),
            max_lora_rank=cache.adapter_cache.gpu_hot.max_lora_rank,
        )

    def _demo_key(self, tenant: Tenant, secrets_: dict[str, str], label: str) -> None:
        stored = secrets_.get(label)
        if stored and tenant_services.authenticate_api_key(stored):
            return
        for old in ApiKey.objects.active().filter(tenant=tenant, name="demo"):
            tenant_services.revoke_api_key(key=old, actor=None)
        _, plaintext = tenant_services.issue_api_key(tenant=tenant, name="demo", actor=None)
        secrets_[label] = plaintext

    def _publish_adapters(self, tenants: dict[str, Tenant], users) -> None:
        """Upload, validate, approve and alias the demo adapters, skipping what exists."""
        adapters_dir = Path(settings.LORAHUB_DEMO_DIR) / "adapters"
        if not adapters_dir.exists():
            return
        reviewer = principal_for_user(users["rita"])
        owners = {"acme": users["alice"], "globex": users["bob"]}
        for slug, adapters in DEMO_ADAPTERS.items():
            owner = principal_for_user(owners[slug])
            for adapter_id, folders in adapters.items():
                published = []
                for n, folder in enumerate(folders, start=1):
                    version = publish_folder(
                        tenants[slug],
                        owner,
                        reviewer,
                        adapter_id,
                        f"demo.{n}",
                        adapters_dir / folder,
                    )
                    published.append(version)
                if published and published[0].state == VersionState.APPROVED:
                    alias = tenants[slug].aliases.filter(name=adapter_id).first()
                    if alias is None:
                        aliases.set_alias(
                            principal=owner,
                            tenant=tenants[slug],
                            name=adapter_id,
                            version_id=published[0].pk,
                            reason="demo seed",
                        )

    def _secrets(self) -> dict[str, str]:
        """Random per install, kept (mode 0600) under var/ so every run prints the same ones."""
        path = settings.VAR_DIR / "demo-credentials.json"
        stored: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
        for name in DEMO_USERS:
            stored.setdefault(name, secrets.token_urlsafe(9))
        return stored

    def _save_secrets(self, stored: dict[str, str]) -> None:
        path = settings.VAR_DIR / "demo-credentials.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stored, indent=2))
        path.chmod(0o600)
