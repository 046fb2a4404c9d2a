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

from apps.fleet import node_registry
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


def alias_table(node: NodeClient, *, tenant: str, alias: str) -> dict:
    """What ``node`` serves for a tenant's alias right now (``/internal/alias``)."""
    from urllib.parse import urlencode

    return _call(node, "GET", "/internal/alias?" + urlencode({"tenant": tenant, "alias": alias}))


def act(node: NodeClient, verb: str, *, version_id: int, tier: str, route: str = "") -> dict:
    """``/internal/warm`` or ``/internal/evict`` of one version; through a router, ``route``
    is the routing key HAProxy hashes (``route_key``)."""
    body = {"version_id": version_id, "tier": tier}
    return _call(node, "POST", f"/internal/{verb}", body, route=route)


def route_key(api_key_prefix: str, model: str) -> str:
    """The routing key HAProxy hashes for a request (see ``haproxy.py``): the API key's prefix
    and the requested model, so one tenant's alias stays on the node(s) that hold it."""
    return f"{api_key_prefix}/{model}"
