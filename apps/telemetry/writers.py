"""Request statistics into the database: the request log, its per-minute, 5-minute and hourly
rollups, the shadow rows, the cache activity per minute, and their purge.

A node's ``StatsRecorder`` (``node/stats_recorder.py``) batches what its requests did and
writes it here (``write_records``, ``write_cache_minutes``): one bulk insert of request rows
and, per rollup table, one additive upsert of its (minute or step, tenant, alias, version)
rows (``_add_all``), summed by ``aggregate.py``. The dashboards read the rollups; the
migrations rebuild them with ``rebuild_rollups``.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Max, Sum

from apps.telemetry import aggregate
from apps.telemetry.aggregate import KEY_FIELDS, PLATFORM_STEPS, ROLLUP_STEPS, merge, step_start
from apps.telemetry.models import (
    CacheMinute,
    PlatformRollup,
    RequestLog,
    RequestMinute,
    RequestRollup,
    ShadowExample,
    ShadowMinute,
)
from apps.telemetry.records import RequestRecord, ShadowRecord
from apps.tenants.models import Tenant

logger = logging.getLogger(__name__)
BATCH = 500


def write_shadow_records(records: list[ShadowRecord]) -> None:
    """Add mirrored requests to their (minute, alias, version, shadow version) rows."""
    rows = aggregate.shadow_rows(records)
    names = ("minute", "tenant_id", "alias", "version", "shadow_version")
    ids = {key[1] for key in rows if key[1] is not None}
    known = set(Tenant.objects.filter(pk__in=ids).values_list("pk", flat=True))
    with transaction.atomic():
        _add_all(
            ShadowMinute,
            [
                (dict(zip(names, key, strict=True)), sums)
                for key, sums in rows.items()
                if key[1] is None or key[1] in known  # a tenant deleted since: its rows go
            ],
        )
        _keep_examples([r for r in records if r.example and r.tenant_id in known])


SHADOW_EXAMPLES = 20  # kept per (alias, shadow version): the newest
EXAMPLE_CHARS = 4000


def _keep_examples(records: list[ShadowRecord]) -> None:
    """Store the examples and trim each (alias, shadow version) to its newest
    ``SHADOW_EXAMPLES``."""
    records = [r for r in records if r.example and r.tenant_id is not None]
    if not records:
        return
    ShadowExample.objects.bulk_create(
        [
            ShadowExample(
                at=r.at,
                tenant_id=r.tenant_id or 0,
                alias=r.alias,
                version=r.version,
                shadow_version=r.shadow_version,
                request=r.example[0][:EXAMPLE_CHARS],
                live_output=r.example[1][:EXAMPLE_CHARS],
                shadow_output=r.example[2][:EXAMPLE_CHARS],
                similarity=r.similarity,
            )
            for r in records
            if r.example
        ]
    )
    for tenant_id, alias, shadow in {
        (r.tenant_id or 0, r.alias, r.shadow_version) for r in records
    }:
        kept = ShadowExample.objects.filter(
            tenant_id=tenant_id, alias=alias, shadow_version=shadow
        ).order_by("-at", "-id")
        stale = list(kept.values_list("id", flat=True)[SHADOW_EXAMPLES:])
        if stale:
            ShadowExample.objects.filter(id__in=stale).delete()


def write_records(node: str, records: list[RequestRecord]) -> None:
    """Store a node's batch: its request rows, and their sums added to every rollup."""
    # A tenant deleted since its requests were recorded must not fail everyone's batch: its
    # request rows keep no tenant (as SET_NULL would have left them) and it gets no rollups.
    ids = {r.tenant_id for r in records if r.tenant_id is not None}
    known = set(Tenant.objects.filter(pk__in=ids).values_list("pk", flat=True))
    gone = ids - known
    rollups = aggregate.minute_rows(r for r in records if r.tenant_id not in gone)
    if gone:
        records = [replace(r, tenant_id=None) if r.tenant_id in gone else r for r in records]
    with transaction.atomic():
        RequestLog.objects.bulk_create(
            [
                RequestLog(
                    at=r.at,
                    node=node,
                    tenant_id=r.tenant_id,
                    alias=r.alias,
                    adapter_id=r.adapter_id,
                    version=r.version,
                    tier=r.tier,
                    degraded=r.degraded,
                    load_ms=r.load_ms,
                    load_work_ms=r.load_work_ms,
                    load_caused=r.load_caused,
                    queue_ms=r.queue_ms,
                    ttft_ms=r.ttft_ms,
                    total_ms=r.total_ms,
                    prompt_tokens=r.prompt_tokens,
                    completion_tokens=r.completion_tokens,
                    status=r.status,
                    error=r.error[:64],
                    finish_reason=r.finish_reason[:8],
                    empty_output=r.empty_output,
                    json_valid=r.json_valid,
                    json_matches=r.json_matches,
                    refused=r.refused,
                )
                for r in records
            ],
            batch_size=BATCH,
        )
        coarse, platform = aggregate.coarser(rollups)
        _add_all(
            RequestMinute,
            [
                ({"minute": minute, **dict(zip(KEY_FIELDS, rest, strict=True))}, sums)
                for (minute, *rest), sums in rollups.items()
            ],
        )
        _add_all(
            RequestRollup,
            [
                ({"step_s": step, "start": start, **dict(zip(KEY_FIELDS, rest, strict=True))}, sums)
                for (step, start, *rest), sums in coarse.items()
            ],
        )
        _add_all(
            PlatformRollup,
            [({"step_s": step, "start": start}, sums) for (step, start), sums in platform.items()],
        )


