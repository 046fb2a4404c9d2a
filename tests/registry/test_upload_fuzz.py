"""Generated hostile uploads through the real path: the REST upload (multipart, to the S3
server), then the validation service the Celery worker runs (here in this process, so that
hypothesis sees each verdict). Every example is refused cleanly (a 4xx, or `rejected` with a
reason) or accepted as a valid adapter; never a 500, and nothing of a refused upload stays
in the registry.

The 41 hand-made cases of ``test_rejections.py`` name each known attack; these generate the
ones nobody thought of: random archives (names, kinds of entry, sizes), mutated safetensors
(cut, flipped bytes, random headers and lengths) and random adapter configs.
"""

from __future__ import annotations

import io
import itertools
import json
import struct
import tarfile
import zipfile
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.registry import services
from apps.registry.models import AdapterVersion
from apps.registry.signing import sha256_file
from apps.registry.storage import get_store
from apps.registry.validation import CONFIG_NAME, WEIGHTS_NAME
from apps.tenants.models import Quota
from tests.helpers import key_client

EXAMPLES = 60
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure is reproducible
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
counter = itertools.count()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
entry_names = st.sampled_from(
    [CONFIG_NAME, WEIGHTS_NAME, "README.md", "../" + CONFIG_NAME, "/" + WEIGHTS_NAME,
     "a/" + CONFIG_NAME, "a/b/" + WEIGHTS_NAME, "", ".", "x" * 300, "adapter_model.bin",
     "tokenizer.json", "ädapter_config.json", "dir/"]
)  # fmt: skip


def named(data: bytes, name: str) -> io.BytesIO:
    handle = io.BytesIO(data)
    handle.name = name
    return handle


@pytest.fixture
def world(s3_settings, signing_key, base_model, tenant_a, adapter_files, transactional_db):
    """A tenant with room for every example, and the good adapter's files to start from.
    The validation message is not sent: each example is validated in this process."""
    Quota.objects.update_or_create(
        tenant=tenant_a, defaults={"max_adapters": 10_000, "max_versions_per_adapter": 10_000}
    )
    good = {p.name: p.read_bytes() for p in adapter_files.iterdir()}
    with mock.patch.object(services, "send_validation"):
        yield key_client(tenant_a), good


def judge(client, files: list[io.BytesIO]) -> str:
    """Upload, validate, and check the outcome is clean; returns the outcome's name."""
    response = client.post(
        "/api/adapters/fuzz/versions", {"files": files, "version": f"f.{next(counter)}"}
    )
    assert response.status_code < 500, response.content[:500]
    store = get_store()
    if response.status_code != 202:
        assert response.json()["detail"], response.content  # says what was wrong
        assert_only_accepted_objects(store)
        return f"refused {response.status_code}"
    version = services.validate_version(version_id=response.json()["id"])
    assert version.state in ("pending_review", "rejected"), version.state
    if version.state == "rejected":
        assert version.rejection_reason.strip()
        assert not version.storage_prefix
    else:  # accepted: exactly the files it names, each as validated
        stored = {i.key.rsplit("/", 1)[1]: i.key for i in store.list(version.storage_prefix)}
        assert sorted(stored) == sorted(version.files)
        for name, key in stored.items():
            assert sha256_of(store, key) == version.files[name]["sha256"]
    assert_only_accepted_objects(store)
    return version.state


def sha256_of(store, key: str) -> str:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "object"
        store.download(key, path)
        return sha256_file(path)


def assert_only_accepted_objects(store) -> None:
    """No staged upload and no half-published version anywhere in the registry."""
    accepted = set(
        AdapterVersion.objects.exclude(storage_prefix="").values_list("storage_prefix", flat=True)
    )
    stray = [i.key for i in store.list("") if i.key.rsplit("/", 1)[0] not in accepted]
    assert stray == [], stray[:5]


# --- archives ----------------------------------------------------------------------------------

tar_entry = st.tuples(
    entry_names,
    st.sampled_from(["file", "file", "file", "dir", "symlink", "hardlink", "fifo", "chrdev"]),
    st.one_of(st.binary(max_size=64), st.sampled_from(["good-config", "good-weights"])),
)


