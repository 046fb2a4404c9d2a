"""Trust on the node: which versions it may serve, and what happens when bytes fail a check.

- ``admit``: a version is served only if it is approved and signed, trained on the base
  revision this node serves, within the engine's LoRA rank, and its signed manifest verifies
  against the registry's published keys (remembered per version and signature: a version is
  immutable, so a changed signature is a different question).
- ``integrity_failure``: bytes that fail their check are counted; bytes from the registry
  (L4) that fail the signed manifest also quarantine the version on this node, recorded
  with an audit event, so an operator sees it and can lift it.
- ``open_quarantines``: the versions this node must refuse (an operator's lift shows here).
"""

from __future__ import annotations

import logging

from apps.fleet import quarantine
from apps.registry import keys
from apps.registry.contracts import ResolvedVersion
from apps.serving import offload
from apps.serving.cache.disk import IntegrityFailure, verify_manifest
from apps.serving.node import openai_protocol as oai
from apps.serving.node.engine import EngineSettings
from apps.serving.node.metrics import NodeMetrics

logger = logging.getLogger(__name__)


class Trust:
    def __init__(self, *, engine: EngineSettings, metrics: NodeMetrics, node_name: str) -> None:
        self.engine = engine
        self.metrics = metrics
        self.node_name = node_name
        self._verified: dict[tuple[int, str], bool] = {}

    async def admit(self, resolved: ResolvedVersion) -> None:
        """Raise the API error that says why ``resolved`` may not be served here, if it may
        not."""
        settings = self.engine
        if not resolved.servable:
            raise oai.ApiError(
                403,
                f"{resolved.label} is not approved and signed; it cannot be served",
                type_="permission_error",
                code="version_not_servable",
            )
        if resolved.base_model_revision != settings.base_model_revision:
            self.metrics.version_mismatch.inc()
            raise oai.ApiError(
                409,
                f"{resolved.label} was trained on base revision "
                f"{resolved.base_model_revision}, but this node serves "
                f"{settings.served_model_name}@{settings.base_model_revision}",
                code="base_revision_mismatch",
            )
        if resolved.rank > settings.max_lora_rank:
            raise oai.ApiError(
                409,
                f"{resolved.label} has rank {resolved.rank}; this node "
                f"serves ranks up to {settings.max_lora_rank}",
                code="rank_too_large",
            )
        if not await self.signature_ok(resolved):
            raise oai.ApiError(
                403,
                f"{resolved.label}'s signature does not verify; it will not be served",
                type_="permission_error",
                code="signature_invalid",
            )

    async def signature_ok(self, resolved: ResolvedVersion) -> bool:
        """Ed25519 check of the version's signed manifest."""
        key = (resolved.version_id, resolved.signature)
        if key not in self._verified:
            public = await offload.run(keys.published_public_keys)
            if len(self._verified) > 10_000:
                self._verified.clear()
            try:
                verify_manifest(resolved, public)
                self._verified[key] = True
            except IntegrityFailure:
                self._verified[key] = False
        return self._verified[key]

    def integrity_failure(self, resolved: ResolvedVersion, tier: str, reason: str) -> None:
        """Count it; a failure at the registry (L4) also quarantines the version on this node,
        with an audit event (blocking: called from the cache manager's landing thread)."""
        self.metrics.integrity_failures.labels(tier=tier).inc()
        if tier != "L4":
            return
        # the row only: the control plane checks it, then audits and announces it
        # (apps/fleet/quarantine.py, ``announce``); this node's role may not write either
        quarantine.record(
            version_id=resolved.version_id, node=self.node_name, tier=tier, reason=reason
        )

    async def open_quarantines(self) -> set[int] | None:
        """The versions with an open quarantine of this node; None when the database does not
        answer (the set in force then stays)."""
        try:
            return await offload.run(quarantine.open_on, self.node_name)
        except Exception:
            logger.warning("could not read this node's quarantines; keeping the set in force")
            return None
