"""``lorahub`` against the live REST API on the real registry (PostgreSQL, the Celery worker,
the S3 server): what a training job and a tenant's scripts rely on — exit codes, the server's
reasons verbatim, and ``--json`` output in the documented shapes (the client's own models,
which tests/client/test_schema_agreement.py holds to the server's schema)."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from pathlib import Path

from lorahub_client.models import (
    Alias,
    ApiKey,
    AuditEvent,
    EvaluationSet,
    NewApiKey,
    SetRevision,
    Version,
)
from pydantic import TypeAdapter

from apps.registry.models import AdapterVersion
from apps.registry.models import Alias as AliasRow
from tests.helpers import edit_config


def save_pretrained_folder(adapter_files: Path) -> Path:
    """The demo adapter as PEFT's save_pretrained leaves it: with a model card beside it."""
    (adapter_files / "README.md").write_text("---\nlibrary_name: peft\n---\n# support\n")
    return adapter_files


def test_push_a_peft_folder_and_wait_for_pending_review(
    registry, lorahub, tenant_key, adapter_files
):
    folder = save_pretrained_folder(adapter_files)
    ran = lorahub(
        "push",
        str(folder),
        "--adapter",
        "support",
        "--version",
        "1.0",
        "--wait",
        "--json",
        key=tenant_key,
    )
    assert ran.exit_code == 0, ran.stderr
    pushed = Version.model_validate(ran.json())
    assert (pushed.label, pushed.state) == ("support@1.0", "pending_review")
    assert set(pushed.files) == {"adapter_config.json", "adapter_model.safetensors"}
    assert "leaving out README.md" in ran.stderr

    listed = lorahub("versions", "list", "--adapter", "support", "--json", key=tenant_key)
    assert [v.id for v in TypeAdapter(list[Version]).validate_python(listed.json())] == [pushed.id]
    shown = lorahub("versions", "show", "support@1.0", "--json", key=tenant_key)
    assert Version.model_validate(shown.json()).id == pushed.id
    text = lorahub("versions", "show", str(pushed.id), key=tenant_key)
    assert text.exit_code == 0 and "pending_review" in text.stdout
    missing = lorahub("versions", "show", "support@9.9", "--json", key=tenant_key)
    assert missing.exit_code == 4
    assert missing.json()["error"]["detail"] == "adapter 'support' has no version '9.9'"


def test_a_rejected_push_exits_3_with_the_servers_reason_verbatim(
    registry, lorahub, tenant_key, adapter_files
):
    edit_config(adapter_files, r=0)
    ran = lorahub(
        "push", str(adapter_files), "-a", "support", "--version", "bad", "--wait", key=tenant_key
    )
    row = AdapterVersion.objects.get(version="bad")
    assert ran.exit_code == 3
    assert row.state == "rejected" and row.rejection_reason
    assert row.rejection_reason in ran.stderr
    assert "Traceback" not in ran.stderr + ran.stdout


def test_a_hostile_archive_exits_3_with_the_servers_reason(registry, lorahub, tenant_key, tmp_path):
    archive = tmp_path / "adapter.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        payload = b"{}"
        info = tarfile.TarInfo("../../etc/adapter_config.json")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    ran = lorahub(
        "push",
        str(archive),
        "-a",
        "support",
        "--version",
        "evil",
        "--wait",
        "--json",
        key=tenant_key,
    )
    assert ran.exit_code == 3
    error = json.loads(ran.stdout.strip().splitlines()[-1])["error"]
    row = AdapterVersion.objects.get(version="evil")
    assert (
        error["detail"] == row.rejection_reason and "climbs out of the archive" in error["detail"]
    )
    assert error["exit"] == 3


def test_a_folder_that_is_not_an_adapter_is_a_usage_error_and_sends_nothing(
    registry, lorahub, tenant_key, tmp_path
):
    ran = lorahub("push", str(tmp_path), "-a", "support", key=tenant_key)
    assert ran.exit_code == 2
    assert "has no adapter_config.json" in ran.stderr
    assert not AdapterVersion.objects.exists()


