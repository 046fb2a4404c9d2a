"""Remove a user's second factor (a lost device and lost recovery codes); audited.

Usage: ``manage.py reset_second_factor USERNAME --reason "lost phone, ticket 1234"``. The user
sets up a new one at the next sign-in (reviewers and operators must, where it is required).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from apps.tenants.models import AuditEvent
from apps.tenants.signin import confirmed_devices, reset


class Command(BaseCommand):
    help = "Remove a user's second factor (TOTP and recovery codes); audited."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--reason", required=True, help="why, for the audit log")

    def handle(self, *args, username: str, reason: str, **options) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user '{username}'")
        had = len(confirmed_devices(user))
        with transaction.atomic():
            reset(user)
            AuditEvent.objects.create(
                action="second_factor.reset",
                object_type="User",
                object_id=str(user.pk),
                after={"devices_removed": had},
                note=f"by manage.py reset_second_factor: {reason}",
            )
        self.stdout.write(f"{username}: second factor removed ({had} device(s)); audited")
