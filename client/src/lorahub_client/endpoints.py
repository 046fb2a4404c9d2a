"""Every endpoint the client calls, with the model of its answer: ``Client`` sends through
this table, and ``tests/client/test_schema_agreement.py`` checks it against the server's
OpenAPI document."""

from __future__ import annotations

from pydantic import BaseModel

from lorahub_client.models import (
    Adapter,
    Alias,
    ApiKey,
    AuditEvent,
    CaseResult,
    EvaluationRun,
    EvaluationSet,
    Me,
    NewApiKey,
    Release,
    SetRevision,
    Usage,
    Version,
)

# Every endpoint the client calls: (method, path as the server's OpenAPI document names it,
# the model of its answer, whether the answer is a list). The schema-agreement test walks this.
ENDPOINTS: dict[str, tuple[str, str, type[BaseModel], bool]] = {
    "me": ("GET", "/api/me", Me, False),
    "adapters": ("GET", "/api/adapters", Adapter, True),
    "upload": ("POST", "/api/adapters/{adapter_id}/versions", Version, False),
    "adapter_versions": ("GET", "/api/adapters/{adapter_id}/versions", Version, True),
    "versions": ("GET", "/api/versions", Version, True),
    "version": ("GET", "/api/versions/{version_id}", Version, False),
    "aliases": ("GET", "/api/aliases", Alias, True),
    "alias": ("GET", "/api/aliases/{name}", Alias, False),
    "set_alias": ("PUT", "/api/aliases/{name}", Alias, False),
    "canary": ("POST", "/api/aliases/{name}/canary", Alias, False),
    "promote": ("POST", "/api/aliases/{name}/promote", Alias, False),
    "rollback": ("POST", "/api/aliases/{name}/rollback", Alias, False),
    "evaluation_sets": ("GET", "/api/adapters/{adapter_id}/evaluation-sets", EvaluationSet, True),
    "upload_evaluation_set": (
        "POST",
        "/api/adapters/{adapter_id}/evaluation-sets/{name}",
        SetRevision,
        False,
    ),
    "start_evaluation": ("POST", "/api/evaluations", EvaluationRun, False),
    "evaluations": ("GET", "/api/evaluations", EvaluationRun, True),
    "evaluation": ("GET", "/api/evaluations/{run_id}", EvaluationRun, False),
    "evaluation_cases": ("GET", "/api/evaluations/{run_id}/cases", CaseResult, True),
    "keys": ("GET", "/api/tenants/{slug}/keys", ApiKey, True),
    "create_key": ("POST", "/api/tenants/{slug}/keys", NewApiKey, False),
    "revoke_key": ("DELETE", "/api/tenants/{slug}/keys/{prefix}", ApiKey, False),
    "audit": ("GET", "/api/audit", AuditEvent, True),
    "start_release": ("POST", "/api/aliases/{name}/releases", Release, False),
    "releases": ("GET", "/api/releases", Release, True),
    "release": ("GET", "/api/releases/{release_id}", Release, False),
    "pause_release": ("POST", "/api/releases/{release_id}/pause", Release, False),
    "resume_release": ("POST", "/api/releases/{release_id}/resume", Release, False),
    "promote_release": ("POST", "/api/releases/{release_id}/promote", Release, False),
    "abort_release": ("POST", "/api/releases/{release_id}/abort", Release, False),
    "usage": ("GET", "/api/usage", Usage, False),
}

FINISHED_RUN_STATES = frozenset({"succeeded", "failed"})
