"""Every reason an upload is refused: the error a person sees, and that nothing is kept.

Cheap checks answer the upload request itself (nothing stored, no version created); the rest
run in the Celery worker and leave the version `rejected` with the reason, nothing in storage
and nothing approvable.
"""

from __future__ import annotations

import io
import json
import tarfile
import zipfile

import numpy as np
import pytest

from apps.registry import services
from apps.registry.errors import Rejected
from apps.registry.models import AdapterVersion
from apps.registry.storage import get_store
from apps.tenants import services as tenant_services
from tests.harness.waiting import wait_until
from tests.helpers import (
    edit_config,
    edit_tensors,
    files_of,
    key_client,
    upload,
    user_client,
    wait_validated,
)


def named(data: bytes, name: str) -> io.BytesIO:
    handle = io.BytesIO(data)
    handle.name = name
    return handle


def assert_nothing_stored(within_s: float = 10) -> None:
    """Nothing in the registry: the worker clears a staged upload right after its verdict
    commits (never before: a verdict that rolls back needs it again), so give it a moment."""
    wait_until(
        lambda: [i.key for i in get_store().list("")],
        "the registry to hold nothing",
        within_s,
        0.05,
        until=lambda keys: not keys,
    )


# --- refused at once -------------------------------------------------------------------------


def _sync_cases(folder):
    config = (folder / "adapter_config.json").read_bytes()
    weights = (folder / "adapter_model.safetensors").read_bytes()
    return {
        "pickle weights": (
            [named(config, "adapter_config.json"), named(b"\x80\x04pickle", "adapter_model.bin")],
            422,
            "'adapter_model.bin' is a pickle-based weights file",
        ),
        "duplicate file": (
            [
                named(config, "adapter_config.json"),
                named(config, "adapter_config.json"),
                named(weights, "adapter_model.safetensors"),
            ],
            422,
            "holds 'adapter_config.json' more than once",
        ),
        "missing weights": (
            [named(config, "adapter_config.json")],
            422,
            "has no adapter_model.safetensors",
        ),
        "missing config": (
            [named(weights, "adapter_model.safetensors")],
            422,
            "has no adapter_config.json",
        ),
        "unexpected file": (
            [
                named(config, "adapter_config.json"),
                named(weights, "adapter_model.safetensors"),
                named(b"print(1)", "train.py"),
            ],
            422,
            "unexpected file(s) train.py",
        ),
        "archive and files together": (
            [named(b"PK", "adapter.zip"), named(config, "adapter_config.json")],
            422,
            "either one archive or the adapter's files",
        ),
    }


SYNC_CASES = [
    "pickle weights",
    "duplicate file",
    "missing weights",
    "missing config",
    "unexpected file",
    "archive and files together",
]


@pytest.mark.parametrize("case", SYNC_CASES)
def test_refused_at_upload_with_nothing_stored(registry, tenant_a, adapter_files, case):
    files, status, message = _sync_cases(adapter_files)[case]
    response = upload(key_client(tenant_a), "support", files)
    assert response.status_code == status, response.content
    assert message in response.json()["detail"]
    assert not AdapterVersion.objects.exists()
    assert_nothing_stored()


def test_an_upload_over_the_tenants_size_limit_is_refused(registry, tenant_a, adapter_files):
    tenant_services.set_quota(tenant=tenant_a, actor=None, max_upload_mb=1)
    big = named(b"\0" * (1024 * 1024 + 1), "adapter_model.safetensors")
    config = named((adapter_files / "adapter_config.json").read_bytes(), "adapter_config.json")
    response = upload(key_client(tenant_a), "support", [config, big])
    assert response.status_code == 413
    assert "may upload at most 1 MB" in response.json()["detail"]
    assert not AdapterVersion.objects.exists()
    assert_nothing_stored()


@pytest.mark.parametrize(
    ("adapter_id", "fields", "message"),
    [
        ("Support_Bot", {}, "adapter id 'Support_Bot' is not valid"),
        ("support", {"version": "../v1"}, "version '../v1' is not valid"),
        ("support", {"version": "v 1"}, "version 'v 1' is not valid"),
    ],
)
def test_bad_identifiers_are_refused(
    registry, tenant_a, adapter_files, adapter_id, fields, message
):
    response = upload(key_client(tenant_a), adapter_id, files_of(adapter_files), **fields)
    assert response.status_code == 422
    assert message in response.json()["detail"]
    assert not AdapterVersion.objects.exists()
    assert_nothing_stored()


def test_the_adapter_count_quota_is_enforced(registry, tenant_a, adapter_files):
    tenant_services.set_quota(tenant=tenant_a, actor=None, max_adapters=1)
    client = key_client(tenant_a)
    assert upload(client, "support", files_of(adapter_files)).status_code == 202
    response = upload(client, "billing", files_of(adapter_files))
    assert response.status_code == 429
    assert "limit of 1 adapters" in response.json()["detail"]


