"""Quarantine as a recorded state: which node refused which version, when and why, and an
operator's way out.

A node that finds a version's registry bytes failing the signed manifest records an open
``Quarantine`` (and refuses the version with 403 ``quarantined``). It stays refused on that node
until an operator lifts it — after the registry copy verifies again, checked here by the same
landing the node does (download, every sha256 against the signed manifest, the signature).
Lifting is audited and broadcast; nodes re-read their open quarantines on the broadcast, on
their periodic full refresh and at start.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.fleet.models import Quarantine
from apps.registry import keys
from apps.registry.snapshots import load_version
from apps.registry.storage import get_store
from apps.serving.cache.disk import DiskTier, IntegrityFailure
from apps.tenants import services as tenant_services
from apps.tenants import webhooks
from apps.tenants.auth import Principal
from apps.tenants.errors import Conflict, Invalid, NotFound
from apps.tenants.events import publish_change

logger = logging.getLogger(__name__)


def record(*, version_id: int, node: str, tier: str, reason: str) -> bool:
    """A node opens a quarantine of ``version_id`` on itself (no-op if one is open); True if
    new. The node writes this row only: the audit row and the webhooks are the control
    plane's (``announce``), after it has checked the report. A node's database role may not
    insert either, so a compromised node cannot send a tenant a signed event."""
    try:
        with transaction.atomic():
            _, created = Quarantine.objects.get_or_create(
                version_id=version_id,
                node=node,
                lifted_at=None,
                defaults={"tier": tier, "reason": reason[:2000]},
            )
    except IntegrityError:  # opened meanwhile by another thread of the same node
        return False
    return created


def announce() -> list[int]:
    """The control plane's side of a node's report (the worker, on the beat): each open
    quarantine not yet announced is checked — the node is one the registry knows, and the
    control plane's own landing of the registry copy fails too — then audited, and, when
    confirmed, sent to the tenant's webhooks and the operators'. A report that does not hold
    up (an unknown node, a registry copy that verifies here) is audited as unconfirmed and
    sent to nobody; the node still refuses the version until an operator lifts it. Returns
    the quarantines announced."""
    from apps.fleet.models import ServingNode

    done = []
    pending = Quarantine.objects.select_related("version__adapter__tenant").filter(
        announced_at__isnull=True, lifted_at__isnull=True
    )
    for row in pending[:100]:
        version, tenant = row.version, row.version.adapter.tenant
        known = ServingNode.objects.filter(name=row.node).exists()
        confirmed = False
        if known:
            try:
                verify_registry_copy(version.pk)
            except Exception as exc:  # the registry's copy does not land here either
                logger.info("quarantine of %s on %s confirmed: %s", version.pk, row.node, exc)
                confirmed = True
        with transaction.atomic():
            claimed = Quarantine.objects.filter(pk=row.pk, announced_at__isnull=True).update(
                announced_at=timezone.now()
            )
            if not claimed:  # another worker took it
                continue
            tenant_services.record_event(
                action="version.quarantine" if confirmed else "version.quarantine_unconfirmed",
                obj=version,
                tenant=tenant,
                after={"node": row.node, "tier": row.tier, "confirmed": confirmed},
                note=(
                    row.reason[:500]
                    if confirmed
                    else f"reported by {'node ' + row.node if known else 'an unknown node'}; "
                    "the registry copy verifies on the control plane"
                ),
            )
            if confirmed:
                webhooks.notify(
                    "version.quarantined",
                    tenant=tenant,
                    data={
                        "version": version.label,
                        "version_id": version.pk,
                        "node": row.node,
                        "tier": row.tier,
                        "reason": row.reason[:500],
                    },
                )
        done.append(row.pk)
    return done


def open_on(node: str) -> set[int]:
    """The versions ``node`` must refuse."""
    return set(
        Quarantine.objects.filter(node=node, lifted_at__isnull=True).values_list(
            "version_id", flat=True
        )
    )


def listing(*, include_lifted: bool = False) -> list[dict]:
    rows = Quarantine.objects.select_related("version__adapter__tenant", "lifted_by")
    if not include_lifted:
        rows = rows.filter(lifted_at__isnull=True)
    return [
        {
            "id": q.pk,
            "version_id": q.version_id,
            "version": f"{q.version.adapter.tenant.slug}/{q.version.adapter.adapter_id}"
            f"@{q.version.version}",
            "node": q.node,
            "tier": q.tier,
            "reason": q.reason,
            "at": q.at,
            "lifted_at": q.lifted_at,
            "lifted_by": q.lifted_by.get_username() if q.lifted_by else None,
            "lift_note": q.lift_note,
        }
        for q in rows[:500]
    ]


def verify_registry_copy(version_id: int) -> None:
    """Land the version from the registry into a scratch folder exactly as a node does;
    raises ``Conflict`` naming what still fails."""
    resolved = load_version(version_id)
    if resolved is None:
        raise NotFound(f"no version {version_id}")
    with tempfile.TemporaryDirectory(prefix="lorahub-reverify-") as scratch:
        try:
            DiskTier(Path(scratch)).land(resolved, get_store(), keys.published_public_keys())
        except IntegrityFailure as exc:
            raise Conflict(
                f"{resolved.label} still fails verification against its signed manifest "
                f"({exc}); put the original bytes back in the registry, then lift again"
            ) from None


def lift(*, quarantine_id: int, principal: Principal, note: str) -> list[str]:
    """Re-verify the registry copy, then close every open quarantine of that version (the
    bytes are shared: what verifies for one node verifies for all). Returns the nodes."""
    principal.require_operator()
    principal.require_second_factor("lifting a quarantine")
    quarantine = (
        Quarantine.objects.select_related("version__adapter__tenant")
        .filter(pk=quarantine_id)
        .first()
    )
    if quarantine is None:
        raise NotFound(f"no quarantine {quarantine_id}")
    if quarantine.lifted_at is not None:
        raise Conflict(f"quarantine {quarantine_id} was already lifted")
    if not note.strip():
        raise Invalid("say why the quarantine can be lifted: a note is required")
    verify_registry_copy(quarantine.version_id)
    version = quarantine.version
    with transaction.atomic():
        open_ = Quarantine.objects.select_for_update().filter(
            version=version, lifted_at__isnull=True
        )
        nodes = sorted(open_.values_list("node", flat=True))
        open_.update(lifted_at=timezone.now(), lifted_by=principal.user, lift_note=note)
        tenant_services.record_event(
            action="version.quarantine_lift",
            obj=version,
            actor=principal.user,
            tenant=version.adapter.tenant,
            after={"nodes": nodes},
            note=note,
        )
        publish_change("quarantine", version_id=version.pk)
    logger.info("quarantine of version %s lifted on %s", version.pk, ", ".join(nodes))
    return nodes
