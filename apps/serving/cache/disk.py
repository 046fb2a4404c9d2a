"""L3, the node-local disk tier: one folder per immutable adapter version.

Integrity, in two steps, so that the check on every load stays cheap:

1. **Landing** (once per version per node): download into a temporary folder, check every
   file's sha256 against the manifest, check the manifest's Ed25519 signature, fsync, write a
   *seal* (per file: size, mtime, inode and a BLAKE3 digest), and rename the folder into place.
   Only a complete, verified folder is ever visible under its final name.
2. **Loading** (every L3→L2 load): the file's size, mtime, ctime and inode must match the
   seal *as this process read it when the folder landed or was re-verified* (kept in memory:
   a seal file rewritten later is not believed), a few stat calls, well under a millisecond.
   ``disk_cache.verify_checksum: true`` adds the BLAKE3 digest on every load (tens of ms of
   the cores the engine computes on for a seed-scale adapter), for those who want it.
3. **Scrubbing** (``scrub``, when the node is idle): the BLAKE3 digest of one folder at a
   time, oldest check first, against the seal.

Why this is still safe: the sha256 + signature check binds the bytes to what a reviewer
approved; the seal binds the bytes on this disk to the ones that passed that check. Any write,
truncation, replacement or ``utime`` through the filesystem changes the inode change time,
which no process can set back, so tampering fails the load's check; what only the digest
sees (silent media corruption, a write beneath the filesystem) fails the scrub, or, with
``verify_checksum``, the load. Either way the folder is deleted and fetched again from the
registry. At start-up the tier rebuilds its index from disk by re-running the full sha256 +
signature check on every folder (the seal alone is not trusted across restarts).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3

from apps.registry import signing
from apps.registry.contracts import ResolvedVersion
from apps.registry.storage import ObjectStore
from apps.serving.cache.policies import Policy, Resident, rank
from apps.serving.cache.versions import CachedVersion

logger = logging.getLogger(__name__)
SEAL = ".seal.json"
MANIFEST = ".manifest.json"
CHUNK = 1024 * 1024


class IntegrityFailure(Exception):
    """Bytes do not match their signed manifest (at landing) or their seal (at loading)."""


def _blake3(path: Path) -> str:
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    hasher.update_mmap(path)
    return hasher.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def verify_manifest(resolved: ResolvedVersion, public_keys: dict[str, str]) -> None:
    names = {name: sha for name, sha, _ in resolved.files}
    if resolved.manifest.get("files") != names:
        raise IntegrityFailure(f"{resolved.label}: the file list does not match the manifest")
    if not signing.verify_manifest(
        public_keys, resolved.signing_key_id, resolved.manifest, resolved.signature
    ):
        raise IntegrityFailure(f"{resolved.label}: the manifest signature does not verify")


@dataclass(frozen=True)
class Landed:
    path: Path
    size_bytes: int
    fetch_ms: float = 0.0  # downloading from the registry, fsync included
    verify_ms: float = 0.0  # sha256 of every file, the signature, the BLAKE3 seal


@dataclass(frozen=True)
class OnDisk:
    """A verified version folder found at start-up."""

    path: Path
    version_id: int
    tenant_id: int
    size_bytes: int
    landed_at: float  # wall-clock seconds


class DiskTier:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        # folder -> its seal as read when it landed or was re-verified (see the docstring)
        self._seals: dict[Path, dict[str, dict[str, Any]]] = {}
        self._condemned: dict[Path, str] = {}  # folders a scrub failed, still in use then

    def remember(self, resolved: ResolvedVersion) -> None:
        """Keep the seal of a folder that has just landed (written by the landing, in this or
        the download process) or passed the full check: the seal later loads are held to."""
        folder = self.folder(resolved)
        self._condemned.pop(folder, None)
        try:
            self._seals[folder] = json.loads((folder / SEAL).read_text())
        except (OSError, ValueError):
            self._seals.pop(folder, None)

    def folder(self, resolved: ResolvedVersion) -> Path:
        tenant, adapter, version, revision = resolved.cache_key
        return self.root / f"t{tenant}" / adapter / f"{version}@{revision}"

    def has(self, resolved: ResolvedVersion) -> bool:
        return (self.folder(resolved) / SEAL).exists()

    def land(
        self, resolved: ResolvedVersion, store: ObjectStore, public_keys: dict[str, str]
    ) -> Landed:
        """Fetch from the registry, verify fully, seal, and rename into place (blocking).

        Raises IntegrityFailure if the registry's bytes do not match the signed manifest.
        """
        started = time.perf_counter()
        fetch_s = 0.0
        verify_manifest(resolved, public_keys)
        final = self.folder(resolved)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".landing-", dir=final.parent))
        renamed = False
        try:
            seal: dict[str, dict[str, Any]] = {}
            for name, sha, _ in resolved.files:
                dest = tmp / name
                fetch_started = time.perf_counter()
                store.download(f"{resolved.storage_prefix}/{name}", dest)
                with dest.open("rb") as fh:
                    os.fsync(fh.fileno())
                fetch_s += time.perf_counter() - fetch_started
                if signing.sha256_file(dest) != sha:
                    raise IntegrityFailure(
                        f"{resolved.label}: {name} from the registry does not match its signed "
                        "sha256"
                    )
                seal[name] = {"blake3": _blake3(dest)}
            (tmp / MANIFEST).write_text(
                json.dumps(
                    {
                        "manifest": resolved.manifest,
                        "signature": resolved.signature,
                        "signing_key_id": resolved.signing_key_id,
                        "version_id": resolved.version_id,
                        "tenant_id": resolved.tenant_id,
                    }
                )
            )
            _fsync_dir(tmp)
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
            renamed = True
            for name in seal:  # stat after the rename: the inode and mtime are final now
                st = (final / name).stat()
                seal[name].update(
                    size=st.st_size, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns, ino=st.st_ino
                )
            (final / SEAL).write_text(json.dumps(seal))
            _fsync_dir(final)
            self._seals[final] = seal
            self._condemned.pop(final, None)
        except BaseException:
            if renamed:  # unsealed, so never used; but it takes room (a full disk fails here)
                shutil.rmtree(final, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        total_ms = (time.perf_counter() - started) * 1000
        return Landed(
            final,
            resolved.size_bytes,
            fetch_ms=fetch_s * 1000,
            verify_ms=total_ms - fetch_s * 1000,
        )

    def check(self, resolved: ResolvedVersion, *, hash_bytes: bool = True) -> Path:
        """The sealed-file check done on every load. Raises IntegrityFailure on any mismatch.

        ``hash_bytes=False`` (the default, ``disk_cache.verify_checksum: false``) checks the
        stat fields only: any write, truncation, replacement or ``utime`` through the
        filesystem changes the inode change time (which no process can set back), so
        tampering is still seen; silent media corruption is left to ``scrub``. It saves the
        BLAKE3 pass, about 5 ms per 27 MB and 20-40 ms per seed-scale adapter here.
        """
        folder = self.folder(resolved)
        if folder in self._condemned:
            raise IntegrityFailure(self._condemned[folder])
        seal = self._seals.get(folder)
        if seal is None:  # landed before this process knew it: read once, then held to it
            try:
                seal = json.loads((folder / SEAL).read_text())
            except (OSError, ValueError):
                raise IntegrityFailure(f"{resolved.label}: no valid seal on disk") from None
            self._seals[folder] = seal
        if set(seal) != {name for name, _, _ in resolved.files}:
            raise IntegrityFailure(f"{resolved.label}: sealed files differ from the manifest")
        for name, meta in seal.items():
            path = folder / name
            try:
                st = path.stat()
            except OSError:
                raise IntegrityFailure(f"{resolved.label}: {name} is missing") from None
            if (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) != (
                meta["size"],
                meta["mtime_ns"],
                meta.get("ctime_ns"),
                meta["ino"],
            ):
                raise IntegrityFailure(f"{resolved.label}: {name} changed on disk")
            if hash_bytes and _blake3(path) != meta["blake3"]:
                raise IntegrityFailure(f"{resolved.label}: {name} does not match its seal")
        return folder

    def read_ahead(self, resolved: ResolvedVersion) -> None:
        """Ask the kernel to bring the folder's files into the page cache now, off the engine's
        path (``POSIX_FADV_WILLNEED`` starts the reads and returns): the engine step that loads
        the adapter then reads memory (``bench/seed_floors.py``: 7 ms warm against 20-27 ms
        cold for a 44 MB adapter)."""
        for name, _, _ in resolved.files:
            try:
                fd = os.open(self.folder(resolved) / name, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)

    def condemn(self, folder: Path, problem: str) -> None:
        """The folder failed its scrub while in use: its next check fails with ``problem``."""
        self._condemned[folder] = problem

    def scrub(self, folder: Path) -> str | None:
        """Re-hash one landed folder against its seal (blocking): None if every file matches,
        else what does not."""
        seal = self._seals.get(folder)
        if seal is None:
            try:
                seal = json.loads((folder / SEAL).read_text())
            except (OSError, ValueError):
                return f"{folder.name}: no valid seal on disk"
        for name, meta in seal.items():
            try:
                if _blake3(folder / name) != meta["blake3"]:
                    return f"{folder.relative_to(self.root)}/{name} does not match its seal"
            except OSError:
                return f"{folder.relative_to(self.root)}/{name} is missing"
        return None

    def clear(self) -> None:
        self._seals.clear()
        self._condemned.clear()
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)

    def evict(self, resolved: ResolvedVersion) -> None:
        self._seals.pop(self.folder(resolved), None)
        self._condemned.pop(self.folder(resolved), None)
        shutil.rmtree(self.folder(resolved), ignore_errors=True)

    def remove(self, folder: Path) -> None:
        """Delete one version folder under this tier's root (never anything else)."""
        if folder.resolve().is_relative_to(self.root.resolve()) and folder != self.root:
            self._seals.pop(folder, None)
            self._condemned.pop(folder, None)
            shutil.rmtree(folder, ignore_errors=True)

    def listing(self) -> list[dict]:
        """Every landed version folder with its size and last modification."""
        rows = []
        for seal in sorted(self.root.glob("t*/*/*/" + SEAL)):
            folder = seal.parent
            files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
            rows.append(
                {
                    "folder": folder.relative_to(self.root).as_posix(),
                    "size_bytes": sum(p.stat().st_size for p in files),
                    "landed_at": seal.stat().st_mtime,
                }
            )
        return rows

    def usage_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())

    def rebuild(self, public_keys: dict[str, str]) -> list[OnDisk]:
        """At start: keep only folders whose files pass the full sha256 + signature check.

        Half-landed temporary folders and anything that fails are deleted. Returns the
        folders kept.
        """
        kept = []
        for folder in sorted(self.root.glob("t*/*/*")):
            if folder.name.startswith(".landing-"):
                shutil.rmtree(folder, ignore_errors=True)
                continue
            try:
                record = json.loads((folder / MANIFEST).read_text())
                manifest = record["manifest"]
                if not signing.verify_manifest(
                    public_keys, record["signing_key_id"], manifest, record["signature"]
                ):
                    raise IntegrityFailure("signature")
                for name, sha in manifest["files"].items():
                    if signing.sha256_file(folder / name) != sha:
                        raise IntegrityFailure(name)
                seal = folder / SEAL
                if not seal.exists():
                    raise IntegrityFailure("unsealed")
                sealed = json.loads(seal.read_text())
                for name, meta in sealed.items():  # the bytes passed: their stat is the seal
                    st = (folder / name).stat()
                    meta.update(
                        size=st.st_size,
                        mtime_ns=st.st_mtime_ns,
                        ctime_ns=st.st_ctime_ns,
                        ino=st.st_ino,
                    )
                self._seals[folder] = sealed
                entry = OnDisk(
                    path=folder,
                    version_id=int(record["version_id"]),
                    tenant_id=int(record["tenant_id"]),
                    size_bytes=sum((folder / name).stat().st_size for name in manifest["files"]),
                    landed_at=seal.stat().st_mtime,
                )
            except (OSError, ValueError, KeyError, TypeError, IntegrityFailure) as exc:
                logger.warning("dropping %s from the disk cache: %s", folder, exc)
                shutil.rmtree(folder, ignore_errors=True)
                continue
            kept.append(entry)
        return kept


