"""The embedded default under traffic: ``manage.py up`` on SQLite, kombu's filesystem broker and
the directory object store (no outside service), with a real node answering requests while a
tenant makes 50 alias changes — moves, canaries, promotions and rollbacks — through the REST
API. Before WAL, a busy timeout and IMMEDIATE transactions, half of such changes answered 500
("database is locked") because the node's statistics writer held the file."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from tests.harness.processes import ROOT
from tests.harness.waiting import free_port, wait_until

pytestmark = [pytest.mark.engine, pytest.mark.own_nodes]

OUTSIDE = (
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "CELERY_RESULT_BACKEND",
    "LORAHUB_EVENTS_URL",
    "LORAHUB_S3_ENDPOINT",
)


def manage(env: dict, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_embedded_default_takes_alias_changes_under_traffic_without_a_500(demo_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in OUTSIDE}
    env.update(
        LORAHUB_VAR_DIR=str(tmp_path / "var"),
        LORAHUB_DEMO_DIR=str(settings.LORAHUB_DEMO_DIR),
        LORAHUB_INTERNAL_TOKEN="embedded-test-token",
    )
    manage(env, "migrate", "--noinput")
    manage(env, "init_signing_key")
    manage(env, "seed_demo")
    key = json.loads((tmp_path / "var" / "demo-credentials.json").read_text())["acme-key"]
    console_port, node_port = free_port(), free_port()
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "up",
            "--console-port",
            str(console_port),
            "--node-port",
            str(node_port),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    console, node = f"http://127.0.0.1:{console_port}", f"http://127.0.0.1:{node_port}"
    auth = {"Authorization": f"Bearer {key}"}
    stop = threading.Event()
    traffic: Counter = Counter()
    try:

        def started() -> bool:
            assert up.poll() is None, "the stack exited while starting"
            if httpx.get(f"{node}/healthz", timeout=2).status_code != 200:
                return False
            httpx.get(f"{console}/api/aliases", headers=auth, timeout=5)
            return True

        wait_until(started, "the stack to start", 240, 0.5, ignore=(httpx.HTTPError,))
        versions = {
            v["version"]: v["id"]
            for v in httpx.get(
                f"{console}/api/adapters/support/versions", headers=auth, timeout=10
            ).json()
        }
        v1, v2 = versions["demo.1"], versions["demo.2"]

        def send() -> None:
            while not stop.is_set():
                answer = httpx.post(
                    f"{node}/v1/completions",
                    headers=auth,
                    json={"model": "support", "prompt": "Question: hi\nAnswer:", "max_tokens": 4},
                    timeout=60,
                )
                traffic[answer.status_code] += 1

        senders = [threading.Thread(target=send) for _ in range(3)]
        for sender in senders:
            sender.start()
        steps = [
            ("PUT", "/api/aliases/support", {"version_id": v2}),
            ("POST", "/api/aliases/support/canary", {"version_id": v1, "percent": 30}),
            ("POST", "/api/aliases/support/promote", {"reason": "looks good"}),
            ("POST", "/api/aliases/support/rollback", {"reason": "changed my mind"}),
            ("PUT", "/api/aliases/support", {"version_id": v1}),
        ]
        answers: Counter = Counter()
        with httpx.Client(base_url=console, headers=auth, timeout=60) as client:
            for i in range(50):
                method, path, body = steps[i % len(steps)]
                answer = client.request(method, path, json=body)
                answers[answer.status_code] += 1
                assert answer.status_code < 500, (i, path, answer.text)
        stop.set()
        for sender in senders:
            sender.join(timeout=60)
        assert answers == {200: 50}, answers
        assert traffic[200] > 0 and not [s for s in traffic if s >= 500], traffic
    finally:
        stop.set()
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
        log.close()
    output = Path(tmp_path / "up.log").read_text(errors="replace")
    assert "database is locked" not in output
    # Every answer was recorded once, in the request log and in each rollup level (the node
    # writes its last statistics as it stops); the traffic spans more than one flush, so the
    # rows were added to, not only created.
    with sqlite3.connect(tmp_path / "var" / "lorahub.sqlite3") as db:
        logged = db.execute("SELECT COUNT(*) FROM serving_requestlog").fetchone()[0]
        per_minute = db.execute("SELECT SUM(requests) FROM serving_requestminute").fetchone()[0]
        per_step = dict(
            db.execute("SELECT step_s, SUM(requests) FROM serving_requestrollup GROUP BY step_s")
        )
        peak = db.execute("SELECT MAX(ttft_ms_max) FROM serving_requestminute").fetchone()[0]
        slowest = db.execute("SELECT MAX(ttft_ms) FROM serving_requestlog").fetchone()[0]
    answered = sum(traffic.values())
    assert logged == per_minute == per_step[300] == per_step[3600] == answered, (
        logged,
        per_minute,
        per_step,
        traffic,
    )
    assert peak == pytest.approx(slowest)
