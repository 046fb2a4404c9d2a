"""The PostgreSQL role serving nodes connect as (docs/security.md, least privilege).

A node reads the registry, the tenants' keys and quotas and the cache settings; it writes its
request rows and rollups, its own registration and the base model it serves, the quarantines it
reports, and an API key's last use. Nothing else: it cannot change a version, an alias or a
key, it cannot read passwords, sessions or second-factor devices, and it cannot write audit
rows or webhook deliveries (the control plane checks a node's quarantine report, then audits
and announces it: ``apps/fleet/quarantine.py``), so a node cannot speak for the platform.

    manage.py node_db_role lorahub_node        # the password from LORAHUB_NODE_DB_PASSWORD

Run it after every migration (the compose stack's and the Kubernetes Job's ``migrate`` step
do): new tables get their grants, an existing role its password. Idempotent.
"""

from __future__ import annotations

import os

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

from lorahub.tokens import check_secret

# tables no node reads: passwords, sessions, second factors, lockouts, identities, admin log
UNREAD_PREFIXES = ("auth_", "django_session", "django_admin_log", "otp_", "axes_")
UNREAD_TABLES = {"tenants_externalidentity", "tenants_membership"}
# tables a node writes: (privileges, table); the serving app's request rows and rollups too
WRITES = [
    # the base model a node serves, and its shapes, announced at start (validation reads it)
    ("INSERT, UPDATE", "registry_basemodel"),
    ("INSERT", "tenants_quota"),
    ("UPDATE (last_used_at, last_used_from)", "tenants_apikey"),
    # a node reports a quarantine (a row); the control plane checks and announces it, and
    # only an operator lifts it
    ("INSERT", "serving_quarantine"),
]
SERVING_NOT_WRITTEN = {"serving_cachesettings", "serving_replayrun", "serving_quarantine"}


def node_tables() -> tuple[list[str], list[tuple[str, str]]]:
    """(tables a node reads, (privileges, table) it writes)."""
    tables = sorted(
        {m._meta.db_table for m in apps.get_models(include_auto_created=True)}
        & set(connection.introspection.table_names())
    )
    read = [t for t in tables if not t.startswith(UNREAD_PREFIXES) and t not in UNREAD_TABLES]
    read.append("django_migrations")  # `migrate --check`: the entrypoint waits for the schema
    written = list(WRITES) + [
        ("INSERT, UPDATE, DELETE", t)
        for t in tables
        if t.startswith("serving_") and t not in SERVING_NOT_WRITTEN
    ]
    return read, written


class Command(BaseCommand):
    help = "Create or update the PostgreSQL role serving nodes connect as."

    def add_arguments(self, parser) -> None:
        parser.add_argument("role", help="the role's name, e.g. lorahub_node")
        parser.add_argument(
            "--password-env",
            default="LORAHUB_NODE_DB_PASSWORD",
            help="the variable that holds its password (default LORAHUB_NODE_DB_PASSWORD)",
        )

    def handle(self, *args, role: str, password_env: str, **options) -> None:
        if connection.vendor != "postgresql":
            raise CommandError("node_db_role is for PostgreSQL (the embedded SQLite has no roles)")
        if not role.replace("_", "").isalnum():
            raise CommandError(f"{role!r}: use letters, digits and _ for the role's name")
        password = os.environ.get(password_env, "")
        if not password:
            raise CommandError(f"set {password_env} to the node role's password")
        check_secret(password_env, password, min_length=12)
        q = connection.ops.quote_name
        read, written = node_tables()
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            verb = "ALTER" if cursor.fetchone() else "CREATE"
            cursor.execute(
                f"{verb} ROLE {q(role)} LOGIN PASSWORD %s NOSUPERUSER NOCREATEDB NOCREATEROLE",
                [password],
            )
            database = q(connection.settings_dict["NAME"])
            cursor.execute(f"GRANT CONNECT ON DATABASE {database} TO {q(role)}")
            cursor.execute(f"GRANT USAGE ON SCHEMA public TO {q(role)}")
            cursor.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {q(role)}")
            for table in read:
                cursor.execute(f"GRANT SELECT ON {q(table)} TO {q(role)}")
            for privileges, table in written:
                cursor.execute(f"GRANT {privileges} ON {q(table)} TO {q(role)}")
            cursor.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {q(role)}")
        self.stdout.write(
            f"role {role}: reads {len(read)} tables, writes {len(written)} ({verb.lower()}d)"
        )
