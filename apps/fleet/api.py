"""Operator endpoints of the fleet: the nodes, their cache state, warming and evicting an
alias's versions, and quarantines."""

from __future__ import annotations

from typing import Literal

from django.http import HttpRequest
from ninja import Router, Schema

from apps.fleet import node_client, node_registry, quarantine, services
from apps.tenants.auth import OPERATOR_AUTH, Principal

router = Router(tags=["nodes"], auth=OPERATOR_AUTH)


def _operator(request: HttpRequest) -> Principal:
    principal: Principal = request.auth  # type: ignore[attr-defined]  # set by ninja's auth
    principal.require_operator()
    return principal


@router.get("/nodes", response=list[dict], tags=["nodes"])
def list_nodes(request: HttpRequest):
    """Every registered serving node: address, base model and revision, LoRA limits, state
    (ready, starting, restarting, dead, lost: no heartbeat lately, stopped), last heartbeat."""
    _operator(request)
    return node_registry.listing()


@router.get("/nodes/{name}/cache", response=dict, tags=["nodes"])
def node_cache(request: HttpRequest, name: str):
    """One node's cache, read from the node: policy, limits, residents per tier."""
    _operator(request)
    return node_client.cache_state(node_client.node_named(name))


class AliasActionIn(Schema):
    tenant: str
    alias: str
    tier: Literal["L1", "L2", "L3"] = "L3"


def _alias_action(request: HttpRequest, body: AliasActionIn, verb: str) -> dict:
    principal = _operator(request)
    results = services.act_on_alias(
        tenant_slug=body.tenant, alias=body.alias, verb=verb, tier=body.tier, actor=principal.user
    )
    return {"alias": body.alias, "tier": body.tier, "results": results}


@router.post("/nodes/warm", response=dict, tags=["nodes"])
def warm_alias(request: HttpRequest, body: AliasActionIn):
    """Warm an alias's versions (stable and canary) into a tier on the node(s) HAProxy routes
    the alias to (every node when no router is configured). L3 is a prewarm: the download and
    verification, without taking an engine slot."""
    return _alias_action(request, body, "warm")


@router.post("/nodes/evict", response=dict, tags=["nodes"])
def evict_alias(request: HttpRequest, body: AliasActionIn):
    """Evict an alias's versions from a tier (and those below it) on the node(s) that own it."""
    return _alias_action(request, body, "evict")


@router.get("/quarantines", response=list[dict], tags=["nodes"])
def list_quarantines(request: HttpRequest, include_lifted: bool = False):
    """Versions nodes refuse because their registry bytes failed the signed manifest: which
    node, when, why. Open ones only, unless ``include_lifted=true`` (with who lifted them, why)."""
    _operator(request)
    return quarantine.listing(include_lifted=include_lifted)


class LiftIn(Schema):
    note: str


@router.post("/quarantines/{quarantine_id}/lift", response=dict, tags=["nodes"])
def lift_quarantine(request: HttpRequest, quarantine_id: int, body: LiftIn):
    """Lift a quarantine once the registry copy verifies again (checked now, as a node lands
    it; 409 naming what still fails otherwise). Closes the version's open quarantines on
    every node; audited as ``version.quarantine_lift``; nodes serve it again within a second."""
    principal = _operator(request)
    nodes_ = quarantine.lift(quarantine_id=quarantine_id, principal=principal, note=body.note)
    return {"lifted_on": nodes_}