UPSERT_ROWS = 200  # rows per INSERT … ON CONFLICT: ~50 parameters each, far under the limits


def _add_all(model, rows: list[tuple[dict, dict[str, float]]]) -> None:
    """Add each ``(key, sums)`` to the row ``key`` of ``model`` (created with them if
    missing); the TTFT maximum is kept as a maximum. The caller holds a transaction; the keys
    are distinct.

    Rows with a full key go in one ``INSERT … ON CONFLICT (key) DO UPDATE SET c = c +
    excluded.c`` per ``UPSERT_ROWS`` (PostgreSQL and SQLite both have it): the additions run
    in the database, so writers on several nodes never lose each other's counts, and the rows
    go in key order, so two nodes writing the same rows lock them in one order. A key with no
    tenant cannot conflict (a unique constraint treats NULLs as distinct), so those rows take
    ``_add``: an UPDATE, then an INSERT when it found no row. One statement per chunk, where
    ``_add`` costs one UPDATE and, for each row new this minute, a savepoint and an ORM
    ``create``: the savepoint and ``create`` were ~5 % of the node front's CPU under the
    many-adapter bench (py-spy, docs/performance.md)."""
    full = []
    for key, sums in rows:
        if None in key.values():
            _add(model, key, sums)
        else:
            full.append((key, sums))
    full.sort(key=lambda row: tuple(row[0].values()))
    for i in range(0, len(full), UPSERT_ROWS):
        _upsert(model, full[i : i + UPSERT_ROWS])


