"""Test seams: faults a test injects into a running node for one version only — its requests
fail, or answer late — to drill what the platform does when a version misbehaves (a release's
automatic rollback). Off unless the node starts with ``LORAHUB_TEST_SEAMS=1`` (never in
production); set through ``POST /internal/test-seams/faults`` with the internal token:
``{"version_id": 7, "error": true}``, ``{"version_id": 7, "delay_ms": 800}``, or
``{"version_id": 7}`` to clear."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from django.conf import settings

from apps.serving.node import openai_protocol as oai


@dataclass(frozen=True)
class Fault:
    error: bool = False
    delay_ms: int = 0


class Seams:
    def __init__(self) -> None:
        self.faults: dict[int, Fault] = {}

    @property
    def enabled(self) -> bool:
        return bool(settings.LORAHUB_TEST_SEAMS)

    def set(self, version_id: int, fault: Fault) -> None:
        if fault.error or fault.delay_ms:
            self.faults[version_id] = fault
        else:
            self.faults.pop(version_id, None)

    async def apply(self, version_id: int | None) -> None:
        """What a request of ``version_id`` meets at the start of its generation."""
        fault = self.faults.get(version_id) if version_id is not None else None
        if fault is None:
            return
        if fault.delay_ms:
            await asyncio.sleep(fault.delay_ms / 1000)
        if fault.error:
            raise oai.ApiError(
                500, "injected fault (test seam)", type_="server_error", code="injected_fault"
            )
