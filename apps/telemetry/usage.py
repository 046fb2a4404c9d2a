"""Usage for chargeback: per tenant x alias x version x day or hour, what the platform did for
whom. The API (``GET /api/usage``), its CSV, the console's usage page, ``lorahub usage`` and
the daily export (``exports.py``) all read through ``usage_rows``.

The ledger is the hourly rollups (``RequestRollup``, ``step_s`` 3600): the node adds each
request to them in the same transaction as its request-log row (``writers.write_records``),
so over any window of whole hours the ledger equals the request log summed (the
reconciliation test, tests/telemetry/test_usage.py). A day is its 24 UTC hours. Counted:
requests by outcome (``outcomes.py``, the one definition), prompt and completion tokens,
the loads of an adapter a request caused, and the engine's time on the requests it answered
(``aggregate.engine_ms``), in seconds and in token-seconds.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from django.db.models import F, Sum
from django.db.models.functions import TruncDay

from apps.telemetry.models import RequestRollup
from apps.tenants.errors import Invalid

GROUPS = ("tenant", "alias", "version")
GRANULARITIES = ("day", "hour")
HOUR = 3600
# the longest window one call reads: a year of days, or a month of hours
MAX_DAYS = {"day": 366, "hour": 31}
# rows per page of the API and its CSV (``limit``), and the default
MAX_PAGE = 5000
PAGE = 1000
# a cell a spreadsheet would read as a formula (OWASP's "CSV injection"): quoted as text
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# the columns of a row, in the CSV's order (after its period and group columns)
COUNTS = (
    "requests",
    "ok",
    "server_failures",
    "caller_errors",
    "throttled",
    "cancelled",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "cache_loads",
    "engine_seconds",
    "engine_token_seconds",
)
_SUMS = {
    "requests": Sum("requests"),
    "server_failures": Sum("server_failures"),
    "caller_errors": Sum("caller_errors"),
    "throttled": Sum("throttled"),
    "cancelled": Sum("cancelled"),
    "prompt_tokens": Sum("prompt_tokens"),
    "completion_tokens": Sum("completion_tokens"),
    "cache_loads": Sum("loads"),
    "engine_ms": Sum("engine_ms_sum"),
    "engine_token_s": Sum("engine_token_s_sum"),
}


@dataclass(frozen=True)
class Query:
    start: datetime  # inclusive, on an hour
    end: datetime  # exclusive, on an hour
    group_by: tuple[str, ...]
    granularity: str

    @property
    def columns(self) -> list[str]:
        return ["period", *self.group_by, *COUNTS]


def parse_query(
    start: str | None, end: str | None, group_by: str | None, granularity: str | None
) -> Query:
    """The window and grouping a caller asked for, or ``Invalid`` saying what to send.
    Without ``from``: the first day of this month (UTC); without ``to``: now, rounded up to
    the next hour. A date is its day's 00:00 UTC; ``to`` is exclusive."""
    grain = granularity or "day"
    if grain not in GRANULARITIES:
        raise Invalid(f"granularity '{grain}' is not one of: {', '.join(GRANULARITIES)}")
    groups = tuple(g.strip() for g in (group_by or ",".join(GROUPS)).split(",") if g.strip())
    unknown = [g for g in groups if g not in GROUPS]
    if unknown or len(set(groups)) != len(groups):
        raise Invalid(
            f"group_by '{group_by}' must name some of {', '.join(GROUPS)}, each once, "
            "comma-separated (e.g. tenant,alias)"
        )
    now = datetime.now(UTC)
    first = _moment(start, "from") if start else datetime(now.year, now.month, 1, tzinfo=UTC)
    last = _moment(end, "to") if end else _hour(now) + timedelta(hours=1)
    if first.minute or first.second or first.microsecond or last.minute or last.second:
        raise Invalid("from and to must fall on a whole hour (UTC), e.g. 2026-12-01T00:00:00Z")
    if last <= first:
        raise Invalid(f"to ({last:%Y-%m-%dT%H:%MZ}) must be after from ({first:%Y-%m-%dT%H:%MZ})")
    if last - first > timedelta(days=MAX_DAYS[grain]):
        raise Invalid(
            f"a window of {grain}s may span at most {MAX_DAYS[grain]} days; ask for less, "
            "or for days instead of hours"
        )
    return Query(first, last, tuple(g for g in GROUPS if g in groups), grain)