def _upsert(model, rows: list[tuple[dict, dict[str, float]]]) -> None:
    """One ``INSERT … ON CONFLICT … DO UPDATE`` for ``rows`` (see ``_add_all``). Table and
    column names come from the model's metadata, quoted by the backend; every value is a
    parameter, prepared by its field for this database."""
    q = connection.ops.quote_name
    table, fields = _fields(model)
    keys = list(rows[0][0])
    counted = _counted_fields(model, tuple(keys))
    columns = [fields[name][0].column for name in (*keys, *counted)]
    params: list[Any] = []
    for key, sums in rows:
        for name in keys:
            params.append(fields[name][0].get_db_prep_value(key[name], connection))
        for name in counted:
            integer = fields[name][1]
            params.append(int(sums.get(name, 0)) if integer else float(sums.get(name, 0.0)))
    placeholders = "(" + ", ".join(["%s"] * len(columns)) + ")"
    top = q(fields["ttft_ms_max"][0].column)
    sets = [
        f"{q(c)} = {q(table)}.{q(c)} + excluded.{q(c)}"
        for c in (fields[name][0].column for name in counted if name != "ttft_ms_max")
    ]
    sets.append(
        f"{top} = CASE WHEN {q(table)}.{top} < excluded.{top} "
        f"THEN excluded.{top} ELSE {q(table)}.{top} END"
    )
    conflict = ", ".join(q(fields[name][0].column) for name in keys)
    sql = (
        f"INSERT INTO {q(table)} ({', '.join(q(c) for c in columns)}) "  # noqa: S608
        f"VALUES {', '.join([placeholders] * len(rows))} "
        f"ON CONFLICT ({conflict}) DO UPDATE SET {', '.join(sets)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


@functools.cache
def _counted_fields(model, keys: tuple[str, ...]) -> list[str]:
    """The attribute names of ``model``'s columns other than its id and ``keys``."""
    _, fields = _fields(model)
    skip = {"id", *keys, *(fields[name][0].name for name in keys)}
    return [f.attname for f in model._meta.concrete_fields if f.name not in skip]


def _add(model, key: dict, sums: dict[str, float]) -> None:
    """Add ``sums`` to the row ``key`` of ``model`` (created with them if missing), for a key
    ``_upsert`` cannot take (see ``_add_all``). The caller holds a transaction.

    One UPDATE whose additions run in the database (so writers on several nodes never lose
    each other's counts), and an INSERT when it found no row. The UPDATE is written out here:
    built through the ORM (``select_for_update().get_or_create`` and ``F()`` over ~40 columns)
    a row cost 3-7 ms of the serving process's CPU, about half a core at 100 active aliases
    (bench/stats_writer.py)."""
    sums = dict(sums)
    peak = sums.pop("ttft_ms_max", 0.0)
    if _increment(model, key, sums, peak):
        return
    try:
        with transaction.atomic():  # a savepoint: another node may create it first
            model.objects.create(**key, ttft_ms_max=peak, **sums)
    except IntegrityError:
        if not _increment(model, key, sums, peak):
            raise


@functools.cache
def _fields(model) -> tuple[str, dict[str, tuple[Any, bool]]]:
    """``model``'s table, and each field (by name and by attribute name, ``tenant_id``) with
    whether it holds an integer."""
    fields: dict[str, tuple[Any, bool]] = {}
    for f in model._meta.concrete_fields:
        fields[f.name] = fields[f.attname] = (f, f.get_internal_type().endswith("IntegerField"))
    return model._meta.db_table, fields


def _increment(model, key: dict, sums: dict[str, float], peak: float) -> bool:
    """``UPDATE … SET c = c + %s, …, ttft_ms_max = the larger of it and peak WHERE key``;
    whether a row was there. Table and column names come from the model's metadata (an
    unknown name is a KeyError), quoted by the backend; every value is a parameter, prepared
    by its field for this database (a datetime as SQLite stores it, for one)."""
    q = connection.ops.quote_name
    table, fields = _fields(model)
    sets, where, params = [], [], []
    for name, value in sums.items():
        field, integer = fields[name]
        sets.append(f"{q(field.column)} = {q(field.column)} + %s")
        params.append(int(value) if integer else float(value))
    top = q(fields["ttft_ms_max"][0].column)
    sets.append(f"{top} = CASE WHEN {top} < %s THEN %s ELSE {top} END")
    params += [peak, peak]
    for name, value in key.items():
        field, _ = fields[name]
        if value is None:
            where.append(f"{q(field.column)} IS NULL")
        else:
            where.append(f"{q(field.column)} = %s")
            params.append(field.get_db_prep_value(value, connection))
    sql = f"UPDATE {q(table)} SET {', '.join(sets)} WHERE {' AND '.join(where)}"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount > 0


def _counted(minute_model) -> list[str]:
    """The columns a minute row counts (everything but its key)."""
    return [
        f.name
        for f in minute_model._meta.concrete_fields
        if f.name not in ("id", "minute", "tenant", *KEY_FIELDS)
    ]


def rebuild_rollups(
    minute_model=RequestMinute,
    rollup_model=RequestRollup,
    platform_model: Any = PlatformRollup,
) -> int:
    """Recompute every 5-minute and hourly rollup and the platform-wide rows from the minute
    rows (after a bulk load, or for rows written before those existed). Returns the rows
    written."""
    counted = _counted(minute_model)
    coarse: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    rows = minute_model.objects.values_list("minute", *KEY_FIELDS, *counted)
    for minute, *rest in rows.iterator(chunk_size=5000):
        key, values = rest[: len(KEY_FIELDS)], rest[len(KEY_FIELDS) :]
        sums = dict(zip(counted, values, strict=True))
        for step in ROLLUP_STEPS:
            merge(coarse[(step, step_start(minute, step), *key)], sums)
    rollup_model.objects.all().delete()
    rollup_model.objects.bulk_create(
        [
            rollup_model(
                step_s=step, start=start, **dict(zip(KEY_FIELDS, key, strict=True)), **sums
            )
            for (step, start, *key), sums in coarse.items()
        ],
        batch_size=2000,
    )
    if platform_model is None:  # migrations before the platform rows existed
        return len(coarse)
    return len(coarse) + rebuild_platform_rollups(minute_model, platform_model)


def rebuild_platform_rollups(minute_model=RequestMinute, platform_model=PlatformRollup) -> int:
    """Recompute every platform-wide row from the minute rows, summed in the database per
    minute; 5-minute and hourly rows are folded from those. Returns the rows written."""
    counted = _counted(minute_model)
    sums_of = {name: (Max(name) if name == "ttft_ms_max" else Sum(name)) for name in counted}
    steps: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    rows = minute_model.objects.values("minute").annotate(**sums_of).order_by("minute")
    for row in rows.iterator(chunk_size=5000):
        minute = row.pop("minute")
        sums = {name: value or 0 for name, value in row.items()}
        for step in PLATFORM_STEPS:
            merge(steps[(step, step_start(minute, step))], sums)
    platform_model.objects.all().delete()
    platform_model.objects.bulk_create(
        [platform_model(step_s=step, start=start, **sums) for (step, start), sums in steps.items()],
        batch_size=2000,
    )
    return len(steps)


def write_cache_minutes(node: str, rows: dict[tuple[datetime, int | None], dict[str, int]]) -> None:
    """Add evictions and keep the residency peak of each (minute, tenant) row."""
    ids = {tenant_id for _, tenant_id in rows if tenant_id is not None}
    known = set(Tenant.objects.filter(pk__in=ids).values_list("pk", flat=True))
    with transaction.atomic():
        for (minute, tenant_id), counts in rows.items():
            if tenant_id is not None and tenant_id not in known:
                continue
            key: dict[str, Any] = {"minute": minute, "node": node, "tenant_id": tenant_id}
            row, _ = CacheMinute.objects.select_for_update().get_or_create(**key)
            CacheMinute.objects.filter(pk=row.pk).update(
                evictions_l2=F("evictions_l2") + counts.get("evictions_l2", 0),
                evictions_l3=F("evictions_l3") + counts.get("evictions_l3", 0),
                hot=max(row.hot, counts.get("hot", 0)) if counts.get("seen") else row.hot,
                warm=max(row.warm, counts.get("warm", 0)) if counts.get("seen") else row.warm,
            )


def purge_old_statistics() -> tuple[int, int]:
    now = datetime.now(UTC)
    logs, _ = RequestLog.objects.filter(
        at__lt=now - timedelta(days=settings.LORAHUB_REQUEST_LOG_RETENTION_DAYS)
    ).delete()
    horizon = now - timedelta(days=settings.LORAHUB_ROLLUP_RETENTION_DAYS)
    rollups, _ = RequestMinute.objects.filter(minute__lt=horizon).delete()
    RequestRollup.objects.filter(start__lt=horizon).delete()
    PlatformRollup.objects.filter(start__lt=horizon).delete()
    CacheMinute.objects.filter(minute__lt=horizon).delete()
    ShadowMinute.objects.filter(minute__lt=horizon).delete()
    ShadowExample.objects.filter(
        at__lt=now - timedelta(days=settings.LORAHUB_SHADOW_EXAMPLE_RETENTION_DAYS)
    ).delete()
    return logs, rollups
