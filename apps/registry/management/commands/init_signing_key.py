from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.registry import bundles, keys


class Command(BaseCommand):
    help = (
        "Create the platform's keys if missing: the Ed25519 signing key at "
        "LORAHUB_SIGNING_KEY_FILE and the ECDSA P-256 model-signing key beside it (or at "
        "LORAHUB_BUNDLE_KEY_FILE)."
    )

    def handle(self, *args, **options) -> None:
        # keys held as files get their bundle key as a file beside them; keys held inline
        # (a Kubernetes Secret) must hold it inline too: a file made here would differ per pod
        if settings.LORAHUB_BUNDLE_KEY:
            self.stdout.write("LORAHUB_BUNDLE_KEY is set")
        elif settings.LORAHUB_BUNDLE_KEY_FILE or not settings.LORAHUB_SIGNING_KEY:
            bundles.write_new_key(bundles.bundle_key_file())
            self.stdout.write(f"model-signing key at {bundles.bundle_key_file()}")
        else:
            self.stderr.write(
                "LORAHUB_SIGNING_KEY is set but LORAHUB_BUNDLE_KEY is not: approving a version "
                "will fail until it is (openssl genpkey -algorithm EC -pkeyopt "
                "ec_paramgen_curve:P-256)"
            )
        if settings.LORAHUB_SIGNING_KEY:
            key_id = keys.register_current_key()
            self.stdout.write(f"LORAHUB_SIGNING_KEY is set; published key {key_id}")
            return
        keys.write_new_private_key(settings.LORAHUB_SIGNING_KEY_FILE)
        key_id = keys.register_current_key()
        self.stdout.write(f"signing key {key_id} at {settings.LORAHUB_SIGNING_KEY_FILE}")
