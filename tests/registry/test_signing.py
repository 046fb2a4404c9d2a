"""Ed25519 manifest signatures: valid as made, invalid after any one-byte change."""

from __future__ import annotations

import base64

import pytest

from apps.registry import signing


@pytest.fixture
def key():
    return signing.load_private_key(signing.generate_private_key_pem())


MANIFEST = {
    "tenant": "tenant-a",
    "adapter_id": "support",
    "version": "2026-07-04.3",
    "base_model": "lorahub-demo-tiny",
    "base_model_revision": "r1",
    "rank": 8,
    "files": {"adapter_config.json": "a" * 64, "adapter_model.safetensors": "b" * 64},
}


def test_a_signature_verifies_under_its_public_key(key):
    public = signing.public_key_b64(key)
    kid = signing.key_id(public)
    signature = signing.sign_manifest(key, MANIFEST)
    assert signing.verify_manifest({kid: public}, kid, MANIFEST, signature)


def test_key_order_does_not_change_the_signed_bytes(key):
    reordered = dict(reversed(list(MANIFEST.items())))
    assert signing.canonical_json(reordered) == signing.canonical_json(MANIFEST)


@pytest.mark.parametrize("field", ["version", "base_model_revision", "tenant"])
def test_changing_one_character_of_the_manifest_breaks_the_signature(key, field):
    public = signing.public_key_b64(key)
    kid = signing.key_id(public)
    signature = signing.sign_manifest(key, MANIFEST)
    value = MANIFEST[field]
    tampered = {**MANIFEST, field: value[:-1] + chr(ord(value[-1]) ^ 1)}
    assert not signing.verify_manifest({kid: public}, kid, tampered, signature)


def test_changing_one_byte_of_a_file_hash_breaks_the_signature(key):
    public = signing.public_key_b64(key)
    kid = signing.key_id(public)
    signature = signing.sign_manifest(key, MANIFEST)
    files = dict(MANIFEST["files"])
    files["adapter_model.safetensors"] = "c" + files["adapter_model.safetensors"][1:]
    assert not signing.verify_manifest({kid: public}, kid, {**MANIFEST, "files": files}, signature)


def test_a_flipped_bit_in_the_signature_or_an_unknown_key_fails(key):
    public = signing.public_key_b64(key)
    kid = signing.key_id(public)
    raw = bytearray(base64.b64decode(signing.sign_manifest(key, MANIFEST)))
    raw[0] ^= 1
    assert not signing.verify_manifest({kid: public}, kid, MANIFEST, base64.b64encode(raw).decode())
    other = signing.load_private_key(signing.generate_private_key_pem())
    forged = signing.sign_manifest(other, MANIFEST)
    assert not signing.verify_manifest({kid: public}, kid, MANIFEST, forged)
    assert not signing.verify_manifest({}, kid, MANIFEST, signing.sign_manifest(key, MANIFEST))
    assert not signing.verify_manifest({kid: public}, kid, MANIFEST, "not base64!")


def test_a_non_ed25519_or_garbage_key_is_refused_clearly():
    with pytest.raises(signing.SigningError, match="not a PEM private key"):
        signing.load_private_key(b"-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----")
