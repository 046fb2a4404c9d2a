"""Point 10 of the threat model: each process gets only the secrets it needs, nodes connect
as a database role that cannot change the registry or read second factors, the deploy files
expose nothing more than the console and the router, and production refuses placeholders."""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from django.db import connection

from lorahub import checks

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def privilege(role: str, table: str, what: str, column: str | None = None) -> bool:
    with connection.cursor() as cursor:
        if column:
            cursor.execute(
                "SELECT has_column_privilege(%s, %s, %s, %s)", [role, table, column, what]
            )
        else:
            cursor.execute("SELECT has_table_privilege(%s, %s, %s)", [role, table, what])
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_the_node_role_reads_the_registry_and_writes_request_rows_only(monkeypatch):
    role = f"lorahub_node_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("LORAHUB_NODE_DB_PASSWORD", secrets.token_urlsafe(16))
    call_command("node_db_role", role)
    try:
        assert privilege(role, "registry_adapterversion", "SELECT")
        assert privilege(role, "registry_alias", "SELECT")
        assert privilege(role, "serving_requestlog", "INSERT")
        assert privilege(role, "serving_servingnode", "UPDATE")
        assert privilege(role, "registry_basemodel", "INSERT")  # what it serves, at start
        assert privilege(role, "tenants_apikey", "UPDATE", "last_used_at")
        # what a node must never do
        assert not privilege(role, "registry_adapterversion", "UPDATE")
        assert not privilege(role, "registry_alias", "INSERT")
        assert not privilege(role, "tenants_apikey", "UPDATE", "key_hash")
        assert not privilege(role, "tenants_apikey", "INSERT")
        assert not privilege(role, "auth_user", "SELECT")  # password hashes
        assert not privilege(role, "django_session", "SELECT")
        assert not privilege(role, "otp_totp_totpdevice", "SELECT")
        assert not privilege(role, "otp_static_statictoken", "SELECT")
        # a node cannot speak for the control plane: no audit rows, no webhook deliveries
        # (the sweep would sign them with the tenant's secret); it reports a quarantine as a
        # row, which it cannot change or lift afterwards
        assert not privilege(role, "tenants_auditevent", "INSERT")
        assert not privilege(role, "tenants_webhookdelivery", "INSERT")
        assert not privilege(role, "tenants_webhookdelivery", "UPDATE")
        assert privilege(role, "serving_quarantine", "INSERT")
        assert not privilege(role, "serving_quarantine", "UPDATE")
        assert privilege(role, "django_migrations", "SELECT")  # the entrypoint's wait
        call_command("node_db_role", role)  # again: idempotent
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP OWNED BY "{role}"')
            cursor.execute(f'DROP ROLE "{role}"')