def test_file_names_with_folders_are_refused_by_the_service(registry, tenant_a, adapter_files):
    principal = _principal(tenant_a)
    with pytest.raises(Rejected, match="must be a plain name without folders"):
        services.upload_version(
            principal=principal,
            tenant=tenant_a,
            adapter_id="support",
            files=[services.UploadFile("../adapter_config.json", io.BytesIO(b"{}"), 2)],
        )
    assert not AdapterVersion.objects.exists()


def _principal(tenant):
    from apps.tenants.auth import principal_for_key

    key, _ = tenant_services.issue_api_key(tenant=tenant, name="svc", actor=None)
    return principal_for_key(key)


# --- refused by validation in the worker -----------------------------------------------------


def _tar(entries) -> io.BytesIO:
    """entries: list of (TarInfo-kwargs dict, bytes or None)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for info_kwargs, data in entries:
            info = tarfile.TarInfo(info_kwargs.pop("name"))
            for key, value in info_kwargs.items():
                setattr(info, key, value)
            if data is not None:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    buf.seek(0)
    buf.name = "adapter.tar.gz"
    return buf


def _zip(entries) -> io.BytesIO:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            zf.writestr(name, data)
    buf.seek(0)
    buf.name = "adapter.zip"
    return buf


def _good_entries(folder):
    return [(p.name, p.read_bytes()) for p in sorted(folder.iterdir())]


def _archive_case(folder, case):
    good = _good_entries(folder)
    if case == "absolute path":
        return _tar([({"name": "/etc/adapter_config.json"}, b"{}")]), "absolute path"
    if case == "dot-dot":
        return _zip([("../../adapter_config.json", b"{}")]), "climbs out of the archive"
    if case == "symlink":
        return _tar(
            [
                (
                    {
                        "name": "adapter_config.json",
                        "type": tarfile.SYMTYPE,
                        "linkname": "/etc/passwd",
                    },
                    None,
                )
            ]
        ), "has a link"
    if case == "hard link":
        return _tar(
            [({"name": "adapter_config.json", "type": tarfile.LNKTYPE, "linkname": "x"}, None)]
        ), "has a link"
    if case == "device file":
        return _tar(
            [
                (
                    {
                        "name": "adapter_model.safetensors",
                        "type": tarfile.CHRTYPE,
                        "devmajor": 1,
                        "devminor": 3,
                    },
                    None,
                )
            ]
        ), "device or special file"
    if case == "decompression bomb":
        return _zip([*good, ("README.md", b"\0" * (3 * 1024 * 1024))]), "unpacks to more than 1 MB"
    if case == "duplicate entry":
        return _zip([*good, good[0]]), "holds 'adapter_config.json' twice"
    if case == "pickle inside":
        return _zip([good[0], ("adapter_model.bin", b"\x80\x04")]), "pickle-based weights file"
    if case == "nested folders":
        return _zip([(f"a/b/{n}", d) for n, d in good] + [("a/c.txt", b"")]), "sub-folders"
    if case == "not an archive":
        return named(b"this is not a zip", "adapter.zip"), "is not a readable zip archive"
    raise AssertionError(case)


ARCHIVE_CASES = [
    "absolute path",
    "dot-dot",
    "symlink",
    "hard link",
    "device file",
    "decompression bomb",
    "duplicate entry",
    "pickle inside",
    "nested folders",
    "not an archive",
]


def _assert_rejected(client, response, message):
    assert response.status_code == 202, response.content
    body = wait_validated(client, response.json()["id"])
    assert body["state"] == "rejected"
    assert message in body["rejection_reason"]
    assert body["signed"] is False
    assert_nothing_stored()
    return body


@pytest.mark.parametrize("case", ARCHIVE_CASES)
def test_unsafe_or_broken_archives_are_rejected(registry, tenant_a, adapter_files, case):
    tenant_services.set_quota(tenant=tenant_a, actor=None, max_upload_mb=1)
    archive, message = _archive_case(adapter_files, case)
    client = key_client(tenant_a)
    _assert_rejected(client, upload(client, "support", [archive]), message)


def _nan(tensors):
    name = next(iter(sorted(tensors)))
    tensors[name] = tensors[name].copy()
    tensors[name][0, 0] = np.nan


def _inf(tensors):
    name = next(iter(sorted(tensors)))
    tensors[name] = tensors[name].copy()
    tensors[name][0, 1] = np.inf


def _wrong_shape(tensors):
    name = next(n for n in sorted(tensors) if n.endswith("lora_A.weight"))
    tensors[name] = tensors[name][:4].copy()


def _stray_tensor(tensors):
    tensors["base_model.model.model.embed_tokens.lora_A.weight"] = np.zeros((8, 4), np.float32)


def _missing_b(tensors):
    name = next(n for n in sorted(tensors) if n.endswith("lora_B.weight"))
    del tensors[name]


def _too_deep(tensors):
    tensors["base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight"] = np.zeros(
        (8, 128), np.float32
    )
    tensors["base_model.model.model.layers.7.self_attn.q_proj.lora_B.weight"] = np.zeros(
        (128, 8), np.float32
    )


CONTENT_CASES = {
    "malformed config json": (
        lambda f: (f / "adapter_config.json").write_text("{'r': 8,"),
        "adapter_config.json is not valid JSON",
    ),
    "not a lora": (
        lambda f: edit_config(f, peft_type="PREFIX_TUNING"),
        "has peft_type 'PREFIX_TUNING'; only LORA",
    ),
    "rank not an integer": (
        lambda f: edit_config(f, r="eight"),
        "'r' (the LoRA rank) must be a positive integer",
    ),
    "target modules not a list": (
        lambda f: edit_config(f, target_modules="q_proj|v_proj"),
        "'target_modules' must be a non-empty list",
    ),
    "unknown base model": (
        lambda f: edit_config(f, base_model_name_or_path="llama-3.1-8b"),
        "is 'llama-3.1-8b', which this platform does not serve",
    ),
    "wrong base revision": (
        lambda f: edit_config(f, revision="r0"),
        "trained on lorahub-demo-tiny@r0, but the platform serves lorahub-demo-tiny@r1",
    ),
    "no base revision": (lambda f: edit_config(f, revision=None), "names no base model revision"),
    "rank above the maximum": (
        lambda f: edit_config(f, r=32),
        "rank is 32, above the platform's maximum of 16",
    ),
    "target module the base lacks": (
        lambda f: edit_config(f, target_modules=["q_proj", "c_attn"]),
        "target_modules c_attn do not exist in lorahub-demo-tiny",
    ),
    "tensor shape inconsistent": (
        lambda f: edit_tensors(f, _wrong_shape),
        "has shape [4, 256], expected [8, 256] for rank 8",
    ),
    "tensor name unexpected": (
        lambda f: edit_tensors(f, _stray_tensor),
        "unexpected tensor 'base_model.model.model.embed_tokens",
    ),
    "tensor for an untargeted module": (
        lambda f: edit_config(
            f, target_modules=["k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        ),
        "is for q_proj, which target_modules in adapter_config.json does not list",
    ),
    "tensor for a layer the base lacks": (
        lambda f: edit_tensors(f, _too_deep),
        "is for layer 7, but lorahub-demo-tiny has 2 layers",
    ),
    "lora_B missing": (lambda f: edit_tensors(f, _missing_b), "has no lora_B weight"),
    "NaN weights": (lambda f: edit_tensors(f, _nan), "contains NaN or infinite values"),
    "Inf weights": (lambda f: edit_tensors(f, _inf), "contains NaN or infinite values"),
    "corrupt safetensors": (
        lambda f: (f / "adapter_model.safetensors").write_bytes(b"\xff" * 64),
        "is not a valid safetensors file",
    ),
    "integer tensors": (
        lambda f: edit_tensors(
            f, lambda t: t.update({k: v.astype(np.int32) for k, v in t.items()})
        ),
        "LoRA weights must be F32, F16, BF16 or F64",
    ),
}


@pytest.mark.parametrize("case", sorted(CONTENT_CASES))
def test_adapters_that_do_not_fit_the_platform_are_rejected(
    registry, tenant_a, reviewer, adapter_files, case
):
    make_bad, message = CONTENT_CASES[case]
    make_bad(adapter_files)
    client = key_client(tenant_a)
    body = _assert_rejected(client, upload(client, "support", files_of(adapter_files)), message)
    # a rejected version can never be approved or aliased
    rita = user_client("rita", "rita-pass-123")
    approve = rita.post(f"/api/versions/{body['id']}/approve", {}, content_type="application/json")
    assert approve.status_code == 409
    alias = client.put(
        "/api/aliases/support", {"version_id": body["id"]}, content_type="application/json"
    )
    assert alias.status_code == 409
    assert "only approved, signed versions" in alias.json()["detail"]


def test_the_revision_can_come_with_the_upload_instead_of_the_config(
    registry, tenant_a, adapter_files
):
    edit_config(adapter_files, revision=None)
    client = key_client(tenant_a)
    response = upload(client, "support", files_of(adapter_files), base_model_revision="r1")
    body = wait_validated(client, response.json()["id"])
    assert body["state"] == "pending_review", body["rejection_reason"]
    assert json.loads((adapter_files / "adapter_config.json").read_text()).get("revision") is None
