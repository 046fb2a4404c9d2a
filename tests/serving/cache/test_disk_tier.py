"""L3, the node's disk tier: land once with the full check, then a sealed check on each load."""

from __future__ import annotations

import json
import os

import pytest

from apps.registry import signing
from apps.registry.storage import LocalStore
from apps.serving.cache.disk import DiskTier, IntegrityFailure
from tests.helpers import signed_version


@pytest.fixture
def key():
    return signing.load_private_key(signing.generate_private_key_pem())


@pytest.fixture
def setup(tmp_path, demo_dir, key):
    """A registry (local store) holding support-v1, and its signed ResolvedVersion."""
    store = LocalStore(tmp_path / "registry")
    resolved, keys = signed_version(
        store, demo_dir / "adapters" / "support-v1", "tenants/t/adapters/support/v1", key
    )
    return store, resolved, keys, DiskTier(tmp_path / "disk")


def test_a_landed_version_passes_its_sealed_check(setup):
    store, resolved, keys, disk = setup
    assert not disk.has(resolved)
    landed = disk.land(resolved, store, keys)
    assert disk.has(resolved)
    assert disk.check(resolved) == landed.path
    assert landed.size_bytes == resolved.size_bytes


def test_one_flipped_byte_on_disk_fails_the_check(setup):
    store, resolved, keys, disk = setup
    path = disk.land(resolved, store, keys).path / "adapter_model.safetensors"
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with mtime restored
    with pytest.raises(IntegrityFailure, match="changed on disk"):  # ctime cannot be restored
        disk.check(resolved, hash_bytes=False)
    # a seal file rewritten to match is not believed: loads are held to the seal as it was read
    # when the folder landed
    seal_path = path.parent / ".seal.json"
    seal = json.loads(seal_path.read_text())
    now = path.stat()
    seal[path.name].update(mtime_ns=now.st_mtime_ns, ctime_ns=now.st_ctime_ns)
    seal_path.write_text(json.dumps(seal))
    with pytest.raises(IntegrityFailure, match="changed on disk"):
        disk.check(resolved, hash_bytes=False)
    # the idle scrub re-hashes: it finds the byte whatever the stat fields say
    assert "does not match its seal" in disk.scrub(path.parent)
    # bytes that rot with every stat field intact (a process that read the seal after): BLAKE3
    fresh = DiskTier(disk.root)
    fresh.check(resolved, hash_bytes=False)  # the stat-only check cannot see this
    assert "does not match its seal" in fresh.scrub(path.parent)
    with pytest.raises(IntegrityFailure, match="does not match its seal"):
        fresh.check(resolved)  # nor can a load without verify_checksum; with it, it does


def test_a_replaced_file_fails_the_stat_check(setup):
    store, resolved, keys, disk = setup
    folder = disk.land(resolved, store, keys).path
    config = folder / "adapter_config.json"
    content = config.read_bytes()
    config.unlink()
    config.write_bytes(content)  # same bytes, new inode
    with pytest.raises(IntegrityFailure, match="changed on disk"):
        disk.check(resolved)


def test_registry_bytes_that_do_not_match_the_signed_manifest_never_land(setup, tmp_path):
    store, resolved, keys, disk = setup
    target = store.root / resolved.storage_prefix / "adapter_model.safetensors"
    data = bytearray(target.read_bytes())
    data[100] ^= 0xFF
    target.write_bytes(bytes(data))  # tampered at rest, behind the store's back
    with pytest.raises(IntegrityFailure, match="does not match its signed sha256"):
        disk.land(resolved, store, keys)
    assert not disk.has(resolved)
    assert not disk.folder(resolved).exists()
    assert list(disk.folder(resolved).parent.glob(".landing-*")) == []


def test_a_forged_manifest_is_refused_before_any_download(setup):
    store, resolved, keys, disk = setup
    from dataclasses import replace

    class Recording:  # the registry, recording what is fetched from it
        def __init__(self) -> None:
            self.fetched: list[str] = []

        def download(self, key, dest):
            self.fetched.append(key)
            return store.download(key, dest)

    registry = Recording()
    forged = replace(resolved, manifest={**resolved.manifest, "rank": 16})
    with pytest.raises(IntegrityFailure, match="signature does not verify"):
        disk.land(forged, registry, keys)
    assert registry.fetched == []  # not one byte fetched for a manifest that does not verify
    assert not disk.folder(forged).exists()
    assert [p for p in disk.root.rglob("*") if p.is_file()] == []
    disk.land(resolved, registry, keys)  # the same store, with the true manifest: fetched
    assert registry.fetched


def test_rebuild_keeps_verified_folders_and_drops_corrupt_or_half_landed_ones(setup):
    store, resolved, keys, disk = setup
    from dataclasses import replace

    good = disk.land(resolved, store, keys).path
    other = replace(resolved, tenant_id=2)  # another cache key, same signed bytes
    bad = disk.land(other, store, keys).path
    (bad / "adapter_config.json").write_text("{}")
    half = good.parent / ".landing-abc"
    half.mkdir()
    kept = disk.rebuild(keys)
    assert [entry.path for entry in kept] == [good]
    assert (kept[0].version_id, kept[0].tenant_id) == (7, 1)
    assert kept[0].size_bytes == resolved.size_bytes
    assert not bad.exists() and not half.exists()
    assert disk.check(resolved) == good