def production_check(env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {
        k: v
        for k, v in os.environ.items()
        # the lane's own settings, and the browser tests' DJANGO_ALLOW_ASYNC_UNSAFE
        if not k.startswith(("LORAHUB_", "DATABASE_URL", "CELERY_", "DJANGO_ALLOW_ASYNC"))
    }
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "ERROR"],
        cwd=ROOT,
        env={**base, "LORAHUB_PRODUCTION": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


NODE_ENV = {
    "LORAHUB_PROCESS": "node",
    "DATABASE_URL": "postgres://lorahub_node:a-long-node-password@127.0.0.1:5432/lorahub",
    "LORAHUB_EVENTS_URL": "redis://lorahub-node:a-long-redis-password@127.0.0.1:6379/0",
    "LORAHUB_S3_ENDPOINT": "http://127.0.0.1:9000",
    "LORAHUB_INTERNAL_TOKEN": secrets.token_urlsafe(32),
}


def test_a_node_starts_without_the_control_planes_secrets_and_refuses_them():
    started = production_check(NODE_ENV)
    assert started.returncode == 0, started.stderr[-2000:]
    for name, value in (
        ("LORAHUB_SIGNING_KEY", "-----BEGIN PRIVATE KEY-----x"),
        ("LORAHUB_BUNDLE_KEY", "-----BEGIN PRIVATE KEY-----x"),
        ("LORAHUB_SECRET_KEY", secrets.token_urlsafe(50)),
        ("LORAHUB_FIELD_KEYS", base64.urlsafe_b64encode(os.urandom(32)).decode()),
        # the broker's password: a node could queue tasks for the worker, which signs
        ("CELERY_BROKER_URL", "redis://:a-long-redis-password@127.0.0.1:6379/0"),
    ):
        refused = production_check({**NODE_ENV, name: value})
        assert refused.returncode != 0
        assert f"{name} is set on a serving node" in refused.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LORAHUB_INTERNAL_TOKEN", "replace-me"),
        ("LORAHUB_INTERNAL_TOKEN", "short"),
        ("DATABASE_URL", "postgres://lorahub_node:replace-me@127.0.0.1:5432/lorahub"),
        ("LORAHUB_EVENTS_URL", "redis://lorahub-node:changeme@127.0.0.1:6379/0"),
    ],
)
def test_placeholder_secrets_are_refused_at_start_naming_the_variable(name, value):
    refused = production_check({**NODE_ENV, name: value})
    assert refused.returncode != 0
    assert name in refused.stderr


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_gives_nodes_no_control_plane_secret_and_binds_prometheus_to_the_host():
    services = compose()["services"]
    for node in ("node-1", "node-2"):
        spec = services[node]
        assert "env_file" not in spec, node
        env = spec["environment"]
        for secret in (
            "LORAHUB_SECRET_KEY",
            "LORAHUB_SIGNING_KEY",
            "LORAHUB_BUNDLE_KEY",
            "LORAHUB_FIELD_KEYS",
        ):
            assert secret not in env, (node, secret)
        assert env["DATABASE_URL"].startswith("postgres://lorahub_node:")
        assert env["LORAHUB_TRUSTED_PROXIES"] != "*"
    assert services["prometheus"]["ports"][0].startswith("${LORAHUB_PROMETHEUS_PUBLISH:-127.0.0.1:")
    assert "env_file" not in services["prometheus"]
    assert "--requirepass" in services["redis"]["command"]
    assert ":${REDIS_PASSWORD" in services["console"]["environment"]["CELERY_BROKER_URL"]
    for node in ("node-1", "node-2"):
        assert "${REDIS_PASSWORD" not in str(services[node]["environment"]), node
        assert "${S3_SECRET_KEY" not in str(services[node]["environment"]), node


def test_compose_gives_nodes_their_own_redis_user_and_read_only_object_store_keys():
    services = compose()["services"]
    for node in ("node-1", "node-2"):
        env = services[node]["environment"]
        assert "CELERY_BROKER_URL" not in env, node  # the broker's password
        assert env["LORAHUB_EVENTS_URL"].startswith("redis://lorahub-node:${REDIS_NODE_PASSWORD")
        assert env["LORAHUB_BAD_KEY_STORAGE"].startswith("redis://lorahub-node:")
        # the read-only user s3-users makes, never the object store's owner
        assert env["LORAHUB_S3_ACCESS_KEY"].startswith("${S3_NODE_ACCESS_KEY")
        assert env["LORAHUB_S3_SECRET_KEY"].startswith("${S3_NODE_SECRET_KEY")
    made = services["s3-users"]["command"][0]
    assert "mc admin policy attach local lorahub-node" in made
    assert "./s3/node-policy.json:/policy/node-policy.json:ro" in services["s3-users"]["volumes"]
    import json

    policy = json.loads((DEPLOY / "s3" / "node-policy.json").read_text())
    actions = {a for statement in policy["Statement"] for a in statement["Action"]}
    assert actions == {"s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation"}
    assert all(statement["Effect"] == "Allow" for statement in policy["Statement"])


