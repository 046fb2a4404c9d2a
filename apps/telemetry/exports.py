"""The daily usage export a billing system pulls from the object store:
``usage/YYYY/MM/DD.jsonl``, one CloudEvents-shaped record (JSON, structured mode) per tenant x
alias x version of that UTC day, from the ledger (``usage.py``).

Idempotent per day: a day's file is written once, after the day has ended and the nodes'
late records had ``LORAHUB_USAGE_EXPORT_DELAY_S`` to arrive, and never again (object keys are
write-once); each record's ``id`` is the same for the same day and group, so a consumer that
reads a file twice can drop the repeats. A day with no traffic gets an empty file: it was
exported, and nothing was used. Beat runs ``export_finished_days`` hourly; it catches up on
the last ``CATCH_UP_DAYS`` days after an outage.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, time, timedelta

from django.conf import settings

from apps.registry.storage import ObjectExists, get_store
from apps.telemetry import usage

EVENT_TYPE = "dev.lorahub.usage.daily.v1"
SOURCE = "/lorahub/usage"
CATCH_UP_DAYS = 7


def export_key(day: date) -> str:
    return f"usage/{day:%Y/%m/%d}.jsonl"


def day_records(day: date) -> list[dict]:
    """The day's ledger rows as CloudEvents (specversion 1.0, structured JSON)."""
    start = datetime.combine(day, time(), tzinfo=UTC)
    query = usage.Query(start, start + timedelta(days=1), usage.GROUPS, "day")
    events = []
    for row in usage.usage_rows(query, None):
        subject = f"{row['tenant']}/{row['alias']}/{row['version']}"
        data = {"day": day.isoformat(), **{k: v for k, v in row.items() if k != "period"}}
        events.append(
            {
                "specversion": "1.0",
                "type": EVENT_TYPE,
                "source": SOURCE,
                "id": f"{day.isoformat()}/{subject}",
                "time": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "subject": subject,
                "datacontenttype": "application/json",
                "data": data,
            }
        )
    return events


def export_day(day: date) -> bool:
    """Write ``day``'s file unless it exists; True if this call wrote it."""
    lines = "".join(json.dumps(e, sort_keys=True) + "\n" for e in day_records(day))
    try:
        get_store().put(export_key(day), lines.encode())
    except ObjectExists:
        return False
    return True


def export_finished_days(now: datetime | None = None) -> list[date]:
    """Export each of the last ``CATCH_UP_DAYS`` days that has ended (plus the delay for late
    records) and has no file yet; the days written."""
    now = now or datetime.now(UTC)
    last = (now - timedelta(seconds=settings.LORAHUB_USAGE_EXPORT_DELAY_S)).date() - timedelta(
        days=1
    )
    store = get_store()
    written = []
    for back in range(CATCH_UP_DAYS - 1, -1, -1):
        day = last - timedelta(days=back)
        if not store.exists(export_key(day)) and export_day(day):
            written.append(day)
    return written
