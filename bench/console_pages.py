"""Server-side render time of every console page and dashboard data response, at scale.

Seeds a throwaway database (Django's test-database machinery: ``lorahub_console_bench`` on
the PostgreSQL server DATABASE_URL points at, else an SQLite one) with 100 tenants,
1,000 adapters, 10,000 versions, 20,000 audit events and 90 days of per-minute rollups
(every minute for the measured tenant's two aliases; the last week, sparse, for the other 99
tenants), then times each page through Django's test client (no browser, no network):
p50/p95 over --repeats requests after one warm-up, queries per page, and the ratio of the
p50 to the sign-in page's p50 measured in the same run (the baseline: middleware, session,
one template).

Targets (issue 9): pages <= 150 ms p95; dashboard data <= 300 ms p95 for a week at
one-minute resolution (downsampled to <= ~2,000 points per series).

Usage: DATABASE_URL=postgres://postgres@127.0.0.1:5432/lorahub \
       .venv/bin/python bench/console_pages.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lorahub.settings")
os.environ.setdefault("LORAHUB_NODES", "bench-node=http://127.0.0.1:9")  # nothing listens
os.environ.setdefault("LORAHUB_INTERNAL_TOKEN", "bench")

TENANTS, ADAPTERS_PER_TENANT, VERSIONS_PER_ADAPTER, AUDIT_EVENTS = 100, 10, 10, 20_000
ROLLUP_DAYS = 90


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def seed(rng: random.Random) -> dict:

    from django.db import connection

    from apps.registry.models import Adapter, AdapterVersion, Alias, AliasEvent
    from apps.telemetry.histograms import N_BUCKETS
    from apps.telemetry.models import RequestMinute
    from apps.telemetry.writers import rebuild_rollups
    from apps.tenants import services
    from apps.tenants.choices import PlatformRole, TenantRole
    from apps.tenants.models import AuditEvent, Tenant

    started = time.monotonic()
    tenants = Tenant.objects.bulk_create(
        [Tenant(slug=f"tenant-{i:03d}", name=f"Tenant {i}", priority=i % 3) for i in range(TENANTS)]
    )
    admin = services.ensure_user(username="admin", password="bench-pass-123")
    services.add_member(tenant=tenants[0], user=admin, role=TenantRole.ADMIN)
    reviewer = services.ensure_user(username="reviewer", password="bench-pass-123")
    services.grant_platform_role(user=reviewer, role=PlatformRole.REVIEWER)
    operator = services.ensure_user(username="operator", password="bench-pass-123")
    services.grant_platform_role(user=operator, role=PlatformRole.OPERATOR)
    for t in tenants[:20]:
        services.issue_api_key(tenant=t, name="app", actor=admin)
    adapters = Adapter.objects.bulk_create(
        [
            Adapter(tenant=t, adapter_id=f"adapter-{j:02d}")
            for t in tenants
            for j in range(ADAPTERS_PER_TENANT)
        ]
    )
    states = ["approved"] * 6 + ["pending_review", "pending_review", "rejected", "deprecated"]
    files = {
        "adapter_config.json": {"sha256": "0" * 64, "size": 700},
        "adapter_model.safetensors": {"sha256": "f" * 64, "size": 3_300_000},
    }
    report = {
        "tensors": 8,
        "dtypes": ["F32"],
        "modules": {"q_proj": {"layers": 2, "norm_a": 1.0, "norm_b": 0.1}},
    }
    now = datetime.now(UTC)
    versions = AdapterVersion.objects.bulk_create(
        [
            AdapterVersion(
                adapter=a,
                version=f"v{k}",
                state=states[k],
                uploaded_by=admin,
                base_model="lorahub-demo-tiny",
                base_model_revision="r1",
                rank=8,
                lora_alpha=16,
                target_modules=["q_proj", "v_proj"],
                size_bytes=3_300_700,
                files=files,
                report=report,
                manifest_digest="d" * 64,
                signature="s" if states[k] == "approved" else "",
                rejection_reason="the adapter's rank is 64, above the platform's maximum of 16"
                if states[k] == "rejected"
                else "",
            )
            for a in adapters
            for k in range(VERSIONS_PER_ADAPTER)
        ],
        batch_size=2000,
    )
    by_adapter: dict[int, list] = {}
    for v in versions:
        by_adapter.setdefault(v.adapter_id, []).append(v)
    aliases = []
    for t_index, t in enumerate(tenants):
        for j, name in enumerate(("chat", "support")):
            a = adapters[t_index * ADAPTERS_PER_TENANT + j]
            vs = by_adapter[a.pk]
            aliases.append(
                Alias(
                    tenant=t,
                    name=name,
                    adapter=a,
                    version=vs[0],
                    canary_version=vs[1],
                    canary_percent=10,
                )
            )
    aliases = Alias.objects.bulk_create(aliases)
    AliasEvent.objects.bulk_create(
        [
            AliasEvent(
                alias=al,
                action=action,
                to_version=al.version,
                canary_version=al.canary_version,
                canary_percent=10,
                actor=admin,
                actor_label="admin",
                reason="bench",
            )
            for al in aliases
            for action in ("set", "canary")
        ]
    )
    AliasEvent.objects.filter(action="canary").update(at=now - timedelta(days=3))
    actions = ["version.upload", "version.validated", "version.approve", "alias.set", "quota.set"]
    events = [
        AuditEvent(
            actor=admin,
            tenant=tenants[i % TENANTS],
            action=actions[i % len(actions)],
            object_type="AdapterVersion",
            object_id=str(versions[i % len(versions)].pk),
            before={"state": "validating"},
            after={"state": "pending_review"},
            note="",
        )
        for i in range(AUDIT_EVENTS)
    ]
    AuditEvent.objects.bulk_create(events, batch_size=5000)

    # rollups: every minute of 90 days for tenant-000's two aliases (stable and canary versions
    # alternating), the last week at ~10 % of minutes for every other tenant
    def rollup(minute, tenant, alias, version):
        n = rng.randint(3, 40)
        buckets = [0] * N_BUCKETS
        for _ in range(min(n, 8)):
            buckets[min(N_BUCKETS - 1, int(rng.expovariate(0.35)) + 2)] += 1
        row = RequestMinute(
            minute=minute,
            tenant=tenant,
            alias=alias.name,
            adapter_id=alias.adapter.adapter_id,
            version=version.version,
            requests=n,
            errors=int(rng.random() < 0.02),
            hits_l1=n - 2,
            hits_l2=1,
            hits_l3=1,
            ttft_count=sum(buckets),
            ttft_ms_sum=30.0 * sum(buckets),
            ttft_ms_max=400.0,
            load_ms_sum=50.0,
        )
        for i, c in enumerate(buckets):
            setattr(row, f"ttft_b{i:02d}", c)
        row.load_l3_b05 = 1
        return row

    start = now.replace(second=0, microsecond=0) - timedelta(days=ROLLUP_DAYS)
    mine = [al for al in aliases if al.tenant_id == tenants[0].pk]
    batch: list = []
    minutes = ROLLUP_DAYS * 24 * 60
    for m in range(minutes):
        minute = start + timedelta(minutes=m)
        for al in mine:
            batch.append(
                rollup(minute, tenants[0], al, al.version if m % 10 else al.canary_version)
            )
        if len(batch) >= 10_000:
            RequestMinute.objects.bulk_create(batch)
            batch = []
    week = now.replace(second=0, microsecond=0) - timedelta(days=7)
    for t_index, t in enumerate(tenants[1:], start=1):
        al = aliases[2 * t_index]
        for m in rng.sample(range(7 * 24 * 60), 1008):
            batch.append(rollup(week + timedelta(minutes=m), t, al, al.version))
        if len(batch) >= 10_000:
            RequestMinute.objects.bulk_create(batch)
            batch = []
    RequestMinute.objects.bulk_create(batch)
    rebuild_rollups()  # the 5-minute and hourly rows the node writes beside each minute
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")  # as autovacuum would after a bulk load
    return {
        "seconds": time.monotonic() - started,
        "tenant": tenants[0],
        "alias": mine[1],
        "version": versions[6],  # tenant-001's pending version: the reviewer may review it
        "users": {"admin": admin, "reviewer": reviewer, "operator": operator},
        "rollups": RequestMinute.objects.count(),
    }


def seeded() -> dict | None:
    """What an earlier --keepdb run seeded, if anything."""
    from django.contrib.auth.models import User

    from apps.registry.models import AdapterVersion, Alias
    from apps.telemetry.models import RequestMinute
    from apps.tenants.models import Tenant

    tenant = Tenant.objects.filter(slug="tenant-000").first()
    if tenant is None:
        return None
    return {
        "seconds": 0.0,
        "tenant": tenant,
        "alias": Alias.objects.get(tenant=tenant, name="support"),
        "version": AdapterVersion.objects.get(
            adapter__tenant__slug="tenant-001", adapter__adapter_id="adapter-00", version="v6"
        ),
        "users": {n: User.objects.get(username=n) for n in ("admin", "reviewer", "operator")},
        "rollups": RequestMinute.objects.count(),
    }


def measure(client, path: str, repeats: int) -> tuple[list[float], int, int]:
    from tests.helpers import count_queries

    response = client.get(path)  # warm-up
    with count_queries() as statements:
        response = client.get(path)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        response = client.get(path)
        times.append((time.perf_counter() - t0) * 1000)
    return times, len(statements), response.status_code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--keepdb", action="store_true", help="keep the seeded database for the next run"
    )
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment

    setup_test_environment()
    old_name = connection.settings_dict["NAME"]
    # its own database, so that a test run beside it keeps test_<name>
    if connection.vendor == "postgresql":
        connection.settings_dict["TEST"]["NAME"] = "lorahub_console_bench"
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=args.keepdb)
    try:
        data = seeded() if args.keepdb else None
        data = data or seed(random.Random(7))
        print(
            f"seeded {TENANTS} tenants, {TENANTS * ADAPTERS_PER_TENANT} adapters, "
            f"{TENANTS * ADAPTERS_PER_TENANT * VERSIONS_PER_ADAPTER} versions, {AUDIT_EVENTS} "
            f"audit events, {data['rollups']} per-minute rollups in {data['seconds']:.0f} s "
            f"on {connection.vendor}\n"
        )
        clients = {}
        for name, user in data["users"].items():
            clients[name] = Client()
            clients[name].force_login(user)
        t, al, v = data["tenant"].slug, data["alias"].name, data["version"].pk
        pages = [
            ("baseline", None, "/accounts/login/"),
            ("page", "admin", "/"),
            ("page", "admin", f"/t/{t}/adapters/"),
            ("page", "admin", f"/t/{t}/adapters/adapter-01/"),
            ("page", "admin", f"/t/{t}/upload/"),
            ("page", "admin", f"/t/{t}/aliases/"),
            ("page", "admin", f"/t/{t}/aliases/{al}/"),
            ("page", "admin", f"/t/{t}/keys/"),
            ("page", "admin", f"/t/{t}/quota/"),
            ("page", "admin", f"/t/{t}/dashboard/"),
            ("page", "admin", "/audit/"),
            ("page", "reviewer", "/review/"),
            ("page", "reviewer", f"/versions/{v}/"),
            ("page", "operator", "/operator/tenants/"),
            ("page", "operator", "/operator/cache/"),
            ("page", "operator", "/operator/nodes/"),
            ("page", "operator", "/operator/dashboard/"),
            ("page", "operator", "/audit/?action=alias."),
            ("page", "admin", f"/t/{t}/releases/"),
            ("page", "operator", "/operator/releases/"),
            ("page", "operator", "/operator/replay/"),
            *[
                ("data", "admin", f"/t/{t}/dashboard/data?range={r}")
                for r in ("hour", "day", "week", "90d")
            ],
            ("data", "admin", f"/t/{t}/dashboard/data?range=week&adapter=adapter-01"),
            *[
                ("data", "operator", f"/operator/dashboard/data?range={r}")
                for r in ("hour", "day", "week", "90d")
            ],
        ]
        rows = []
        baseline = None
        for kind, who, path in pages:
            client = clients[who] if who else Client()
            times, queries, status = measure(client, path, args.repeats)
            p50, p95 = statistics.median(times), pct(times, 0.95)
            baseline = baseline or p50
            target = {"page": 150, "data": 300}.get(kind)
            verdict = "" if target is None else ("ok" if p95 <= target else f"OVER {target}")
            rows.append(
                (kind, who or "-", path, status, queries, p50, p95, p50 / baseline, verdict)
            )
        header = ("kind", "as", "path", "status", "queries", "p50 ms", "p95 ms", "x login")
        print("{:<8} {:<9} {:<52} {:>6} {:>7} {:>8} {:>8} {:>8}  target".format(*header))
        for kind, who, path, status, queries, p50, p95, ratio, verdict in rows:
            print(
                f"{kind:<8} {who:<9} {path:<52} {status:>6} {queries:>7} "
                f"{p50:>8.1f} {p95:>8.1f} {ratio:>8.1f}  {verdict}"
            )
        week = clients["admin"].get(f"/t/{t}/dashboard/data?range=week").json()
        points = max(len(trace["x"]) for fig in week["figures"].values() for trace in fig["data"])
        print(f"\nlargest series in the week view: {points} points")
    finally:
        if not args.keepdb:
            connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
