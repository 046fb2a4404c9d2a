"""The REST API's response models, kept by hand beside the server's.

Each class mirrors one of the server's response schemas (its name in the server's OpenAPI
document is ``SERVER_NAME``). ``tests/client/test_schema_agreement.py`` compares every model the
client reads with the server's schema of the endpoint it reads it from (``ENDPOINTS`` in
``endpoints.py``) and fails on any difference: a field added, removed, renamed or retyped.
Unknown fields from a newer server are ignored, so an older client keeps working.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field


class Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    SERVER_NAME: ClassVar[str]


class Membership(Model):
    SERVER_NAME = "MembershipOut"
    tenant: str
    role: str


class Me(Model):
    SERVER_NAME = "MeOut"
    username: str | None
    api_key: str | None
    platform_roles: list[str]
    tenants: list[Membership]


class FileInfo(Model):
    SERVER_NAME = "FileOut"
    sha256: str
    size: int


class Version(Model):
    SERVER_NAME = "VersionOut"
    id: int
    tenant: str
    adapter_id: str
    version: str
    state: str
    base_model: str
    base_model_revision: str
    rank: int | None
    lora_alpha: float | None
    target_modules: list[str]
    size_bytes: int | None
    files: dict[str, FileInfo]
    report: dict[str, Any]
    manifest_digest: str
    training_data_summary: str
    uploaded_by: str | None
    rejection_reason: str
    reviewer: str | None
    review_note: str
    signed: bool
    signing_key_id: str
    created_at: datetime
    validated_at: datetime | None
    reviewed_at: datetime | None

    @property
    def label(self) -> str:
        return f"{self.adapter_id}@{self.version}"


class Adapter(Model):
    SERVER_NAME = "AdapterOut"
    tenant: str
    adapter_id: str
    versions: int
    latest_version: str | None
    created_at: datetime


class VersionRef(Model):
    SERVER_NAME = "VersionRef"
    id: int
    label: str


class AliasEvent(Model):
    SERVER_NAME = "AliasEventOut"
    action: str
    from_version: str | None
    to_version: str | None
    canary_version: str | None
    canary_percent: int
    actor: str
    reason: str
    at: datetime


class Alias(Model):
    SERVER_NAME = "AliasOut"
    tenant: str
    name: str
    adapter_id: str
    version: VersionRef
    canary_version: VersionRef | None
    canary_percent: int
    canary_api_keys: list[str]
    shadow_version: VersionRef | None
    shadow_percent: int
    shadow_keep_examples: bool
    held_by: str  # e.g. "release #3" while a release drives the alias
    updated_at: datetime
    history: list[AliasEvent]


class ApiKey(Model):
    SERVER_NAME = "ApiKeyOut"
    name: str
    prefix: str
    admin: bool
    created_at: datetime
    last_used_at: datetime | None
    last_used_from: str | None
    revoked_at: datetime | None
    expires_at: datetime | None  # None: until revoked
    state: str  # active, expired or revoked


class NewApiKey(ApiKey):
    SERVER_NAME = "NewApiKeyOut"
    key: str  # shown once by the server, never again


class AuditEvent(Model):
    SERVER_NAME = "AuditOut"
    at: datetime
    action: str
    actor: str | None
    tenant: str | None
    object_type: str
    object_id: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    note: str


class SetRevision(Model):
    SERVER_NAME = "SetRevisionOut"
    id: int
    tenant: str
    adapter_id: str
    name: str
    revision: int
    case_count: int
    size_bytes: int
    sha256: str
    created_at: datetime


class EvaluationSet(Model):
    SERVER_NAME = "SetOut"
    name: str
    adapter_id: str
    revisions: int
    latest: SetRevision


class EvaluationRun(Model):
    SERVER_NAME = "RunOut"
    id: int
    tenant: str
    adapter_id: str
    candidate: str
    candidate_version_id: int
    baseline: str
    baseline_version_id: int
    set: str
    set_revision_id: int
    state: str
    cases_done: int
    cases_total: int
    node: str
    summary: dict[str, Any]
    error: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class CaseResult(Model):
    SERVER_NAME = "CaseResultOut"
    index: int
    case_id: str
    candidate_output: str
    baseline_output: str
    candidate_checks: dict[str, bool]
    baseline_checks: dict[str, bool]
    candidate_passed: bool
    baseline_passed: bool
    exact_match: bool
    similarity: float
    candidate_tokens: int
    baseline_tokens: int
    candidate_ttft_ms: float | None
    baseline_ttft_ms: float | None
    candidate_error: str
    baseline_error: str


class ReleaseEvent(Model):
    SERVER_NAME = "ReleaseEventOut"
    at: datetime
    kind: str
    from_state: str
    to_state: str
    step: int
    gates: list[dict[str, Any]]
    note: str
    actor: str
    timings: dict[str, Any]


class Release(Model):
    SERVER_NAME = "ReleaseOut"
    id: int
    tenant: str
    alias: str
    candidate: str
    candidate_version_id: int
    baseline: str
    baseline_version_id: int
    state: str
    paused_from: str
    step: int
    steps: int
    canary_percent: int
    plan: dict[str, Any]
    consecutive_failures: int
    last_check: dict[str, Any]
    outcome: str
    created_at: datetime
    finished_at: datetime | None
    events: list[ReleaseEvent]

    @property
    def finished(self) -> bool:
        return self.state in ("promoted", "rolled_back", "aborted")


class UsageRow(Model):
    SERVER_NAME = "UsageRowOut"
    period: datetime  # the day's or the hour's start, UTC
    tenant: str | None = None  # each present when the rows are grouped by it
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


class Usage(Model):
    SERVER_NAME = "UsageOut"
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    from_: datetime = Field(alias="from")
    to: datetime
    granularity: str
    group_by: list[str]
    rows: list[UsageRow]
    next_offset: int | None = None  # the server's next page; None once every row is here


@dataclass(frozen=True)
class ChatAnswer:
    """A node's answer to one chat request, with the headers that say who answered."""

    model: str
    text: str
    finish_reason: str | None
    adapter: str | None  # X-Lorahub-Adapter: the version that answered, e.g. support@v1
    node: str | None
    cache_tier: str | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)