def test_alias_set_canary_promote_rollback_with_json(
    registry, lorahub, tenant_key, support_versions
):
    def alias(*args: str) -> Alias:
        ran = lorahub("alias", *args, "--json", key=tenant_key)
        assert ran.exit_code == 0, ran.stderr
        return Alias.model_validate(ran.json())

    assert alias("set", "support", "v1", "--reason", "launch").version.label == "support@v1"
    canary = alias("canary", "support", "support@v2", "--percent", "10")
    assert (canary.canary_version.label, canary.canary_percent) == ("support@v2", 10)
    assert alias("promote", "support").version.label == "support@v2"
    back = alias("rollback", "support", "--reason", "drill")
    assert back.version.label == "support@v1" and back.canary_version is None
    row = AliasRow.objects.get(name="support")
    assert row.version_id == support_versions["v1"] and row.canary_version_id is None
    assert [e.action for e in back.history][:4] == ["rollback", "promote", "canary", "set"]
    listed = lorahub("alias", "list", "--json", key=tenant_key)
    assert [a.name for a in TypeAdapter(list[Alias]).validate_python(listed.json())] == ["support"]
    assert "support@v1" in lorahub("alias", "show", "support", key=tenant_key).stdout

    refused = lorahub("alias", "canary", "support", "v2", "--percent", "101", key=tenant_key)
    assert refused.exit_code == 2  # the flag's range, checked before anything is sent
    cleared = alias("canary", "support", "--clear")
    assert cleared.canary_version is None
    unknown = lorahub("alias", "promote", "nope", "--json", key=tenant_key)
    assert unknown.exit_code == 4


def test_keys_need_an_admin_key_and_a_member_key_is_refused(
    registry, lorahub, admin_key, tenant_key
):
    made = lorahub("keys", "create", "ci-runner", "--json", key=admin_key)
    assert made.exit_code == 0, made.stderr
    new = NewApiKey.model_validate(made.json())
    assert new.key.startswith(f"lh_{new.prefix}_") and not new.admin
    listed = TypeAdapter(list[ApiKey]).validate_python(
        lorahub("keys", "list", "--json", key=admin_key).json()
    )
    assert {"ci-runner", "tooling", "training-job"} <= {k.name for k in listed}
    revoked = lorahub("keys", "revoke", new.key, "--json", key=admin_key)
    assert ApiKey.model_validate(revoked.json()).revoked_at is not None
    gone = lorahub("versions", "list", key=new.key)
    assert gone.exit_code == 3 and "invalid API key" in gone.stderr

    refused = lorahub("keys", "list", "--json", key=tenant_key)
    assert refused.exit_code == 3
    assert (
        refused.json()["error"]["detail"]
        == "only an admin of tenant 'tenant-a' or an operator may do this"
    )
    events = TypeAdapter(list[AuditEvent]).validate_python(
        lorahub("audit", "--action", "api_key", "--json", key=admin_key).json()
    )
    assert [e.action for e in events][:2] == ["api_key.revoke", "api_key.issue"]


def test_a_key_made_with_an_expiry_stops_with_key_expired(registry, lorahub, admin_key):
    from datetime import UTC, datetime, timedelta

    from apps.tenants.models import ApiKey as KeyRow

    made = lorahub("keys", "create", "nightly", "--expires-in", "30", "--json", key=admin_key)
    assert made.exit_code == 0, made.stderr
    new = NewApiKey.model_validate(made.json())
    assert timedelta(days=29, hours=23) < new.expires_at - datetime.now(UTC) <= timedelta(days=30)
    assert lorahub("versions", "list", key=new.key).exit_code == 0
    listed = lorahub("keys", "list", key=admin_key)
    assert "nightly" in listed.stdout and new.expires_at.strftime("%Y-%m-%d") in listed.stdout

    KeyRow.objects.filter(prefix=new.prefix).update(expires_at=datetime.now(UTC))  # 30 days on
    late = lorahub("versions", "list", key=new.key)
    assert late.exit_code == 3
    assert "expired at" in late.stderr and "ask an admin of the tenant" in late.stderr


def test_evaluation_sets_are_pushed_and_listed(
    registry, lorahub, tenant_key, support_versions, tmp_path
):
    cases = tmp_path / "thanks.jsonl"
    cases.write_text('{"prompt": "Hello", "expect": {"contains": "Thank you"}}\n')
    pushed = lorahub(
        "eval",
        "push-set",
        str(cases),
        "-a",
        "support",
        "--name",
        "thanks",
        "--json",
        key=tenant_key,
    )
    assert pushed.exit_code == 0, pushed.stderr
    revision = SetRevision.model_validate(pushed.json())
    assert (revision.revision, revision.case_count) == (1, 1)
    sets = TypeAdapter(list[EvaluationSet]).validate_python(
        lorahub("eval", "sets", "-a", "support", "--json", key=tenant_key).json()
    )
    assert [(s.name, s.latest.id) for s in sets] == [("thanks", revision.id)]
    cases.write_text('{"prompt": "Hello", "expect": {"shout": "x"}}\n')
    bad = lorahub(
        "eval", "push-set", str(cases), "-a", "support", "--name", "thanks", key=tenant_key
    )
    assert bad.exit_code == 3 and "line 1" in bad.stderr
    missing = lorahub("eval", "run", "support@v2", "--set", "nope", key=tenant_key)
    assert missing.exit_code == 4 and "has no set 'nope' (thanks)" in missing.stderr


