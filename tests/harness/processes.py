"""The real parts a test starts as processes: a Celery worker, an in-process engine, a
serving node; and stopping them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.harness.waiting import free_port

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent.parent
S3_ENV = {
    "LORAHUB_S3_BUCKET": "lorahub-test",
    "LORAHUB_S3_ACCESS_KEY": "testing",
    "LORAHUB_S3_SECRET_KEY": "testing",
}


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def child_database_url() -> str:
    """The URL of the test database, for processes the tests start (worker, node)."""
    from django.db import connection

    db = connection.settings_dict
    return f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def start_worker(
    s3_server: str, name: str | None = None, **env: str
) -> tuple[subprocess.Popen, str]:
    """A real Celery worker process (solo pool: tasks run in the process itself) on Redis,
    the test database and the S3 server; returns it and its name once it answers a ping."""
    from lorahub.celery import app

    name = name or f"test-{uuid.uuid4().hex[:8]}@{socket.gethostname()}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "lorahub",
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "WARNING",
            "-n",
            name,
            "--without-gossip",
            "--without-mingle",
        ],
        env={
            **os.environ,
            "DATABASE_URL": child_database_url(),
            "LORAHUB_S3_ENDPOINT": s3_server,
            # evaluation runs ask the registered serving nodes' internal API
            "LORAHUB_INTERNAL_TOKEN": NODE_INTERNAL_TOKEN,
            # the tests' webhook receivers listen on this machine
            "LORAHUB_WEBHOOK_ALLOW_PRIVATE": "1",
            **S3_ENV,
            **env,
        },
        cwd=ROOT,
    )
    deadline = time.monotonic() + 60
    while not app.control.ping(destination=[name], timeout=1.0):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            pytest.fail("the Celery worker did not start; see its output above")
    return proc, name


class EngineRunner:
    """Runs the async engine on an event loop in a background thread; tests call it sync."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._closing: threading.Thread | None = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 300) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def begin_close(self) -> None:
        """Starts closing the engine in a thread and returns (``close`` waits for it): vLLM
        takes ~5 s to stop its processes, which the session's end spends stopping the
        serving node too instead of one after the other."""
        if self._closing is None:
            self._closing = threading.Thread(target=self._close, name="engine-close")
            self._closing.start()

    def close(self) -> None:
        self.begin_close()
        assert self._closing is not None
        self._closing.join(timeout=90)

    def _close(self) -> None:
        # Shut down on the loop's own thread so vLLM's output handler is cancelled, not
        # woken by the engine core's exit.
        async def shutdown() -> None:
            self.engine.shutdown()

        self.run(shutdown(), timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


NODE_INTERNAL_TOKEN = "test-internal-token"


NODE_CACHE_CONFIG = """
base_model: lorahub-demo-tiny
base_model_revision: r1
adapter_cache:
  gpu_hot: {max_adapters: 2, max_lora_rank: 16}
  cpu_warm: {max_adapters: 4}
"""


class NodeProcess:
    """A real serving node process (``manage.py runnode``: uvicorn + vLLM) on the test
    database, Redis and the S3 server, with its own folder (cache config, disk cache, log).
    ``start`` may be called again after ``kill``/``stop``: same name, port and disk cache."""

    def __init__(
        self,
        work: Path,
        s3_server: str,
        name: str = "test-node",
        config: str = NODE_CACHE_CONFIG,
        **env: str,
    ) -> None:
        self.work, self.name, self.port = work, name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        (work / "cache.yaml").write_text(config)
        self.env = {
            **os.environ,
            "DATABASE_URL": child_database_url(),
            "LORAHUB_S3_ENDPOINT": s3_server,
            **S3_ENV,
            "LORAHUB_CACHE_CONFIG": str(work / "cache.yaml"),
            "LORAHUB_NODE_CACHE_DIR": str(work / "cache"),
            "LORAHUB_NODE_MAX_CONCURRENT": "4",
            "LORAHUB_NODE_MAX_QUEUE": "16",
            "LORAHUB_NODE_NAME": name,
            "LORAHUB_INTERNAL_TOKEN": NODE_INTERNAL_TOKEN,
            # the release drills inject faults for one version (apps/serving/node/seams.py)
            "LORAHUB_TEST_SEAMS": "1",
            # no router watches these nodes' health (the fleet's set their own): stop at once
            "LORAHUB_NODE_DRAIN_LEAVE_S": "0",
            **env,
        }

    @property
    def log_path(self) -> Path:
        return self.work / "node.log"

    def start(self) -> NodeProcess:
        """Spawns the node and returns at once; a thread watches /healthz from now until it
        answers 200 (``wait_ready`` waits for that), so the node may start while tests run."""
        import httpx

        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "runnode", "--port", str(self.port)],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.startup: list[httpx.Response] = []
        self._watcher = threading.Thread(
            target=self._watch_startup, args=(self.proc,), name=f"{self.name}-startup", daemon=True
        )
        self._watcher.start()
        return self

    def _watch_startup(self, proc: subprocess.Popen) -> None:
        """Keeps every /healthz answer in ``self.startup`` (what a load balancer saw while the
        node started) until one is a 200 or the process exits."""
        import httpx

        while proc.poll() is None:
            try:
                response = httpx.get(f"{self.url}/healthz", timeout=5)
            except httpx.TransportError:  # not listening yet
                time.sleep(0.1)
                continue
            self.startup.append(response)
            if response.status_code == 200:
                return
            time.sleep(0.5)

    def wait_ready(self, timeout: float = 240) -> NodeProcess:
        """Waits until the node answers 200 on /healthz; fails naming its log otherwise."""
        assert self.proc is not None
        self._watcher.join(timeout)
        if not self.startup or self.startup[-1].status_code != 200:
            pytest.fail(f"node {self.name} did not become ready; see {self.log_path}")
        return self

    def kill(self) -> None:
        """SIGKILL to the node and its engine core, as when its machine dies: no draining,
        no deregistering, no engine shutdown."""
        import psutil

        assert self.proc is not None
        tree = [psutil.Process(self.proc.pid)]
        tree += tree[0].children(recursive=True)
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        self.proc.wait()

    def stop(self) -> list[int]:
        """SIGTERM and wait; returns the pids of the node's processes still alive after it
        exited (its download workers, its engine core: none should be)."""
        import psutil

        if self.proc is None or self.proc.poll() is not None:
            return []
        children = psutil.Process(self.proc.pid).children(recursive=True)
        stop(self.proc)
        _, alive = psutil.wait_procs(children, timeout=10)
        return [p.pid for p in alive]