class DiskIndex:
    """L3's bookkeeping: which versions are on this disk, their use, and which go first.

    The index holds records (``versions.py``) and is the only writer of their ``disk`` and
    ``folder``; ``DiskTier`` does the file work. The tiers are inclusive: what is in the
    engine, loading or being landed keeps its folder (L2 can always be reloaded from L3).
    """

    def __init__(self) -> None:
        self.members: dict[int, CachedVersion] = {}

    def add(self, record: CachedVersion, resident: Resident, folder: Path | None) -> None:
        record.disk = resident
        record.folder = folder
        self.members[record.version_id] = record

    def drop(self, record: CachedVersion) -> Path | None:
        """Out of the index (the caller removes the folder); returns the folder it had."""
        folder, record.folder, record.disk = record.folder, None, None
        self.members.pop(record.version_id, None)
        return folder

    def bytes(self) -> int:
        return sum(r.disk.size_bytes for r in list(self.members.values()) if r.disk is not None)

    def victims(
        self, need_bytes: int, *, keep: Collection[int], policy: Policy, now: float
    ) -> list[Resident]:
        """The lowest-value folders that free ``need_bytes``, or as many as may go: not what
        is in the engine, loading, landing or answering requests, and not ``keep``."""
        if need_bytes <= 0:
            return []
        candidates = [  # as the policy must see them: the record's flag
            r.disk._replace(deprecated=r.deprecated)
            for r in list(self.members.values())
            if r.disk is not None and r.engine is None and not r.busy and r.version_id not in keep
        ]
        chosen: list[Resident] = []
        for victim in rank(candidates, policy=policy, now=now):
            if need_bytes <= 0:
                break
            chosen.append(victim)
            need_bytes -= victim.size_bytes
        return chosen
