"""``manage.py export_requests``: the request log as JSONL or CSV, for ``replay --file``
elsewhere (the columns of ``apps.serving.replay.traces.EXPORT_FIELDS``)."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.serving.management.commands.replay import hours
from apps.serving.replay.traces import write_export
from apps.telemetry.requestlog import log_rows
from apps.tenants.errors import DomainError


class Command(BaseCommand):
    help = (
        "Write the requests that used an adapter (arrival time, tenant, alias, version id and "
        "label, size, tenant priority, tier served from, duration) to a .jsonl or .csv file, "
        "in arrival order."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("path", type=Path, help="output file: .jsonl for JSON lines, else CSV")
        parser.add_argument("--since", default="24h", help="90m, 24h, 7d")
        parser.add_argument("--tenant", default="", help="one tenant's slug")

    def handle(self, *args, path: Path, since: str, tenant: str, **options) -> None:
        if not path.parent.is_dir():
            raise CommandError(f"{path.parent}: no such folder")
        try:
            count = write_export(log_rows(since_hours=hours(since), tenant=tenant or None), path)
        except DomainError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"wrote {count} requests to {path}")