def test_compose_runs_lorahub_with_no_capability_and_the_control_plane_read_only():
    services = compose()["services"]
    ours = ["migrate", "console", "worker", "webhooks", "beat", "node-1", "node-2", "router"]
    for name in ours:
        spec = services[name]
        assert spec["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in spec["security_opt"], name
    for name in ("migrate", "console", "worker", "webhooks", "beat"):
        assert services[name]["read_only"] is True, name
        assert any(t.split(":")[0] == "/tmp" for t in services[name]["tmpfs"]), name  # noqa: S108


def redis_node_rule() -> list[str]:
    """The ``--user lorahub-node ...`` tokens of compose's redis command, as shipped."""
    command = compose()["services"]["redis"]["command"]
    start = command.index("--user") + 1
    end = next((i for i in range(start, len(command)) if command[i].startswith("--")), None)
    return command[start:end]


@pytest.fixture
def redis_node_user():
    """Compose's node rule applied to the test Redis as a user of this test's own; its URL."""
    import redis

    admin = redis.Redis(host="127.0.0.1", port=6379)
    name, password = f"node-{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(16)
    shipped = redis_node_rule()
    assert shipped[0] == "lorahub-node" and shipped[2].startswith(">${REDIS_NODE_PASSWORD")
    admin.execute_command("ACL", "SETUSER", name, "on", f">{password}", *shipped[3:])
    yield f"redis://{name}:{password}@127.0.0.1:6379"
    admin.execute_command("ACL", "DELUSER", name)


def test_the_nodes_redis_user_hears_changes_counts_bad_keys_and_nothing_else(redis_node_user):
    import redis

    from apps.tenants.throttle import BadKeyThrottle

    node = redis.Redis.from_url(f"{redis_node_user}/14", socket_timeout=5)
    admin = redis.Redis(host="127.0.0.1", port=6379, db=14)
    # what serving needs: the change broadcast
    pubsub = node.pubsub()
    pubsub.subscribe("lorahub:changes")
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"
    admin.publish("lorahub:changes", b'{"kind": "alias"}')
    heard = pubsub.get_message(timeout=2)
    assert heard is not None and heard["data"] == b'{"kind": "alias"}'
    pubsub.close()
    # ... and the bad-key counts, through limits' scripts
    throttle = BadKeyThrottle("2/minute", f"{redis_node_user}/14")
    client = f"192.0.2.{secrets.randbelow(250)}-{uuid.uuid4().hex[:6]}"
    assert [throttle.failed(client) for _ in range(3)][:2] == [0, 0]
    assert throttle.failed(client) > 0
    # what a compromised node must not do: queue a task for the worker (which signs), speak
    # on the change channel, read task results, hear other channels, flush the counts
    for refused in (
        lambda: node.lpush("celery", b"{}"),
        lambda: node.get("celery-task-meta-x"),
        lambda: node.publish("lorahub:changes", b'{"kind": "tenant"}'),
        lambda: node.flushdb(),
        lambda: node.keys("*"),
        lambda: node.execute_command("CONFIG", "GET", "requirepass"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            refused()
    other = node.pubsub()
    with pytest.raises(redis.exceptions.NoPermissionError):
        other.subscribe("something-else")
        other.get_message(timeout=2)
    other.close()
    admin.delete(*admin.keys("LIMITS:*") or ["none"])


def test_kubernetes_gives_nodes_their_own_secret_and_a_network_policy():
    base = DEPLOY / "k8s" / "base"
    docs = [d for p in base.glob("*.yaml") for d in yaml.safe_load_all(p.read_text()) if d]
    node_secret = next(
        d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "lorahub-node-secrets"
    )
    assert not {
        "LORAHUB_SECRET_KEY",
        "LORAHUB_SIGNING_KEY",
        "LORAHUB_BUNDLE_KEY",
        "LORAHUB_FIELD_KEYS",
    } & set(node_secret["stringData"])
    assert "CELERY_BROKER_URL" not in node_secret["stringData"]  # the broker's password
    assert node_secret["stringData"]["LORAHUB_EVENTS_URL"].startswith("redis://lorahub-node:")
    node = next(d for d in docs if d["kind"] == "StatefulSet")
    refs = [e for e in node["spec"]["template"]["spec"]["containers"][0]["envFrom"]]
    assert {"secretRef": {"name": "lorahub-node-secrets"}} in refs
    assert {"secretRef": {"name": "lorahub-secrets"}} not in refs
    policies = {d["metadata"]["name"] for d in docs if d["kind"] == "NetworkPolicy"}
    assert {"lorahub-default-deny", "lorahub-node"} <= policies
    resources = yaml.safe_load((base / "kustomization.yaml").read_text())["resources"]
    assert "network-policy.yaml" in resources


def _policies() -> list[dict]:
    path = DEPLOY / "k8s" / "base" / "network-policy.yaml"
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _selects(policy: dict, app: str) -> bool:
    selector = policy["spec"]["podSelector"]
    if not selector:
        return True
    if selector.get("matchLabels", {}).get("app.kubernetes.io/name") == app:
        return True
    return any(app in e["values"] for e in selector.get("matchExpressions", []))


def test_kubernetes_limits_egress_and_lets_only_the_routers_that_set_the_header_in():
    policies = _policies()
    deny = next(p for p in policies if p["metadata"]["name"] == "lorahub-default-deny")
    assert set(deny["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    # a node reaches no address outside its services: no rule with an ipBlock selects it
    node_egress = [
        rule
        for p in policies
        if "Egress" in p["spec"]["policyTypes"] and _selects(p, "lorahub-node")
        for rule in p["spec"].get("egress", [])
    ]
    assert node_egress and not any("ipBlock" in str(rule) for rule in node_egress)
    assert {port["port"] for rule in node_egress for port in rule["ports"]} <= {
        53,
        5432,
        6379,
        9000,
    }
    # the internet (public addresses only) for the console's provider and tenants' receivers
    internet = next(p for p in policies if p["metadata"]["name"] == "lorahub-egress-internet")
    block = internet["spec"]["egress"][0]["to"][0]["ipBlock"]
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= set(
        block["except"]
    )
    assert not _selects(internet, "lorahub-node") and not _selects(internet, "lorahub-worker")
    # the console believes X-Forwarded-For from the pod network: only the ingress reaches it
    console = next(p for p in policies if p["metadata"]["name"] == "lorahub-console")
    assert all(rule.get("from") for rule in console["spec"]["ingress"])


# each setting: (unsafe value, the check that names it, a safe value)
TRUST_BOUNDARY_SETTINGS = {
    "LORAHUB_DJANGO_ADMIN": (True, "lorahub.W201", False),
    "REQUIRE_SECOND_FACTOR": (False, "lorahub.W202", True),
    "LORAHUB_WEBHOOK_ALLOW_PRIVATE": (True, "lorahub.W203", False),
    "LORAHUB_WEBHOOK_REQUIRE_HTTPS": (False, "lorahub.W204", True),
    "CELERY_BROKER_URL": ("redis://redis:6379/0", "lorahub.W205", "redis://:a-pass-0123@r:6379/0"),
    "LORAHUB_TRUSTED_PROXIES": ("0.0.0.0/0", "lorahub.E201", "10.89.64.0/24"),
    "DATA_UPLOAD_MAX_MEMORY_SIZE": (None, "lorahub.E202", 1024 * 1024),
    "LORAHUB_INTERNAL_TOKEN": ("", "lorahub.E203", secrets.token_urlsafe(32)),
    "LORAHUB_INTERNAL_NETWORKS": ("::/0", "lorahub.E204", "10.89.64.0/24"),
}


@pytest.mark.parametrize("name", sorted(TRUST_BOUNDARY_SETTINGS))
def test_check_deploy_names_each_unsafe_setting(settings, name):
    settings.PRODUCTION = True
    settings.LORAHUB_BAD_KEY_STORAGE = "redis://:a-pass-0123@r:6379/2"
    for other, (_, _, safe) in TRUST_BOUNDARY_SETTINGS.items():
        setattr(settings, other, safe)
    assert checks.check_trust_boundary(None) == []
    unsafe, check_id, _ = TRUST_BOUNDARY_SETTINGS[name]
    setattr(settings, name, unsafe)
    assert [found.id for found in checks.check_trust_boundary(None)] == [check_id]
