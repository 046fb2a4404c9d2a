from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.registry import keys


class Command(BaseCommand):
    help = "Create the platform's Ed25519 signing key at LORAHUB_SIGNING_KEY_FILE if missing."

    def handle(self, *args, **options) -> None:
        if settings.LORAHUB_SIGNING_KEY:
            key_id = keys.register_current_key()
            self.stdout.write(f"LORAHUB_SIGNING_KEY is set; published key {key_id}")
            return
        keys.write_new_private_key(settings.LORAHUB_SIGNING_KEY_FILE)
        key_id = keys.register_current_key()
        self.stdout.write(f"signing key {key_id} at {settings.LORAHUB_SIGNING_KEY_FILE}")
