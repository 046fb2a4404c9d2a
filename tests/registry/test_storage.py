"""The object store, over both backends: keys are written once and never escape the store."""

from __future__ import annotations

import io

import pytest

from apps.registry.storage import (
    LocalStore,
    ObjectExists,
    ObjectMissing,
    StorageError,
    get_store,
)


@pytest.fixture(params=["s3", "local"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    request.getfixturevalue("s3_settings")
    return get_store()


def test_put_then_get_returns_the_same_bytes(store):
    store.put("t/a/v1/adapter_model.safetensors", b"weights")
    store.put("t/a/v1/adapter_config.json", io.BytesIO(b"{}"))
    assert store.get("t/a/v1/adapter_model.safetensors") == b"weights"
    assert sorted(i.key for i in store.list("t/a/v1/")) == [
        "t/a/v1/adapter_config.json",
        "t/a/v1/adapter_model.safetensors",
    ]


def test_a_key_is_never_overwritten(store):
    store.put("t/a/v1/file", b"first")
    with pytest.raises(ObjectExists, match="never overwritten"):
        store.put("t/a/v1/file", b"second")
    assert store.get("t/a/v1/file") == b"first"


def test_download_streams_to_a_file(store, tmp_path):
    store.put("t/a/v1/big", b"x" * (3 * 1024 * 1024 + 5))
    dest = tmp_path / "big"
    assert store.download("t/a/v1/big", dest) == 3 * 1024 * 1024 + 5
    assert dest.read_bytes() == b"x" * (3 * 1024 * 1024 + 5)


def test_missing_objects_raise_a_clear_error(store):
    with pytest.raises(ObjectMissing, match="no object 't/none'"):
        store.get("t/none")
    assert not store.exists("t/none")


@pytest.mark.parametrize("key", ["../etc/passwd", "/abs", "a/../../b", "a//b", "", "a/"])
def test_keys_that_could_escape_the_namespace_are_refused(store, key):
    with pytest.raises(StorageError, match="invalid object key"):
        store.put(key, b"x")


def test_delete_prefix_removes_only_that_version(store):
    store.put("t/a/v1/f", b"1")
    store.put("t/a/v2/f", b"2")
    assert store.delete_prefix("t/a/v1") == 1
    assert not store.exists("t/a/v1/f")
    assert store.get("t/a/v2/f") == b"2"


def test_a_cleared_staging_area_leaves_no_empty_folder_behind(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.put("staging/abc/0", b"raw")
    store.put("staging/abc/sub/1", b"raw")
    store.put("staging/def/0", b"another upload, still staged")
    assert store.delete_prefix("staging/abc") == 2
    assert sorted(p.name for p in (tmp_path / "store" / "staging").iterdir()) == ["def"]
    assert store.get("staging/def/0") == b"another upload, still staged"
