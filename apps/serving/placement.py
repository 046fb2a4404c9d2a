"""Placing an adapter version where the engine can use it (the request path's step 4).

This is the simple path: fetch from the registry (L4) into a node-local folder per immutable
version (L3), verify, and hand the engine an ``AdapterHandle``; the engine's own slots are
tracked to tell L1 from L2. The four-tier cache manager replaces it behind the same
``Placement.place`` call.

Integrity: a version is used only if its manifest's signature verifies under a published key,
the manifest names exactly the files the registry lists, and every downloaded file's sha256
matches the manifest. A folder becomes visible (renamed into place) only after all of that.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from apps.registry import signing
from apps.registry.aliases import ResolvedVersion
from apps.registry.storage import ObjectStore
from apps.registry.validation import sha256_file
from apps.serving.engine import AdapterHandle, Engine

logger = logging.getLogger(__name__)
VERIFIED_MARK = ".verified"


class AdapterIntegrityError(Exception):
    """A fetched adapter does not match its signed manifest."""


@dataclass(frozen=True)
class Placed:
    handle: AdapterHandle
    tier: str  # where it was found: L1, L2, L3 or L4
    load_ms: float


def lora_id_for(resolved: ResolvedVersion) -> int:
    """Stable per immutable version: the registry's version id (positive, never reused)."""
    return resolved.version_id


def verify_signature(resolved: ResolvedVersion, public_keys: dict[str, str]) -> bool:
    names = {name: sha for name, sha, _ in resolved.files}
    return resolved.manifest.get("files") == names and signing.verify_manifest(
        public_keys, resolved.signing_key_id, resolved.manifest, resolved.signature
    )


class Placement:
    def __init__(self, *, engine: Engine, store: ObjectStore, root: Path, public_keys) -> None:
        self.engine = engine
        self.store = store
        self.root = root
        self.public_keys = public_keys  # callable -> {key_id: public_key}
        self._in_engine: OrderedDict[int, int] = OrderedDict()  # lora_id -> bytes, LRU order
        self._inflight: dict[int, asyncio.Future] = {}

    def folder(self, resolved: ResolvedVersion) -> Path:
        tenant, adapter, version, revision = resolved.cache_key
        return self.root / f"t{tenant}" / adapter / f"{version}@{revision}"

    def _fetch_verified(self, resolved: ResolvedVersion) -> Path:
        """Download into a temp folder, check every hash, then rename into place (blocking)."""
        final = self.folder(resolved)
        if (final / VERIFIED_MARK).exists():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=final.parent))
        try:
            for name, sha, _ in resolved.files:
                dest = tmp / name
                self.store.download(f"{resolved.storage_prefix}/{name}", dest)
                if sha256_file(dest) != sha:
                    raise AdapterIntegrityError(
                        f"{resolved.label}: {name} does not match its signed sha256"
                    )
            (tmp / VERIFIED_MARK).write_text(resolved.manifest.get("version", ""))
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final

    async def place(self, resolved: ResolvedVersion) -> Placed:
        """Make the version usable by the engine; concurrent calls share one fetch and load."""
        lora_id = lora_id_for(resolved)
        handle = AdapterHandle(
            lora_id=lora_id,
            name=f"{resolved.tenant_slug}/{resolved.label}",
            path=self.folder(resolved),
        )
        if lora_id in self._in_engine:
            recent = list(self._in_engine)[-self.engine.settings.max_loras :]
            tier = "L1" if lora_id in recent else "L2"
            self._in_engine.move_to_end(lora_id)
            return Placed(handle, tier, 0.0)
        pending = self._inflight.get(lora_id)
        if pending is not None:
            placed = await asyncio.shield(pending)
            return Placed(handle, placed.tier, placed.load_ms)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._inflight[lora_id] = future
        try:
            started = time.perf_counter()
            on_disk = (handle.path / VERIFIED_MARK).exists()
            if not verify_signature(resolved, await asyncio.to_thread(self.public_keys)):
                raise AdapterIntegrityError(
                    f"{resolved.label}: the manifest signature does not verify"
                )
            await asyncio.to_thread(self._fetch_verified, resolved)
            await self.engine.add_adapter(handle)
            self._in_engine[lora_id] = sum(size for _, _, size in resolved.files)
            while len(self._in_engine) > self.engine.settings.max_cpu_loras:
                # vLLM's host cache drops its least recently used adapter here; mirror it.
                self._in_engine.popitem(last=False)
            placed = Placed(
                handle, "L3" if on_disk else "L4", (time.perf_counter() - started) * 1000
            )
            future.set_result(placed)
            return placed
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: waiters get it, nobody logs it twice
            raise
        finally:
            self._inflight.pop(lora_id, None)

    def forget_engine(self) -> None:
        """After an engine restart: nothing is in its slots any more (disk copies remain)."""
        self._in_engine.clear()

    def hot_bytes(self) -> int:
        return sum(list(self._in_engine.values())[-self.engine.settings.max_loras :])
