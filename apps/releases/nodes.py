"""A release's calls to the serving nodes (their internal API, with the internal token):
prewarm the candidate, cool it after a rollback, and watch every node follow the alias."""

from __future__ import annotations

import logging
import time

from apps.fleet import node_client
from apps.registry.models import AdapterVersion, Alias
from apps.releases.models import Release, ReleaseEvent
from apps.tenants.errors import Conflict, DomainError

logger = logging.getLogger(__name__)
COOL_TIMEOUT_S = 15.0  # a version still answering its last requests is evicted once they end
FOLLOW_TIMEOUT_S = 15.0


def ready_nodes() -> list[node_client.NodeClient]:
    """The nodes that serve: ready ones (a lost or starting node has nothing to follow or to
    cool, and would only make the judge wait for its timeout), and those only listed in
    LORAHUB_NODES (state unknown)."""
    return [n for n in node_client.configured_nodes() if n.state in ("", "ready")]


def prewarm(version: AdapterVersion) -> tuple[list[str], dict[str, str]]:
    """Load ``version`` into the engine (L2) of every ready node: (nodes warmed, errors by
    node)."""
    warmed, errors = [], {}
    for node in ready_nodes():
        try:
            node_client.act(node, "warm", version_id=version.pk, tier="L2")
            warmed.append(node.name)
        except DomainError as exc:
            errors[node.name] = exc.message
    return warmed, errors


def cool(version: AdapterVersion) -> dict[str, str]:
    """Take ``version`` out of every node's engine (device slots and host RAM), keeping its
    disk copy for a later retry; a node still answering with it is asked again until its
    requests end. Returns each node's outcome."""
    outcome = {}
    for node in ready_nodes():
        deadline = time.monotonic() + COOL_TIMEOUT_S
        while True:
            try:
                node_client.act(node, "evict", version_id=version.pk, tier="L2")
                outcome[node.name] = "cooled (kept on disk)"
                break
            except Conflict as exc:  # in use: its last requests are finishing
                if time.monotonic() > deadline:
                    outcome[node.name] = exc.message
                    break
                time.sleep(0.2)
            except DomainError as exc:
                outcome[node.name] = exc.message
                break
    return outcome


def serving_only(alias: Alias, version: AdapterVersion) -> dict[str, float | None]:
    """Seconds until each node's alias table serves ``version`` alone (no canary, no shadow):
    None for a node that had not within the timeout (or did not answer)."""
    started = time.monotonic()
    waiting = {n.name: n for n in ready_nodes()}
    found: dict[str, float | None] = {}
    while waiting and time.monotonic() - started < FOLLOW_TIMEOUT_S:
        for name, node in list(waiting.items()):
            try:
                table = node_client.alias_table(node, tenant=alias.tenant.slug, alias=alias.name)
            except DomainError:
                continue
            if (
                table.get("stable_version_id") == version.pk
                and not table.get("canary")
                and not table.get("shadow")
            ):
                found[name] = time.monotonic() - started
                del waiting[name]
        if waiting:
            time.sleep(0.05)
    found.update({name: None for name in waiting})
    return found


def cool_down(release_id: int, *, started: float, actor: str) -> None:
    """After a rollback is committed: wait for every node to serve the baseline alone, then
    take the candidate out of every node's engine (kept on disk); recorded with how long the
    nodes took from ``started`` (``time.time()`` of the judgement or the abort)."""
    fresh = Release.objects.select_related("alias__tenant", "candidate", "baseline").get(
        pk=release_id
    )
    followed = serving_only(fresh.alias, fresh.baseline)
    to_baseline = time.time() - started
    cooled = cool(fresh.candidate)
    timings = {
        "judgement_to_last_node_baseline_only_ms": round(to_baseline * 1000, 1)
        if followed and None not in followed.values()
        else None,
        "nodes_baseline_only_s": followed,
        "cooled": cooled,
    }
    ReleaseEvent.objects.create(
        release=fresh,
        kind="cooled",
        from_state=fresh.state,
        to_state=fresh.state,
        step=fresh.step,
        actor=actor,
        note=f"{fresh.candidate.label} left the engine of every node (kept on disk)",
        timings=timings,
    )
    logger.info("release %s rolled back; %s", release_id, timings)
