"""What checking a version costs a node, today's way against the OpenSSF bundle's (issue 54:
"nodes keep verifying as today, or verify the bundle — one way, not two, if it does not cost
load time; measure").

On one folder of seed-scale files (a 64 MB weights file by default, like the seed profile's
36-71 MB adapters, and its config), from a warm page cache so that neither pays the disk:

- **node**: what a node does at a fetch (``apps/serving/cache/disk.py``): every file's
  SHA-256 against the manifest, and the Ed25519 signature over the manifest;
- **bundle**: ``model_signing``'s own verification of the version's ``model.sig`` (the
  Python API the ``model_signing verify key`` command calls): the ECDSA P-256 signature over
  the statement, then every file hashed and compared;
- **node (A/A)**: the node's check again, for the spread between two identical runs.

Rotated order, ``--repetitions`` rounds; medians. Neither side counts fetching ``model.sig``
itself, one more object a node would have to GET per load.

Usage: .venv/bin/python bench/bundle_verify.py [--mb 64] [--repetitions 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lorahub.settings")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--repetitions", type=int, default=7)
    args = parser.parse_args()

    import django

    django.setup()
    from django.test import override_settings
    from model_signing import hashing, verifying

    from apps.registry import bundles, signing

    with tempfile.TemporaryDirectory() as work:
        root = Path(work)
        folder = root / "adapter"
        folder.mkdir()
        (folder / "adapter_config.json").write_text('{"r": 16, "lora_alpha": 32}')
        with (folder / "adapter_model.safetensors").open("wb") as out:
            for _ in range(args.mb):
                out.write(os.urandom(1 << 20))
        files = {p.name: signing.sha256_file(p) for p in sorted(folder.iterdir())}
        manifest = {"adapter_id": "bench", "version": "1", "files": files}
        ed_key = signing.load_private_key(signing.generate_private_key_pem())
        public = {"k": signing.public_key_b64(ed_key)}
        signature = signing.sign_manifest(ed_key, manifest)
        key_file = root / "model-signing-key.pem"
        bundles.write_new_key(key_file)
        with override_settings(LORAHUB_BUNDLE_KEY=key_file.read_text()):
            (folder / "model.sig").write_bytes(bundles.bundle_bytes("bench@1", files))
            (root / "lorahub.pub").write_bytes(bundles.public_key_pem())

        def node() -> None:
            assert signing.verify_manifest(public, "k", manifest, signature)
            for name, sha in files.items():
                assert signing.sha256_file(folder / name) == sha

        # as `model_signing verify key` sets it up: the signature file itself left out
        config = (
            verifying.Config()
            .use_elliptic_key_verifier(public_key=root / "lorahub.pub")
            .set_hashing_config(hashing.Config().set_ignored_paths(paths=[folder / "model.sig"]))
        )

        def bundle() -> None:
            config.verify(folder, folder / "model.sig")

        runs = {"node": node, "bundle": bundle, "node (A/A)": node}
        node()  # warm the page cache and both code paths
        bundle()
        times: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        for rep in range(args.repetitions):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for name in order:
                started = time.perf_counter()
                runs[name]()
                times[name].append((time.perf_counter() - started) * 1000)

    base = statistics.median(times["node"])
    print(
        f"checking a version of {args.mb} MB + config, warm page cache, median of "
        f"{args.repetitions} (order rotated)"
    )
    print(f"{'check':<12} {'ms':>8} {'MB/s':>8} {'/ node':>8}")
    for name, values in times.items():
        ms = statistics.median(values)
        print(f"{name:<12} {ms:8.1f} {args.mb / (ms / 1000):8.0f} {ms / base:8.2f}")


if __name__ == "__main__":
    main()
