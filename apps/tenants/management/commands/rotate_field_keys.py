"""Seal every sealed secret again with the first of LORAHUB_FIELD_KEYS (docs/security.md):
put the new key first, run this, then drop the old key."""

from __future__ import annotations

from django.core.management.base import BaseCommand
from django.db import transaction

from apps.tenants import sealing
from apps.tenants.models import SealedTOTPDevice, Webhook


class Command(BaseCommand):
    help = "Re-seal TOTP keys and webhook secrets with the first key of LORAHUB_FIELD_KEYS."

    @transaction.atomic
    def handle(self, *args, **options) -> None:
        devices = hooks = 0
        for device in SealedTOTPDevice.objects.select_for_update():
            SealedTOTPDevice.objects.filter(pk=device.pk).update(key=sealing.reseal(device.key))
            devices += 1
        for hook in Webhook.objects.select_for_update():
            Webhook.objects.filter(pk=hook.pk).update(secret=sealing.reseal(hook.secret))
            hooks += 1
        self.stdout.write(
            f"re-sealed {devices} TOTP key(s) and {hooks} webhook secret(s) with the first key; "
            "recovery codes are checked against every listed key (renew codes before dropping "
            "a key they were made under)"
        )
