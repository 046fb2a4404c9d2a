"""The node's internal control API: warm, evict, inspect, and generate with one version (for
evaluation runs). Not for tenants.

Off unless ``LORAHUB_INTERNAL_TOKEN`` is set (every path then answers 404, as if absent), and
then only for callers that send ``Authorization: Bearer <that token>``. Callers name versions
by id or a tenant's alias, never by path: the same checks as for a request apply (servable,
signature, base revision) before anything is fetched or loaded.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from apps.fleet.haproxy import PUBLIC_ENTRY_HEADER
from apps.fleet.node_registry import node_header
from apps.registry.contracts import ResolvedVersion
from apps.registry.snapshots import load_version
from apps.serving import offload
from apps.serving.cache import evictions, report
from apps.serving.cache.engine_tiers import Owner, PinLimit
from apps.serving.cache.landing import AdapterIntegrityError
from apps.serving.cache.manager import CacheManager
from apps.serving.node import openai_protocol as oai
from apps.serving.node.config_in_force import ConfigInForce
from apps.serving.node.engine import Engine
from apps.serving.node.lookups import Caller, Lookups
from apps.serving.node.prewarm import Prewarm
from apps.serving.node.requests import RequestPath
from apps.serving.node.seams import Fault
from apps.serving.node.trust import Trust
from apps.tenants.models import Tenant
from lorahub.addresses import caller_address, internal_networks, is_in
from lorahub.tokens import bearer_matches

TIERS = ("L1", "L2", "L3")


def owner_of(resolved: ResolvedVersion) -> Owner:
    """The version's tenant with its current cache quotas (blocking: reads the database)."""
    from apps.tenants.models import Quota

    quota = Quota.objects.filter(tenant_id=resolved.tenant_id).first()
    tenant = Tenant.objects.filter(pk=resolved.tenant_id).values_list("priority", flat=True)
    priority = tenant.first()
    return Owner(
        tenant_id=resolved.tenant_id,
        priority=1 if priority is None else priority,
        warm_quota=quota.max_warm_adapters if quota else None,
        hot_quota=quota.max_hot_adapters if quota else None,
        hot_memory_bytes=quota.max_hot_memory_mb * 1024 * 1024 if quota else None,
    )


def _json(body: dict, status_code: int = 200, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status_code, headers={**(headers or {}), **node_header()})


def has_internal_token(request: Request) -> bool:
    """True if the request carries the node's internal token (never, when none is set)."""
    return bearer_matches(request.headers.get("authorization", ""), settings.LORAHUB_INTERNAL_TOKEN)


def from_internal_network(request: Request) -> bool:
    """True if the caller is on the platform's own network (``LORAHUB_INTERNAL_NETWORKS``)
    and did not come in through the router's public entrance, which marks what it forwards
    (``apps/fleet/haproxy.py``), however the path was spelled."""
    if request.headers.get(PUBLIC_ENTRY_HEADER):
        return False
    caller = caller_address(
        request.client.host if request.client else "", request.headers.getlist("x-forwarded-for")
    )
    return is_in(caller, internal_networks())


