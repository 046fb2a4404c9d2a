"""What the node's statistics writer costs per flush, by the number of active rollup keys.

The node's stats thread (``apps/serving/node/stats_recorder.py``) wakes every
``LORAHUB_STATS_FLUSH_MS`` (2 s) and writes what the request path recorded: one bulk insert of
request rows and additive upserts of the (minute, tenant, alias, version) rows, the 5-minute and
hourly rollups and the platform rows (one statement per 200 rows of a table). It runs in the
serving process, so its CPU (and the GIL it holds) is taken from the event loop that streams
tokens. This prints, for K distinct (alias, version) keys written per flush, the median wall
time of one flush (``write_records``), the time per rollup row, and the share of one core it
takes at the 2 s flush interval; then the same flush when its rows are new (the first flush of
each minute, and of each 5-minute and hourly step, creates them); beside it, a bulk insert
of as many request-log rows (time and status only), measured in the same run: about what every
flush pays for the log whatever the rollups cost.

Runs on the database the settings name (embedded SQLite by default; ``DATABASE_URL`` for
PostgreSQL) in a throwaway schema: a temporary SQLite file, or a ``lorahub_bench_stats``
database on the server.

Usage: .venv/bin/python bench/stats_writer.py [--keys 1 10 100] [--requests 60] [--flushes 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def setup_database(work: Path) -> None:
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith("postgres"):
        import psycopg

        base, _, _ = url.rpartition("/")
        with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS lorahub_bench_stats")
            admin.execute("CREATE DATABASE lorahub_bench_stats")
        os.environ["DATABASE_URL"] = f"{base}/lorahub_bench_stats"
    else:
        os.environ["LORAHUB_VAR_DIR"] = str(work)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lorahub.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def records(tenant_id: int, keys: int, n: int, at: datetime) -> list:
    from apps.telemetry.records import RequestRecord

    return [
        RequestRecord(
            tenant_id=tenant_id,
            alias=f"alias-{i % keys}",
            adapter_id=f"adapter-{i % keys}",
            version="v1",
            tier=("L1", "L2", "L3")[i % 3],
            status=200,
            load_ms=3.0 * (i % 3),
            ttft_ms=20.0 + i % 17,
            total_ms=150.0,
            prompt_tokens=12,
            completion_tokens=16,
            at=at,
        )
        for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--requests", type=int, default=60, help="per flush (2 s at 30 req/s)")
    parser.add_argument("--flushes", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lorahub-stats-bench-") as tmp:
        setup_database(Path(tmp))
        from django.db import connection, transaction

        from apps.telemetry.models import RequestLog
        from apps.telemetry.writers import write_records
        from apps.tenants.models import Tenant

        tenant = Tenant.objects.create(slug="bench", name="bench")
        print(
            f"{connection.vendor}: {args.requests} requests per flush, median of "
            f"{args.flushes} flushes into existing rows (the first, which creates them, is not "
            "counted)\n"
        )
        print(
            f"{'keys':>6}{'rollup rows':>13}{'flush ms':>10}{'ms/row':>9}"
            f"{'core share':>12}{'new rows ms':>13}{'insert only ms':>16}"
        )
        first = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
        for keys in args.keys:
            n = max(args.requests, keys)
            at = datetime.now(UTC).replace(second=30)
            write_records("bench", records(tenant.pk, keys, n, at))  # creates the rows
            flush, fresh, insert = [], [], []
            for _ in range(args.flushes):
                batch = records(tenant.pk, keys, n, at)
                started = time.perf_counter()
                write_records("bench", batch)
                flush.append((time.perf_counter() - started) * 1000)
                first += timedelta(hours=1)  # a minute (and hour) no flush wrote yet
                batch = records(tenant.pk, keys, n, first)
                started = time.perf_counter()
                write_records("bench", batch)
                fresh.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                with transaction.atomic():
                    RequestLog.objects.bulk_create(
                        [
                            RequestLog(node="bench", tenant_id=r.tenant_id, at=r.at, status=200)
                            for r in batch
                        ],
                        batch_size=500,
                    )
                insert.append((time.perf_counter() - started) * 1000)
            ms = statistics.median(flush)
            rows = keys * 3  # the minute row, the 5-minute and the hourly rollup
            print(
                f"{keys:>6}{rows:>13}{ms:>10.1f}{ms / rows:>9.2f}{ms / 2000:>11.1%}"
                f"{statistics.median(fresh):>13.1f}{statistics.median(insert):>16.1f}"
            )
        connection.close()


if __name__ == "__main__":
    main()
