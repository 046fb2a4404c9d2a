"""Fleet workflows that console pages and the REST API share: each validates what it is
given, does the work, and records its audit event.

- ``act_on_node``: warm or evict one version on one node;
- ``act_on_alias``: warm or evict an alias's versions on the node(s) that own it.
"""

from __future__ import annotations

from django.conf import settings

from apps.fleet import node_client
from apps.registry.models import AdapterVersion, Alias
from apps.registry.snapshots import load_alias_snapshot
from apps.tenants import services as tenant_services
from apps.tenants.errors import Conflict, DomainError, NotFound
from apps.tenants.models import ApiKey


def act_on_node(
    *, node: node_client.NodeClient, version: AdapterVersion, verb: str, tier: str, actor
) -> dict:
    """Warm ``version`` into ``tier`` on ``node``, or evict it from there; audited as
    ``node.warm`` / ``node.evict`` with the node's answer."""
    if verb not in ("warm", "evict") or tier not in node_client.TIERS:
        raise NotFound(f"no node action {verb} to {tier}")
    result = node_client.act(node, verb, version_id=version.pk, tier=tier)
    tenant_services.record_event(
        action=f"node.{verb}",
        obj=version,
        actor=actor,
        tenant=version.adapter.tenant,
        after={"node": node.name, "tier": tier, **result},
    )
    return result


def act_on_alias(*, tenant_slug: str, alias: str, verb: str, tier: str, actor) -> list[dict]:
    """Warm or evict an alias's versions (stable and canary) on the node(s) that own it;
    audited as ``alias.warm`` / ``alias.evict`` with the nodes reached.

    With a router, one call per active API key of the tenant goes through HAProxy with that
    key's routing key, so each lands where that key's requests for the alias land; a tenant
    with one key reaches one node (two when a bounded load spilled it). Returns one entry per
    call: the node that answered and its answer, or the error.
    """
    if verb not in ("warm", "evict") or tier not in node_client.TIERS:
        raise NotFound(f"no alias action {verb} to {tier}")
    found = (
        Alias.objects.select_related("tenant").filter(tenant__slug=tenant_slug, name=alias).first()
    )
    snapshot = load_alias_snapshot(tenant_id=found.tenant_id, name=alias) if found else None
    if found is None or snapshot is None:
        raise NotFound(f"tenant '{tenant_slug}' has no alias '{alias}': check both names")
    versions = [snapshot.stable] + [v for v in (snapshot.canary, snapshot.shadow) if v]
    if settings.LORAHUB_ROUTER_INTERNAL_URL:
        prefixes = list(
            ApiKey.objects.active().filter(tenant=found.tenant).values_list("prefix", flat=True)
        )
        if not prefixes:
            raise Conflict(
                f"tenant '{tenant_slug}' has no active API key, so no request can reach "
                f"'{alias}' and no node owns it; create a key first"
            )
        router = node_client.NodeClient(name="router", url=settings.LORAHUB_ROUTER_INTERNAL_URL)
        targets = [(router, node_client.route_key(prefix, alias)) for prefix in sorted(prefixes)]
    else:
        targets = [(node, "") for node in node_client.configured_nodes()]
    results = []
    for node, route in targets:
        for version in versions:
            try:
                answer = node_client.act(
                    node, verb, version_id=version.version_id, tier=tier, route=route
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
