"""Usage endpoints: the chargeback ledger as JSON and as CSV (docs/usage.md)."""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest, HttpResponse
from ninja import Field, Query, Router, Schema

from apps.telemetry import usage
from apps.tenants.api import visible_tenant
from apps.tenants.auth import API_AUTH, Principal

router = Router(tags=["usage"], auth=API_AUTH)


class UsageRowOut(Schema):
    period: datetime  # the day's or the hour's start, UTC
    tenant: str | None = None  # present when grouped by it
    alias: str | None = None
    version: str | None = None  # adapter@version
    requests: int
    ok: int
    server_failures: int
    caller_errors: int
    throttled: int
    cancelled: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cache_loads: int
    engine_seconds: float
    engine_token_seconds: float


class UsageOut(Schema):
    from_: datetime = Field(..., alias="from")
    to: datetime
    granularity: str
    group_by: list[str]
    rows: list[UsageRowOut]
    # the offset of the next page, null on the last one (``limit`` rows a page)
    next_offset: int | None = None


class UsageQuery(Schema):
    """The window and grouping asked for (``usage.parse_query`` checks them)."""

    start: str | None = Field(None, alias="from")  # a date or a whole UTC hour
    to: str | None = None  # exclusive
    group_by: str | None = None  # some of tenant,alias,version
    granularity: str | None = None  # day or hour
    tenant: str | None = None  # an operator's pick of one tenant
    limit: int | None = None  # rows a page (default 1000, at most 5000)
    offset: int | None = None  # rows skipped (the previous page's next_offset)


def _ledger(request: HttpRequest, asked: UsageQuery) -> tuple[usage.Query, list[dict], int | None]:
    """Tenants read their own; an operator every tenant's (or the one named). One page of
    rows, and the offset of the next page (None: this was the last)."""
    principal: Principal = request.auth  # type: ignore[attr-defined]  # set by ninja's auth
    query = usage.parse_query(asked.start, asked.to, asked.group_by, asked.granularity)
    limit, offset = usage.page_bounds(asked.limit, asked.offset)
    if asked.tenant:
        scope: frozenset[int] | None = frozenset({visible_tenant(principal, asked.tenant).id})
    else:
        scope = None if principal.is_operator else principal.tenant_ids
    # one row more than the page tells whether another page follows
    rows = usage.usage_rows(query, scope, limit=limit + 1, offset=offset)
    next_offset = offset + limit if len(rows) > limit else None
    return query, rows[:limit], next_offset


@router.get("/usage", response=UsageOut, by_alias=True)
def get_usage(request: HttpRequest, asked: Query[UsageQuery]):
    """Requests, tokens, cache loads and engine time per period and group: `from` and `to`
    (dates or whole UTC hours, `to` exclusive; default this month), `group_by` (some of
    tenant, alias, version; default all), `granularity` (day or hour); `limit` rows a page
    (default 1000, at most 5000) from `offset`, and `next_offset` for the next page."""
    query, rows, next_offset = _ledger(request, asked)
    return {
        "from": query.start,
        "to": query.end,
        "granularity": query.granularity,
        "group_by": list(query.group_by),
        "rows": rows,
        "next_offset": next_offset,
    }


@router.get(
    "/usage.csv",
    openapi_extra={
        "responses": {
            200: {
                "description": "the rows as CSV, one header line",
                "content": {"text/csv": {"schema": {"type": "string", "format": "binary"}}},
            }
        }
    },
)
def get_usage_csv(request: HttpRequest, asked: Query[UsageQuery]):
    """The same rows as `GET /api/usage`, as CSV (what `lorahub usage --csv` prints), paged the
    same way: the next page's offset is in the `X-Next-Offset` header, absent on the last."""
    query, rows, next_offset = _ledger(request, asked)
    response = HttpResponse(usage.to_csv(query, rows), content_type="text/csv")
    if next_offset is not None:
        response["X-Next-Offset"] = str(next_offset)
    name = f"usage-{query.start:%Y%m%d}-{query.end:%Y%m%d}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
