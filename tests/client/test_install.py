"""The client is its own small distribution: it installs alone, in a bare virtualenv, with
none of the platform's packages, and its console script behaves as documented there — a bad
key or a server that is down is an exit code and a sentence, never a traceback."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.processes import ROOT

PLATFORM_MODULES = ("django", "celery", "torch", "vllm", "ninja", "apps", "lorahub")


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory) -> Path:
    """A bare virtualenv (uv's: no pip, no setuptools) with only ./client installed, from a
    copy of it, so that the build leaves nothing in the source tree."""
    where = tmp_path_factory.mktemp("client-venv")
    source = shutil.copytree(ROOT / "client", where / "client")
    venv = where / "venv"
    subprocess.run(
        [sys.executable, "-m", "uv", "venv", "-q", "-p", sys.executable, str(venv)], check=True
    )
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "uv_install.py"),
            str(venv / "bin" / "python"),
            str(source),
        ],
        check=True,
    )
    return venv


def lorahub(venv: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "lorahub"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=venv.parent,  # not the checkout, whose packages would be importable from there
        env={"PATH": "/usr/bin:/bin", "HOME": str(venv.parent), **env},
    )


def test_it_installs_alone_without_the_platforms_packages(clean_venv):
    probe = subprocess.run(
        [
            str(clean_venv / "bin" / "python"),
            "-c",
            "import importlib.util as u; print(','.join(m for m in "
            f"{PLATFORM_MODULES!r} if u.find_spec(m)))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=clean_venv.parent,
    )
    assert probe.stdout.strip() == ""  # none of them importable
    helped = lorahub(clean_venv, "--help")
    assert helped.returncode == 0
    for command in ("login", "push", "versions", "alias", "eval", "keys", "chat"):
        assert command in helped.stdout
    assert lorahub(clean_venv, "alias", "canary", "--percent", "5").returncode == 2  # usage


def test_a_bad_key_exits_3_without_a_traceback(clean_venv, live_server, tenant_a):
    ran = lorahub(
        clean_venv,
        "versions",
        "list",
        LORAHUB_URL=live_server.url,
        LORAHUB_API_KEY="lh_0123456789abcdef_not-a-key",
    )
    assert ran.returncode == 3
    assert "invalid API key" in ran.stderr
    assert "Traceback" not in ran.stderr + ran.stdout


def test_a_server_that_is_down_exits_5_after_bounded_retries(clean_venv):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ran = lorahub(
        clean_venv,
        "alias",
        "list",
        "--json",
        LORAHUB_URL=f"http://127.0.0.1:{port}",
        LORAHUB_API_KEY="lh_0123456789abcdef_x",
        LORAHUB_RETRIES="2",
    )
    assert ran.returncode == 5
    assert f"cannot reach http://127.0.0.1:{port}" in ran.stderr
    assert "after 3 attempts" in ran.stderr and "is the server running" in ran.stderr
    assert "Traceback" not in ran.stderr
    assert '"exit": 5' in ran.stdout
