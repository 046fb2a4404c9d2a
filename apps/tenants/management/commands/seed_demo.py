from __future__ import annotations

import json
import secrets

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import transaction

from apps.tenants import services
from apps.tenants.choices import PlatformRole, Priority, TenantRole
from apps.tenants.models import Tenant

DEMO_USERS = {
    # username: (what they are, how they are set up)
    "alice": "tenant admin of 'acme'",
    "bob": "tenant admin of 'globex'",
    "rita": "reviewer",
    "otto": "operator",
}


class Command(BaseCommand):
    help = "Create the demo tenants and users (idempotent) and print their credentials."

    def handle(self, *args, **options) -> None:
        passwords = self._passwords()
        with transaction.atomic():
            acme = Tenant.objects.filter(slug="acme").first() or services.create_tenant(
                slug="acme", name="Acme Support", priority=Priority.PREMIUM
            )
            globex = Tenant.objects.filter(slug="globex").first() or services.create_tenant(
                slug="globex", name="Globex Legal", priority=Priority.STANDARD
            )
            users = {
                name: services.ensure_user(username=name, password=passwords[name])
                for name in DEMO_USERS
            }
            services.add_member(tenant=acme, user=users["alice"], role=TenantRole.ADMIN)
            services.add_member(tenant=globex, user=users["bob"], role=TenantRole.ADMIN)
            services.grant_platform_role(user=users["rita"], role=PlatformRole.REVIEWER)
            services.grant_platform_role(user=users["otto"], role=PlatformRole.OPERATOR)
        self.stdout.write("Demo accounts (sign in at the console):")
        for name, what in DEMO_USERS.items():
            self.stdout.write(f"  {name:<6} password {passwords[name]}   ({what})")

    def _passwords(self) -> dict[str, str]:
        """Random per install, kept (mode 0600) under var/ so every run prints the same ones."""
        path = settings.VAR_DIR / "demo-credentials.json"
        stored: dict[str, str] = {}
        if path.exists():
            stored = json.loads(path.read_text())
        changed = False
        for name in DEMO_USERS:
            if name not in stored:
                stored[name] = secrets.token_urlsafe(9)
                changed = True
        if changed:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(stored, indent=2))
            path.chmod(0o600)
        return stored