def test_login_stores_the_key_readable_by_the_user_only_and_env_overrides_it(
    registry, lorahub, live_server, tenant_key, support_versions
):
    config = Path(os.environ["LORAHUB_CONFIG"])
    ran = lorahub("login", "--url", live_server.url, "--api-key", tenant_key, "--json", url="")
    assert ran.exit_code == 0, ran.stderr
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert json.loads(config.read_text())["api_key"] == tenant_key
    assert ran.json()["tenants"] == [{"tenant": "tenant-a", "role": "api_key"}]
    stored = lorahub("alias", "list", "--json", url="")  # URL and key from the config file
    assert stored.exit_code == 0, stored.stderr
    overridden = lorahub("alias", "list", key="lh_0000000000000000_nope", url="")
    assert overridden.exit_code == 3  # LORAHUB_API_KEY wins over the stored key

    wrong = lorahub("login", "--url", live_server.url, "--api-key", "lh_bad", url="")
    assert wrong.exit_code == 3 and "invalid API key" in wrong.stderr
    assert json.loads(config.read_text())["api_key"] == tenant_key  # not replaced by a bad one


def test_release_commands_start_follow_and_control_a_release(
    registry, lorahub, admin_key, tenant_key, support_versions
):
    from lorahub_client.models import Release

    def release(*args: str, key: str = admin_key, code: int = 0) -> Release:
        ran = lorahub("release", *args, "--json", key=key)
        assert ran.exit_code == code, ran.stderr
        return Release.model_validate(ran.json())

    assert lorahub("alias", "set", "support", "v1", key=admin_key).exit_code == 0
    steps = '[{"percent": 10, "dwell_s": 600, "min_requests": 5}]'
    bad = lorahub(
        "release", "start", "support", "v2", "--set", "failure_threshold=0", "--json", key=admin_key
    )
    assert bad.exit_code == 3
    assert "failure_threshold: Input should be greater than or equal to 1" in bad.stderr
    refused = lorahub("release", "start", "support", "v2", key=tenant_key)  # a member key
    assert refused.exit_code == 3 and "only an admin of tenant 'tenant-a'" in refused.stderr

    started = release(
        "start", "support", "v2", "--set", "prewarm=false", "--set", f"canary_steps={steps}"
    )
    assert (started.state, started.canary_percent, started.candidate) == (
        "canary",
        10,
        "support@v2",
    )
    assert release("status", "support").id == started.id  # an alias names its active release
    assert release("pause", str(started.id)).state == "paused"
    assert release("resume", "support").state == "canary"
    listed = lorahub("release", "list", "--active", "--json", key=admin_key)
    assert [r["id"] for r in listed.json()] == [started.id]
    aborted = release("abort", str(started.id), "--reason", "from CI")
    assert aborted.state == "aborted" and aborted.outcome.endswith("from CI")
    watched = release("watch", str(started.id), code=3)  # ended, not promoted: exit 3
    assert watched.state == "aborted"
    gone = lorahub("release", "status", "support", key=admin_key)
    assert gone.exit_code == 4 and "has no active release" in gone.stderr


def test_usage_prints_the_ledger_as_a_table_as_json_and_as_the_servers_csv(
    lorahub, tenant_key, tenant_a, tenant_b
):
    from apps.telemetry import writers
    from tests.helpers import key_client
    from tests.telemetry.test_usage import traffic

    for_a = [r for r in traffic([tenant_a, tenant_b], n=60) if r.tenant_id == tenant_a.pk]
    writers.write_records("n1", for_a)
    window = ("--from", "2026-11-30", "--to", "2026-12-03")
    shown = lorahub("usage", *window, "--json", key=tenant_key)
    assert shown.exit_code == 0, shown.stderr
    control = key_client(tenant_a)
    api = control.get("/api/usage", {"from": "2026-11-30", "to": "2026-12-03"})
    assert shown.json() == api.json()
    assert sum(row["requests"] for row in shown.json()["rows"]) == len(for_a)

    sheet = lorahub("usage", *window, "--csv", key=tenant_key)
    server = control.get("/api/usage.csv", {"from": "2026-11-30", "to": "2026-12-03"})
    assert sheet.stdout == server.content.decode()
    assert sheet.stdout.startswith("period,tenant,alias,version,requests,ok,")

    text = lorahub("usage", *window, "--group-by", "alias", key=tenant_key)
    assert text.exit_code == 0 and "support" in text.stdout
    assert f"tokens in {len(for_a)} requests" in text.stderr
    refused = lorahub("usage", "--granularity", "week", key=tenant_key)
    assert refused.exit_code == 3
    assert "granularity 'week' is not one of: day, hour" in refused.stderr
