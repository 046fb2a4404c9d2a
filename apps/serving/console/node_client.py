"""The console's client of the serving nodes' internal API (``/internal/*``).

Called server-side only, with the internal token, which never reaches a browser. Nodes are
the ones listed in ``LORAHUB_NODES`` plus the registered ones (``node_registry``). A node that does
not answer is reported, never fatal to a page.

Alias-level warm and evict (``alias_action``) go to the node(s) that own the alias under
HAProxy's consistent hash: through HAProxy's internal listener (``LORAHUB_ROUTER_INTERNAL_URL``)
with the same routing key a request carries, so HAProxy itself picks the node and no second
copy of its hash ring exists here. Without a router they go to every node.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx
from django.conf import settings

from apps.serving import node_registry
from apps.tenants.errors import Conflict, DomainError, NotFound

logger = logging.getLogger(__name__)
TIMEOUT_S = 3.0
TIERS = ("L1", "L2", "L3")


class NodeUnavailable(DomainError):
    status = 503
    code = "node_unavailable"


@dataclass(frozen=True)
class NodeClient:
    name: str
    url: str
    state: str = ""  # from the registry; "" for a node only listed in LORAHUB_NODES
    registered: dict | None = None


def configured_nodes() -> list[NodeClient]:
    """Nodes listed in ``LORAHUB_NODES`` (their address there wins over the registered one:
    the console may reach a node by another address than it registered), then every
    registered node not listed and not stopped cleanly."""
    registered = {row["name"]: row for row in node_registry.listing()}
    nodes = []
    for entry in settings.LORAHUB_NODES:
        name, _, url = (part.strip() for part in entry.partition("="))
        row = registered.pop(name, None)
        nodes.append(
            NodeClient(
                name=name, url=url.rstrip("/"), state=row["state"] if row else "", registered=row
            )
        )
    nodes.extend(
        NodeClient(name=name, url=row["url"].rstrip("/"), state=row["state"], registered=row)
        for name, row in registered.items()
        if row["state"] != "stopped"
    )
    return nodes


def node_named(name: str) -> NodeClient:
    for node in configured_nodes():
        if node.name == name:
            return node
    raise NotFound(f"no serving node named '{name}'")


def _call(
    node: NodeClient, method: str, path: str, body: dict | None = None, *, route: str = ""
) -> dict:
    token = settings.LORAHUB_INTERNAL_TOKEN
    if not token:
        raise NodeUnavailable(
            "the console has no internal token: set LORAHUB_INTERNAL_TOKEN to the nodes' token"
        )
    headers = {"Authorization": f"Bearer {token}"}
    if route:
        headers["X-Lorahub-Route"] = route
    try:
        response = httpx.request(
            method,
            f"{node.url}{path}",
            json=body,
            headers=headers,
            timeout=TIMEOUT_S if method == "GET" else 60.0,
        )
    except httpx.HTTPError as exc:
        logger.warning("node %s did not answer %s %s: %s", node.name, method, path, exc)
        raise NodeUnavailable(
            f"node '{node.name}' did not answer ({node.url}); is it running?"
        ) from None
    try:
        data = response.json()
    except ValueError:
        data = {}
    if response.status_code >= 400:
        message = (data.get("error") or {}).get("message") or f"HTTP {response.status_code}"
        if response.status_code == 409:
            raise Conflict(f"node '{node.name}': {message}")
        if response.status_code == 404:
            raise NotFound(f"node '{node.name}': {message}")
        raise NodeUnavailable(f"node '{node.name}' refused: {message}")
    answered_by = response.headers.get("x-lorahub-node")
    return {**data, "node": answered_by} if answered_by else data


def cache_state(node: NodeClient) -> dict:
    """The node's ``/internal/cache``: policy, limits, residents per tier, loading, quarantined."""
    return _call(node, "GET", "/internal/cache")


def warm(node: NodeClient, *, version_id: int, tier: str) -> dict:
    return _call(node, "POST", "/internal/warm", {"version_id": version_id, "tier": tier})


def evict(node: NodeClient, *, version_id: int, tier: str) -> dict:
    return _call(node, "POST", "/internal/evict", {"version_id": version_id, "tier": tier})


def route_key(api_key_prefix: str, model: str) -> str:
    """The routing key HAProxy hashes for a request (see ``haproxy.py``): the API key's prefix
    and the requested model, so one tenant's alias stays on the node(s) that hold it."""
    return f"{api_key_prefix}/{model}"


def alias_action(*, tenant_slug: str, alias: str, verb: str, tier: str, actor) -> list[dict]:
    """Warm or evict an alias's versions (stable and canary) on the node(s) that own it;
    audited as ``alias.warm`` / ``alias.evict`` with the nodes reached.

    With a router, one call per active API key of the tenant goes through HAProxy with that
    key's routing key, so each lands where that key's requests for the alias land; a tenant
    with one key reaches one node (two when a bounded load spilled it). Returns one entry per
    call: the node that answered and its answer, or the error.
    """
    from apps.registry.aliases import load_alias_snapshot
    from apps.registry.models import Alias
    from apps.tenants import services as tenant_services
    from apps.tenants.models import ApiKey

    if verb not in ("warm", "evict") or tier not in TIERS:
        raise NotFound(f"no alias action {verb} to {tier}")
    found = (
        Alias.objects.select_related("tenant").filter(tenant__slug=tenant_slug, name=alias).first()
    )
    snapshot = load_alias_snapshot(tenant_id=found.tenant_id, name=alias) if found else None
    if found is None or snapshot is None:
        raise NotFound(f"tenant '{tenant_slug}' has no alias '{alias}': check both names")
    versions = [snapshot.stable] + ([snapshot.canary] if snapshot.canary else [])
    if settings.LORAHUB_ROUTER_INTERNAL_URL:
        prefixes = list(
            ApiKey.objects.active().filter(tenant=found.tenant).values_list("prefix", flat=True)
        )
        if not prefixes:
            raise Conflict(
                f"tenant '{tenant_slug}' has no active API key, so no request can reach "
                f"'{alias}' and no node owns it; create a key first"
            )
        router = NodeClient(name="router", url=settings.LORAHUB_ROUTER_INTERNAL_URL)
        targets = [(router, route_key(prefix, alias)) for prefix in sorted(prefixes)]
    else:
        targets = [(node, "") for node in configured_nodes()]
    results = []
    for node, route in targets:
        for version in versions:
            try:
                answer = _call(
                    node,
                    "POST",
                    f"/internal/{verb}",
                    {"version_id": version.version_id, "tier": tier},
                    route=route,
                )
                results.append({"node": answer.pop("node", node.name), "result": answer})
            except DomainError as exc:
                results.append({"node": node.name, "error": exc.message})
    tenant_services.record_event(
        action=f"alias.{verb}",
        obj=found,
        actor=actor,
        tenant=found.tenant,
        after={"tier": tier, "nodes": sorted({r["node"] for r in results})},
    )
    return results