def _content(kind, good: dict[str, bytes]) -> bytes:
    if kind == "good-config":
        return good[CONFIG_NAME]
    if kind == "good-weights":
        return good[WEIGHTS_NAME]
    return kind


def _tar(entries, good, mode: str) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, kind, content in entries:
            info = tarfile.TarInfo(name)
            info.type = {
                "file": tarfile.REGTYPE,
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "fifo": tarfile.FIFOTYPE,
                "chrdev": tarfile.CHRTYPE,
            }[kind]
            if kind in ("symlink", "hardlink"):
                info.linkname = "/etc/passwd" if len(name) % 2 else CONFIG_NAME
            data = _content(content, good) if kind == "file" else b""
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data else None)
    buffer.seek(0)
    return buffer


@FUZZ
@given(
    entries=st.lists(tar_entry, max_size=6),
    form=st.sampled_from(["tar.gz", "tar", "zip", "zip-as-tar", "garbage"]),
)
def test_random_archives_are_refused_cleanly_or_accepted_valid(world, entries, form):
    client, good = world
    if form == "zip" or form == "zip-as-tar":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for name, kind, content in entries:
                if kind == "file" and name:
                    archive.writestr(name, _content(content, good))
        data, suffix = buffer.getvalue(), ("adapter.zip" if form == "zip" else "adapter.tar.gz")
    elif form == "garbage":
        data, suffix = b"".join(_content(c, good) for _, _, c in entries)[:4096], "adapter.tgz"
    else:
        mode = "w:gz" if form == "tar.gz" else "w"
        data = _tar(entries, good, mode).getvalue()
        suffix = "adapter.tar.gz" if form == "tar.gz" else "adapter.tar"
    judge(client, [named(data, suffix)])


# --- safetensors -------------------------------------------------------------------------------


@st.composite
def broken_weights(draw, weights: bytes) -> bytes:
    (length,) = struct.unpack("<Q", weights[:8])
    header = json.loads(weights[8 : 8 + length])
    how = draw(st.sampled_from(["cut", "flip", "header", "length", "dtype", "offsets"]))
    if how == "cut":
        return weights[: draw(st.integers(0, len(weights) - 1))]
    if how == "flip":
        data = bytearray(weights)
        for at in draw(st.lists(st.integers(0, len(weights) - 1), min_size=1, max_size=8)):
            data[at] ^= draw(st.integers(1, 255))
        return bytes(data)
    if how == "length":
        return struct.pack("<Q", draw(st.integers(0, 2**64 - 1))) + weights[8:]
    body = weights[8 + length :]
    name = draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")))
    if how == "header":
        header = draw(st.dictionaries(st.text(max_size=10), json_values, max_size=4))
    elif how == "dtype":
        header[name]["dtype"] = draw(st.sampled_from(["F64", "I8", "BOOL", "U8", "F8_E4M3", "X"]))
    else:
        header[name]["data_offsets"] = draw(st.lists(st.integers(-10, 2**40), max_size=3))
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


@FUZZ
@given(data=st.data())
def test_malformed_safetensors_are_refused_cleanly(world, data):
    client, good = world
    weights = data.draw(broken_weights(good[WEIGHTS_NAME]))
    judge(client, [named(good[CONFIG_NAME], CONFIG_NAME), named(weights, WEIGHTS_NAME)])


# --- configs -----------------------------------------------------------------------------------


@FUZZ
@given(
    field=st.sampled_from(
        ["r", "lora_alpha", "target_modules", "base_model_name_or_path", "revision",
         "peft_type", "task_type", "bias", "fan_in_fan_out", "modules_to_save", "whole"]
    ),
    value=json_values,
    raw=st.one_of(st.none(), st.binary(max_size=40)),
)  # fmt: skip
def test_random_adapter_configs_are_refused_cleanly_or_accepted_valid(world, field, value, raw):
    client, good = world
    if raw is not None:
        config = raw
    else:
        parsed = json.loads(good[CONFIG_NAME])
        parsed = value if field == "whole" else {**parsed, field: value}
        config = json.dumps(parsed, allow_nan=True).encode()
    judge(client, [named(config, CONFIG_NAME), named(good[WEIGHTS_NAME], WEIGHTS_NAME)])
