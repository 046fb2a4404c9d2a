"""``Client``: the lorahub REST API from Python.

    from lorahub_client import Client
    client = Client("https://lorahub.example.com", api_key="lh_...")
    version = client.upload("support", "out/checkpoint-final", version="2026-12-03.1")
    version = client.wait_for_verdict(version.id)      # pending_review, or Rejected raised
    client.canary("support", version.id, percent=10, reason="first look")

Its methods are the API's endpoints (``ENDPOINTS``); how a request is sent and retried is
``transport.py``, a PEFT folder's upload parts ``peft.py``, a version's download
``downloads.py``. Errors are raised as ``errors.*`` with the server's code and message.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from pydantic import TypeAdapter

from lorahub_client.downloads import DOWNLOADS
from lorahub_client.downloads import pull as pull_files
from lorahub_client.endpoints import ENDPOINTS
from lorahub_client.errors import LorahubError, NotFound, Rejected, TimedOut
from lorahub_client.models import (
    Adapter,
    Alias,
    ApiKey,
    AuditEvent,
    CaseResult,
    ChatAnswer,
    EvaluationRun,
    EvaluationSet,
    Me,
    NewApiKey,
    Release,
    SetRevision,
    Usage,
    Version,
)
from lorahub_client.peft import CountingFile, adapter_files
from lorahub_client.transport import Transport

Progress = Callable[[int, int], None]  # (bytes sent, bytes in all)
FINISHED_RUN_STATES = frozenset({"succeeded", "failed"})


class Client:
    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        inference_url: str | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        max_retry_wait: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not url:
            raise LorahubError("no server URL: pass url (or set LORAHUB_URL)")
        if not api_key:
            raise LorahubError("no API key: pass api_key (or set LORAHUB_API_KEY)")
        self.transport = Transport(
            url,
            api_key,
            timeout=timeout,
            retries=retries,
            max_retry_wait=max_retry_wait,
            sleep=sleep,
            transport=transport,
        )
        self.url = self.transport.url
        self.inference_url = inference_url.rstrip("/") if inference_url else None
        self._sleep = sleep
        self._tenant: str | None = None

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the API's endpoints -----------------------------------------------------------------

    def _call(
        self,
        name: str,
        *,
        path: dict[str, Any] | None = None,
        **kw: Any,
    ) -> Any:
        method, template, model, many = ENDPOINTS[name]
        response = self.transport.send(method, template.format(**(path or {})), **kw)
        payload = response.json()
        if many:
            return TypeAdapter(list[model]).validate_python(payload)  # type: ignore[valid-type]
        return model.model_validate(payload)

    @property
    def tenant(self) -> str:
        """The tenant this key acts for."""
        if self._tenant is None:
            tenants = self.me().tenants
            if len(tenants) != 1:
                raise LorahubError("this key does not act for exactly one tenant")
            self._tenant = tenants[0].tenant
        return self._tenant

    # --- who am I, adapters and versions -----------------------------------------------------

    def me(self) -> Me:
        return self._call("me")

    def adapters(self) -> list[Adapter]:
        return self._call("adapters")

    def versions(self, adapter_id: str | None = None, *, state: str | None = None) -> list[Version]:
        if adapter_id:
            found = self._call("adapter_versions", path={"adapter_id": adapter_id})
            return [v for v in found if state is None or v.state == state]
        return self._call("versions", params={"state": state} if state else None)

    def version(self, version_id: int) -> Version:
        return self._call("version", path={"version_id": version_id})

    def find_version(self, ref: str | int, *, adapter_id: str | None = None) -> Version:
        """A version by id (``7``), label (``support@2026-12-03.1``), or version string with
        ``adapter_id``."""
        text = str(ref)
        if text.isdigit():
            return self.version(int(text))
        adapter, _, version = text.rpartition("@")
        adapter = adapter or adapter_id or ""
        if not adapter:
            raise LorahubError(
                f"'{text}' names no adapter: give a version id, adapter@version, or --adapter"
            )
        for found in self.versions(adapter):
            if found.version == version:
                return found
        raise NotFound(404, "not_found", f"adapter '{adapter}' has no version '{version}'")

    def pull(self, version: Version, folder: Path) -> list[str]:
        """Download ``version``'s files and its bundle into ``folder`` (``downloads.pull``)."""
        return pull_files(self.transport, version, folder)

    def upload(
        self,
        adapter_id: str,
        path: str | os.PathLike[str],
        *,
        version: str | None = None,
        base_model_revision: str = "",
        training_data_summary: str = "",
        progress: Progress | None = None,
    ) -> Version:
        """Upload a PEFT output folder (its adapter files) or one .zip/.tar.gz as a new version.
        Validation then runs on the server: ``wait_for_verdict`` follows it."""
        source = Path(path)
        if source.is_dir():
            chosen, _ = adapter_files(source)
        elif source.is_file():
            chosen = [source]
        else:
            raise LorahubError(f"{source} does not exist")
        total = sum(p.stat().st_size for p in chosen)
        sent = [0]

        def advanced(n: int) -> None:
            sent[0] += n
            if progress is not None:
                progress(min(sent[0], total), total)

        data = {"base_model_revision": base_model_revision}
        data["training_data_summary"] = training_data_summary
        if version:
            data["version"] = version
        with ExitStack() as stack:
            files = [
                (
                    "files",
                    (p.name, CountingFile(stack.enter_context(p.open("rb")), advanced), None),
                )
                for p in chosen
            ]
            return self._call("upload", path={"adapter_id": adapter_id}, files=files, data=data)

    def wait_for_verdict(
        self, version_id: int, *, timeout: float = 600.0, poll: float = 1.0
    ) -> Version:
        """Follow validation until the version leaves ``validating``. A rejected version raises
        ``Rejected`` with the server's reason verbatim."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.version(version_id)
            if found.state == "rejected":
                raise Rejected(found.label, found.rejection_reason)
            if found.state != "validating":
                return found
            if time.monotonic() >= deadline:
                raise TimedOut(f"{found.label} is still validating after {timeout:.0f} s")
            self._sleep(poll)
            poll = min(poll * 1.5, 5.0)

    # --- aliases --------------------------------------------------------------------------

    def aliases(self) -> list[Alias]:
        return self._call("aliases")

    def alias(self, name: str) -> Alias:
        return self._call("alias", path={"name": name})

    def set_alias(self, name: str, version_id: int, *, reason: str = "") -> Alias:
        body = {"version_id": version_id, "reason": reason}
        return self._call("set_alias", path={"name": name}, json=body)

    def canary(
        self,
        name: str,
        version_id: int | None,
        *,
        percent: int = 0,
        api_keys: list[str] | None = None,
        reason: str = "",
    ) -> Alias:
        """Send ``percent`` of the alias's requests (and always those of ``api_keys``, by
        prefix) to ``version_id``; ``None`` clears the canary."""
        body = {
            "version_id": version_id,
            "percent": percent,
            "api_keys": api_keys or [],
            "reason": reason,
        }
        return self._call("canary", path={"name": name}, json=body)

    def promote(self, name: str, *, reason: str = "") -> Alias:
        return self._call("promote", path={"name": name}, json={"reason": reason})

    def rollback(self, name: str, *, reason: str = "") -> Alias:
        return self._call("rollback", path={"name": name}, json={"reason": reason})

    # --- evaluations ------------------------------------------------------------------------

    def evaluation_sets(self, adapter_id: str) -> list[EvaluationSet]:
        return self._call("evaluation_sets", path={"adapter_id": adapter_id})

    def upload_evaluation_set(
        self, adapter_id: str, name: str, path: str | os.PathLike[str]
    ) -> SetRevision:
        """Attach a JSONL set (its next immutable revision; the same bytes add none)."""
        with Path(path).open("rb") as handle:
            return self._call(
                "upload_evaluation_set",
                path={"adapter_id": adapter_id, "name": name},
                files={"file": (Path(path).name, handle, "application/jsonl")},
            )

    def start_evaluation(
        self,
        candidate_version_id: int,
        set_revision_id: int,
        *,
        baseline_version_id: int | None = None,
        alias: str | None = None,
    ) -> EvaluationRun:
        body = {
            "candidate_version_id": candidate_version_id,
            "set_revision_id": set_revision_id,
            "baseline_version_id": baseline_version_id,
            "alias": alias,
        }
        return self._call("start_evaluation", json=body)

    def evaluations(self, *, version_id: int | None = None) -> list[EvaluationRun]:
        return self._call("evaluations", params={"version_id": version_id} if version_id else None)

    def evaluation(self, run_id: int) -> EvaluationRun:
        return self._call("evaluation", path={"run_id": run_id})

    def evaluation_cases(
        self, run_id: int, *, failed: bool = False, changed: bool = False
    ) -> list[CaseResult]:
        params = {"failed": str(failed).lower(), "changed": str(changed).lower()}
        return self._call("evaluation_cases", path={"run_id": run_id}, params=params)

    def wait_for_evaluation(
        self,
        run_id: int,
        *,
        timeout: float = 1800.0,
        poll: float = 1.0,
        on_progress: Callable[[EvaluationRun], None] | None = None,
    ) -> EvaluationRun:
        deadline = time.monotonic() + timeout
        while True:
            run = self.evaluation(run_id)
            if on_progress is not None:
                on_progress(run)
            if run.state in FINISHED_RUN_STATES:
                return run
            if time.monotonic() >= deadline:
                raise TimedOut(
                    f"evaluation run {run_id} is still {run.state} after {timeout:.0f} s"
                )
            self._sleep(poll)

    # --- releases (admin keys) -----------------------------------------------------------------

    def start_release(
        self, alias: str, version_id: int, *, plan: dict[str, Any] | None = None
    ) -> Release:
        """A progressive release of ``alias`` to ``version_id``: the tenant's default plan with
        ``plan``'s fields over it (docs/releases.md); the server names any bad field."""
        body = {"version_id": version_id, "plan": plan or {}}
        return self._call("start_release", path={"name": alias}, json=body)

    def releases(self, *, alias: str | None = None, active: bool = False) -> list[Release]:
        params: dict[str, Any] = {"active": str(active).lower()}
        if alias:
            params["alias"] = alias
        return self._call("releases", params=params)

    def release(self, release_id: int) -> Release:
        return self._call("release", path={"release_id": release_id})

    def pause_release(self, release_id: int) -> Release:
        return self._call("pause_release", path={"release_id": release_id})

    def resume_release(self, release_id: int) -> Release:
        return self._call("resume_release", path={"release_id": release_id})

    def promote_release(self, release_id: int) -> Release:
        return self._call("promote_release", path={"release_id": release_id})

    def abort_release(self, release_id: int, *, reason: str = "") -> Release:
        return self._call("abort_release", path={"release_id": release_id}, json={"reason": reason})

    def watch_release(
        self,
        release_id: int,
        *,
        timeout: float = 7 * 86400.0,
        poll: float = 2.0,
        on_change: Callable[[Release], None] | None = None,
    ) -> Release:
        """Follow a release until it is promoted, rolled back or aborted."""
        deadline = time.monotonic() + timeout
        seen: tuple[str, int, int] | None = None
        while True:
            found = self.release(release_id)
            now = (found.state, found.step, len(found.events))
            if now != seen and on_change is not None:
                on_change(found)
            seen = now
            if found.finished:
                return found
            if time.monotonic() >= deadline:
                raise TimedOut(f"release {release_id} is still {found.state} after {timeout:.0f} s")
            self._sleep(poll)

    # --- keys and the audit log (admin keys) -------------------------------------------------

    def keys(self) -> list[ApiKey]:
        return self._call("keys", path={"slug": self.tenant})

    def create_key(self, name: str, *, expires_at: datetime | None = None) -> NewApiKey:
        """A new member key (shown once). Admin keys are made by a person, in the console.
        ``expires_at``: when it stops working (401 ``key_expired``); None: until revoked."""
        body: dict[str, Any] = {"name": name}
        if expires_at is not None:
            body["expires_at"] = expires_at.isoformat()
        return self._call("create_key", path={"slug": self.tenant}, json=body)

    def revoke_key(self, prefix: str) -> ApiKey:
        prefix = prefix.removeprefix("lh_").split("_")[0]
        return self._call("revoke_key", path={"slug": self.tenant, "prefix": prefix})

    def usage(self, **window: str | None) -> Usage:
        """The usage ledger (``from``, ``to``, ``group_by``, ``granularity``, ``tenant``;
        docs/usage.md), every page of it."""
        params: dict[str, Any] = {k: v for k, v in window.items() if v}
        found: Usage = self._call("usage", params=params)
        rows = list(found.rows)
        while found.next_offset is not None:
            found = self._call("usage", params={**params, "offset": found.next_offset})
            rows += found.rows
        return found.model_copy(update={"rows": rows, "next_offset": None})

    def usage_csv(self, **window: str | None) -> str:
        """The same rows as CSV, as the server writes them, every page (one header line)."""
        method, path = DOWNLOADS["usage_csv"]
        params: dict[str, Any] = {k: v for k, v in window.items() if v}
        answer = self.transport.send(method, path, params=params)
        text = answer.text
        while "x-next-offset" in answer.headers:
            params["offset"] = answer.headers["x-next-offset"]
            answer = self.transport.send(method, path, params=params)
            text += answer.text.split("\n", 1)[1]  # the header line once
        return text

    def audit(self, *, action: str | None = None, limit: int = 200) -> list[AuditEvent]:
        params: dict[str, Any] = {"limit": limit}
        if action:
            params["action"] = action
        return self._call("audit", params=params)

    # --- a smoke request to a node ------------------------------------------------------------

    def chat(
        self, model: str, message: str, *, max_tokens: int = 64, temperature: float = 0.0
    ) -> ChatAnswer:
        """One chat completion from a serving node (or the fleet's router): the OpenAI API;
        greedy by default, so that the same version gives the same answer."""
        if not self.inference_url:
            raise LorahubError(
                "no inference URL: pass inference_url (or set LORAHUB_INFERENCE_URL, or "
                "`lorahub login --inference-url`), e.g. http://127.0.0.1:8001"
            )
        body = {
            "model": model,
            "messages": [{"role": "user", "content": message}],
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        with self.transport.elsewhere(self.inference_url) as node:
            response = self.transport.send("POST", "/v1/chat/completions", base=node, json=body)
        choice = response.json()["choices"][0]
        return ChatAnswer(
            model=model,
            text=choice["message"]["content"],
            finish_reason=choice.get("finish_reason"),
            adapter=response.headers.get("X-Lorahub-Adapter"),
            node=response.headers.get("X-Lorahub-Node"),
            cache_tier=response.headers.get("X-Lorahub-Cache-Tier"),
        )