class InternalApi:
    def __init__(
        self,
        *,
        engine: Engine,
        lookups: Lookups,
        trust: Trust,
        cache: CacheManager,
        config: ConfigInForce,
        prewarm: Prewarm,
        requests: RequestPath,
    ) -> None:
        self.engine, self.lookups, self.trust, self.cache = engine, lookups, trust, cache
        self.config, self.prewarmer, self.requests = config, prewarm, requests

    def _check(self, request: Request) -> None:
        if not settings.LORAHUB_INTERNAL_TOKEN or not from_internal_network(request):
            raise oai.ApiError(404, "not found", code="not_found")
        if not has_internal_token(request):
            raise oai.ApiError(
                401,
                "the internal API needs the node's internal token",
                type_="authentication_error",
                code="invalid_internal_token",
            )

    async def _body(self, request: Request) -> dict:
        try:
            body = json.loads(await request.body() or b"{}")
        except json.JSONDecodeError:
            raise oai.ApiError(400, "the body is not valid JSON", code="invalid_json") from None
        if not isinstance(body, dict):
            raise oai.ApiError(400, "the body must be a JSON object", code="invalid_json")
        tier = body.get("tier", "L3")
        if tier not in TIERS:
            raise oai.ApiError(400, f"tier must be one of {', '.join(TIERS)}", code="bad_tier")
        return body

    async def _target(self, body: dict) -> ResolvedVersion:
        if "version_id" in body:
            if not isinstance(body["version_id"], int):
                raise oai.ApiError(400, "version_id must be an integer", code="bad_version")
            resolved = await offload.run(load_version, body["version_id"])
            if resolved is None:
                raise oai.ApiError(404, f"no version {body['version_id']}", code="not_found")
        elif "alias" in body and "tenant" in body:
            tenant = await offload.run(
                lambda: Tenant.objects.filter(slug=str(body["tenant"])).first()
            )
            snapshot = None
            if tenant is not None:
                snapshot = await offload.run(self.lookups.alias, tenant.id, str(body["alias"]))
            if snapshot is None:
                raise oai.ApiError(
                    404,
                    f"no alias '{body['alias']}' of tenant '{body['tenant']}'",
                    code="not_found",
                )
            resolved = snapshot.stable
        else:
            raise oai.ApiError(
                400, "name a version_id, or an alias with its tenant", code="no_target"
            )
        await self.trust.admit(resolved)
        return resolved

    async def generate(self, request: Request) -> Response:
        """``{"version_id", "chat", "body"}``: one non-streamed completion (``chat``: chat
        completion) of an approved, signed version, through the request path — for evaluation
        runs, which compare versions before any alias serves them. ``body`` is an OpenAI
        request without ``model``; the answer is vLLM's response."""
        try:
            self._check(request)
            body = await self._body(request)
            if not isinstance(body.get("body"), dict):
                raise oai.ApiError(400, "body must be an OpenAI request object", code="no_body")
            resolved = await self._target({"version_id": body.get("version_id")})
            owner = await offload.run(owner_of, resolved)
        except oai.ApiError as exc:
            return self._error(exc)
        caller = Caller(
            key_prefix="internal",
            tenant_id=resolved.tenant_id,
            tenant_slug=resolved.tenant_slug,
            priority=owner.priority,
            requests_per_minute=0,
            max_hot_adapters=owner.hot_quota if owner.hot_quota is not None else 2,
            max_warm_adapters=owner.warm_quota if owner.warm_quota is not None else 8,
        )
        return await self.requests.answer_for_version(
            request,
            resolved=resolved,
            caller=caller,
            body=body["body"],
            chat=bool(body.get("chat")),
        )

    async def warm(self, request: Request) -> Response:
        try:
            self._check(request)
            body = await self._body(request)
            resolved = await self._target(body)
            if body.get("tier", "L3") == "L3":
                found = await offload.run(self.cache.land, resolved)
                return _json(
                    {
                        "version": resolved.label,
                        "tier": "L3",
                        "was_in": found.found_in,
                        "load_ms": round(sum(found.timings.values()), 2),
                    }
                )
            if not self.engine.is_ready:
                raise oai.ApiError(
                    503, "the engine is not ready", code="engine_unavailable", retry_after=5
                )
            owner = await offload.run(owner_of, resolved)
            placed = (
                await self.cache.pin(resolved, owner=owner)
                if body["tier"] == "L1"
                else await self.cache.activate(resolved, owner=owner)
            )
            return _json(
                {
                    "version": resolved.label,
                    "tier": body["tier"],
                    "was_in": placed.tier,
                    "load_ms": round(placed.load_ms, 2),
                }
            )
        except PinLimit as exc:
            return self._error(oai.ApiError(409, str(exc), code="pin_limit"))
        except AdapterIntegrityError as exc:
            return self._error(oai.ApiError(403, str(exc), code="quarantined"))
        except oai.ApiError as exc:
            return self._error(exc)

    async def evict(self, request: Request) -> Response:
        try:
            self._check(request)
            body = await self._body(request)
            if body.get("all") is True:  # drain the node: everything from the tier down
                if body.get("tier", "L3") == "L1":
                    raise oai.ApiError(400, "'all' empties L2 or L3", code="bad_tier")
                removed = await evictions.drain(self.cache, disk=body.get("tier", "L3") == "L3")
                return _json({"evicted_from": body.get("tier", "L3"), "removed": removed})
            if not isinstance(body.get("version_id"), int):
                raise oai.ApiError(
                    400, "name the version_id to evict, or send all: true", code="no_target"
                )
            resolved = await offload.run(load_version, body["version_id"])
            if resolved is None:
                raise oai.ApiError(404, f"no version {body['version_id']}", code="not_found")
            tier = body.get("tier", "L3")
            if self.cache.busy(resolved.version_id):
                raise oai.ApiError(
                    409,
                    f"{resolved.label} is loading or answering requests; evict it once they finish",
                    code="in_use",
                    retry_after=1,
                )
            await evictions.evict(self.cache, resolved, tier)
            return _json({"version": resolved.label, "evicted_from": tier})
        except oai.ApiError as exc:
            return self._error(exc)

    async def test_seam_faults(self, request: Request) -> Response:
        """A test seam (``seams.py``): make one version's requests fail or answer late. 404
        unless the node started with LORAHUB_TEST_SEAMS=1."""
        try:
            self._check(request)
            if not self.requests.seams.enabled:
                raise oai.ApiError(404, "not found", code="not_found")
            body = await self._body(request)
            if not isinstance(body.get("version_id"), int):
                raise oai.ApiError(400, "version_id must be an integer", code="bad_version")
            fault = Fault(error=bool(body.get("error")), delay_ms=int(body.get("delay_ms") or 0))
        except (TypeError, ValueError):
            return self._error(oai.ApiError(400, "delay_ms must be an integer", code="bad_delay"))
        except oai.ApiError as exc:
            return self._error(exc)
        self.requests.seams.set(body["version_id"], fault)
        return _json(
            {"version_id": body["version_id"], "error": fault.error, "delay_ms": fault.delay_ms}
        )

    async def prewarm(self, request: Request) -> Response:
        """Run the start-up prewarm now (after a deploy, or a cleared cache)."""
        try:
            self._check(request)
        except oai.ApiError as exc:
            return self._error(exc)
        return _json({"warmed": await self.prewarmer.run()})

    async def alias(self, request: Request) -> Response:
        """What this node serves for a tenant's alias right now (its in-memory table): to check
        that every node of a fleet followed a move."""
        try:
            self._check(request)
            slug, name = request.query_params.get("tenant", ""), request.query_params.get("alias")
            tenant = await offload.run(lambda: Tenant.objects.filter(slug=slug).first())
            snapshot = None
            if tenant is not None and name:
                snapshot = await offload.run(self.lookups.alias, tenant.id, name)
            if snapshot is None:
                raise oai.ApiError(
                    404, f"no alias '{name}' of tenant '{slug}' on this node", code="not_found"
                )
        except oai.ApiError as exc:
            return self._error(exc)
        canary = snapshot.canary
        return _json(
            {
                "tenant": slug,
                "alias": name,
                "stable": snapshot.stable.label,
                "stable_version_id": snapshot.stable.version_id,
                "canary": canary.label if canary else None,
                "canary_version_id": canary.version_id if canary else None,
                "canary_percent": snapshot.canary_percent if canary else 0,
                "shadow": snapshot.shadow.label if snapshot.shadow else None,
                "shadow_percent": snapshot.shadow_percent if snapshot.shadow else 0,
            }
        )

    async def cache_state(self, request: Request) -> Response:
        try:
            self._check(request)
        except oai.ApiError as exc:
            return self._error(exc)
        cache, engine = self.cache, self.engine.settings
        limits = cache.limits
        counted: dict[str, Any] = {}
        if request.query_params.get("engine") == "1" and self.engine.is_ready:
            # a utility call, answered between two of the engine's steps: only when asked
            counted = {"engine": await self.engine.adapter_counts()}
        return _json(
            {
                **counted,
                "load_boundaries": {str(k): v for k, v in sorted(cache.boundaries.items())},
                "loads_waited_on_release": cache.waited_on_release,
                "policy": cache.policy.name,
                "policy_state": cache.policy.describe(),
                "limits": {
                    "max_loras": engine.max_loras,
                    "max_cpu_loras": engine.max_cpu_loras,
                    "max_pinned": engine.max_loras - 1,
                    "warm_max_bytes": limits.warm_bytes,
                    "warm_ttl_s": limits.ttl_s,
                    "disk_max_bytes": limits.disk_bytes,
                    "max_concurrent_fetches": limits.max_fetches,
                    "max_concurrent_loads": limits.max_loads,
                    "max_pending_loads": limits.max_pending,
                },
                "needs_restart": self.config.needs_restart,
                "disk_bytes": cache.disk_bytes(),
                "tiers": report.residents(cache),
                "quarantined": sorted(cache.quarantined),
            }
        )

    @staticmethod
    def _error(exc: oai.ApiError) -> Response:
        headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
        return _json(exc.body(), status_code=exc.status, headers=headers)