def _hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def _moment(text: str, name: str) -> datetime:
    try:
        if len(text) == 10:
            return datetime.combine(date.fromisoformat(text), time(), tzinfo=UTC)
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise Invalid(
            f"{name} '{text}' is not a date (2026-12-01) or a time (2026-12-01T09:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def page_bounds(limit: int | None, offset: int | None) -> tuple[int, int]:
    """``limit`` (1-``MAX_PAGE``, default ``PAGE``) and ``offset`` (>= 0) checked."""
    limit = PAGE if limit is None else limit
    offset = offset or 0
    if not 1 <= limit <= MAX_PAGE:
        raise Invalid(f"limit {limit} must be between 1 and {MAX_PAGE} rows")
    if offset < 0:
        raise Invalid(f"offset {offset} must be 0 or more")
    return limit, offset


def usage_rows(
    query: Query,
    tenant_ids: Iterable[int] | None,
    *,
    limit: int | None = None,
    offset: int = 0,
) -> list[dict]:
    """The ledger's rows over ``query``'s window, for ``tenant_ids`` (None: every tenant),
    oldest period first; the periods and groups in which nothing was counted are left out.
    ``limit`` and ``offset`` page them (the order is total: period, then each group)."""
    rows = RequestRollup.objects.filter(
        step_s=HOUR, start__gte=query.start, start__lt=query.end, tenant__isnull=False
    )
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=list(tenant_ids))
    period = TruncDay("start", tzinfo=UTC) if query.granularity == "day" else F("start")
    names = {"tenant": "tenant__slug", "alias": "alias", "version": "version"}
    keys = [names[g] for g in query.group_by if g != "version"]
    if "version" in query.group_by:
        keys += ["adapter_id", "version"]
    found = (
        rows.annotate(period=period)
        .values("period", *keys)
        .annotate(**_SUMS)
        .order_by("period", *keys)
    )
    if limit is not None:
        found = found[offset : offset + limit]
    return [_row(query, found_row) for found_row in found]


def _row(query: Query, found: dict) -> dict:
    row: dict = {"period": found["period"].astimezone(UTC)}
    if "tenant" in query.group_by:
        row["tenant"] = found["tenant__slug"]
    if "alias" in query.group_by:
        row["alias"] = found["alias"]
    if "version" in query.group_by:
        version = found["version"]
        row["version"] = f"{found['adapter_id']}@{version}" if version else ""
    failed = sum(found[k] or 0 for k in ("server_failures", "caller_errors", "throttled"))
    row.update(
        requests=found["requests"] or 0,
        ok=(found["requests"] or 0) - failed - (found["cancelled"] or 0),
        server_failures=found["server_failures"] or 0,
        caller_errors=found["caller_errors"] or 0,
        throttled=found["throttled"] or 0,
        cancelled=found["cancelled"] or 0,
        prompt_tokens=found["prompt_tokens"] or 0,
        completion_tokens=found["completion_tokens"] or 0,
        total_tokens=(found["prompt_tokens"] or 0) + (found["completion_tokens"] or 0),
        cache_loads=found["cache_loads"] or 0,
        engine_seconds=round((found["engine_ms"] or 0) / 1000, 3),
        engine_token_seconds=round(found["engine_token_s"] or 0, 3),
    )
    return row


def to_csv(query: Query, rows: list[dict]) -> str:
    """The rows as CSV with a header line; periods in ISO 8601 UTC."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=query.columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        cells = {key: cell(value) for key, value in row.items()}
        writer.writerow({**cells, "period": row["period"].strftime("%Y-%m-%dT%H:%M:%SZ")})
    return out.getvalue()


def cell(value: object) -> object:
    """A CSV cell that a spreadsheet shows as written: text that starts like a formula
    (``= + - @``, a tab or a carriage return) gets a leading ``'``, as OWASP advises and as
    spreadsheet tools show text; numbers are left as they are."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def month_window(month: str | None) -> tuple[date, date]:
    """The first day of ``month`` (``YYYY-MM``; default this month, UTC) and of the next."""
    today = datetime.now(UTC).date()
    if month:
        try:
            first = date.fromisoformat(f"{month}-01")
        except ValueError:
            raise Invalid(f"month '{month}' is not a month like 2026-12") from None
    else:
        first = today.replace(day=1)
    following = (first + timedelta(days=32)).replace(day=1)
    return first, following


def month_summary(month: str | None, tenant_ids: Iterable[int] | None, stack: str) -> dict:
    """A month of a usage page: tokens per day stacked by ``stack`` (alias for a tenant,
    tenant for an operator), totals per (tenant, alias, version), and the month's total."""
    first, following = month_window(month)
    query = parse_query(first.isoformat(), following.isoformat(), None, "day")
    rows = usage_rows(query, tenant_ids)
    totals: dict[tuple[str, str, str], dict] = {}
    for row in rows:
        key = (row["tenant"], row["alias"], row["version"])
        into = totals.setdefault(key, dict.fromkeys(COUNTS, 0))
        for name in COUNTS:
            into[name] += row[name]
    days = [first + timedelta(days=i) for i in range((following - first).days)]
    stacks: dict[str, dict[date, int]] = {}
    for row in rows:
        per_day = stacks.setdefault(row[stack], {})
        day = row["period"].date()
        per_day[day] = per_day.get(day, 0) + row["total_tokens"]
    return {
        "query": query,
        "month": first,
        "previous": (first - timedelta(days=1)).strftime("%Y-%m"),
        "next": following.strftime("%Y-%m"),
        "days": days,
        "stacks": stacks,
        "groups": [
            {"tenant": t, "alias": a, "version": v, **counts}
            for (t, a, v), counts in sorted(totals.items())
        ],
        "total_tokens": sum(row["total_tokens"] for row in rows),
        "requests": sum(row["requests"] for row in rows),
        "rows": rows,
    }
