"""``manage.py up`` with the real engine: a serving node killed by SIGKILL takes its vLLM
engine processes with it, the restarted node is the only engine, and Ctrl-C leaves nothing.

An operator found this on ``make run NODES=2``: after ``kill -9`` of a node, its
``EngineCore`` (~1.5 GB) lived on as an orphan beside the restarted node's engine, and was
still there after Ctrl-C stopped everything else.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from lorahub.supervise import group_alive
from tests.harness.processes import (
    NODE_CACHE_CONFIG,
    NODE_INTERNAL_TOKEN,
    ROOT,
    S3_ENV,
    NodeProcess,
    child_database_url,
)
from tests.harness.waiting import free_port, wait_until

pytestmark = [pytest.mark.engine, pytest.mark.own_nodes]


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def node_process(up: psutil.Process) -> psutil.Process | None:
    for child in up.children():
        if "runnode" in child.cmdline():
            return child
    return None


def is_engine(process: psutil.Process) -> bool:
    """One of vLLM's engine processes: named ``VLLM::EngineCore`` / ``VLLM::Worker`` once
    started (vLLM sets the process title), a ``multiprocessing`` spawn before that."""
    try:
        title = " ".join(process.cmdline()) + " " + process.name()
        return process.status() != psutil.STATUS_ZOMBIE and (
            "VLLM::" in title or "spawn_main" in title
        )
    except psutil.Error:  # it ended while we looked
        return False


def engine_processes(node: psutil.Process) -> list[psutil.Process]:
    """The engine processes the node started (its descendants, whatever their names)."""
    return [p for p in node.children(recursive=True) if is_engine(p)]


def orphaned_engines(cache_dir: Path) -> set[int]:
    """Engine processes whose parent died (adopted by init): what a node killed without its
    engine leaves behind. Only this test's (its node's cache folder in their environment):
    `make test` runs other engine tests beside this one, whose killed engines are theirs."""

    def ours(p: psutil.Process) -> bool:
        try:
            return p.environ().get("LORAHUB_NODE_CACHE_DIR") == str(cache_dir)
        except psutil.Error:  # it ended while we looked
            return False

    return {p.pid for p in psutil.process_iter() if is_engine(p) and p.ppid() == 1 and ours(p)}


def test_a_node_killed_under_up_takes_its_engine_with_it_and_ctrl_c_leaves_nothing(
    tmp_path: Path, django_db_setup, s3_server, demo_dir
):
    (tmp_path / "cache.yaml").write_text(NODE_CACHE_CONFIG)
    node_port = free_port()
    url = f"http://127.0.0.1:{node_port}"
    env = {
        **os.environ,
        "DATABASE_URL": child_database_url(),
        "LORAHUB_S3_ENDPOINT": s3_server,
        **S3_ENV,
        "LORAHUB_CACHE_CONFIG": str(tmp_path / "cache.yaml"),
        "LORAHUB_NODE_CACHE_DIR": str(tmp_path / "cache"),
        "LORAHUB_NODE_NAME": "up-node",
        "LORAHUB_INTERNAL_TOKEN": NODE_INTERNAL_TOKEN,
    }
    command = [
        sys.executable,
        "manage.py",
        "up",
        "--console-port",
        str(free_port()),
        "--node-port",
        str(node_port),
    ]
    with (tmp_path / "up.log").open("wb") as log:
        up_proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    up = psutil.Process(up_proc.pid)
    orphans_before = orphaned_engines(tmp_path / "cache")  # none, unless one leaked before
    try:
        wait_until(lambda: ready(url), f"the node to be ready (see {tmp_path}/up.log)", 240)
        node = node_process(up)
        assert node is not None
        engine = engine_processes(node)
        assert engine, "the node runs no engine process"

        node.kill()  # SIGKILL: no draining, no engine shutdown
        # everything the node started (its engine, vLLM's resource tracker) ends with it
        wait_until(lambda: not group_alive(node.pid), "the killed node's processes to end", 60)
        assert not any(p.is_running() and p.status() != "zombie" for p in engine)

        wait_until(
            lambda: (n := node_process(up)) is not None and n.pid != node.pid and ready(url),
            "the restarted node to be ready",
            240,
        )
        restarted = node_process(up)
        assert restarted is not None
        ours = {p.pid for p in engine_processes(restarted)}
        assert ours
        # under up, the restarted node's engine is the only one; nowhere an orphaned one
        assert {p.pid for part in up.children() for p in engine_processes(part)} == ours
        assert orphaned_engines(tmp_path / "cache") - orphans_before == set()
        everything = up.children(recursive=True)
    finally:
        up_proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            up_proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(up_proc.pid, signal.SIGKILL)
            up_proc.wait()
            pytest.fail("up did not stop within 90 s of Ctrl-C")
    _, left = psutil.wait_procs(everything, timeout=5)
    assert not [p for p in left if p.status() != "zombie"], "processes outlived up's Ctrl-C"


def test_a_node_stopped_while_its_engine_starts_leaves_no_engine_behind(
    tmp_path: Path, django_db_setup, s3_server, demo_dir
):
    """SIGTERM while vLLM is still starting: the node waits for the start, shuts the engine
    down and ends whatever is left below it. An operator saw ``VLLM::EngineCore`` and
    ``VLLM::Worker`` (~1.3 GB) left with parent 1 after stopping ``make run`` at that moment."""
    node = NodeProcess(tmp_path, s3_server, name="stopped-early").start()
    proc = psutil.Process(node.proc.pid)
    try:
        wait_until(
            lambda: any(is_engine(p) for p in proc.children(recursive=True)),
            "the node to start spawning its engine",
            120,
        )
        assert httpx.get(f"{node.url}/healthz", timeout=5).status_code == 503  # still starting
        seen = proc.children(recursive=True)
        node.proc.terminate()
        node.proc.wait(timeout=180)
    finally:
        if node.proc.poll() is None:
            node.kill()
    _, alive = psutil.wait_procs(seen, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
    # nor one spawned after we looked
    assert orphaned_engines(tmp_path / "cache") == set()
