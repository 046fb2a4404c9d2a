"""The console's client of the serving nodes' internal API (``/internal/*``).

Called server-side only, with the internal token, which never reaches a browser. Nodes are
the ``LORAHUB_NODES`` list. A node that does not answer is reported, never fatal to a page.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx
from django.conf import settings

from apps.tenants.errors import Conflict, DomainError, NotFound

logger = logging.getLogger(__name__)
TIMEOUT_S = 3.0
TIERS = ("L1", "L2", "L3")


class NodeUnavailable(DomainError):
    status = 503
    code = "node_unavailable"


@dataclass(frozen=True)
class Node:
    name: str
    url: str


def configured_nodes() -> list[Node]:
    nodes = []
    for entry in settings.LORAHUB_NODES:
        name, _, url = entry.partition("=")
        nodes.append(Node(name=name.strip(), url=url.strip().rstrip("/")))
    return nodes


def node_named(name: str) -> Node:
    for node in configured_nodes():
        if node.name == name:
            return node
    raise NotFound(f"no serving node named '{name}'")


def _call(node: Node, method: str, path: str, body: dict | None = None) -> dict:
    token = settings.LORAHUB_INTERNAL_TOKEN
    if not token:
        raise NodeUnavailable(
            "the console has no internal token: set LORAHUB_INTERNAL_TOKEN to the nodes' token"
        )
    try:
        response = httpx.request(
            method,
            f"{node.url}{path}",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
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
    return data


def cache_state(node: Node) -> dict:
    """The node's ``/internal/cache``: policy, limits, residents per tier, loading, quarantined."""
    return _call(node, "GET", "/internal/cache")


def warm(node: Node, *, version_id: int, tier: str) -> dict:
    return _call(node, "POST", "/internal/warm", {"version_id": version_id, "tier": tier})


def evict(node: Node, *, version_id: int, tier: str) -> dict:
    return _call(node, "POST", "/internal/evict", {"version_id": version_id, "tier": tier})
