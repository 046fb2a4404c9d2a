"""Faults injected into real parts, each showing the system keeps serving what it can, answers
the rest cleanly, and recovers by itself."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis as redis_client

from apps.demo import corpus
from apps.tenants import services as tenant_services
from apps.tenants.choices import Priority
from tests.harness.processes import (
    NODE_CACHE_CONFIG,
    NODE_INTERNAL_TOKEN,
    S3_ENV,
    NodeProcess,
    stop,
)
from tests.harness.waiting import free_port, wait_for_port, wait_until
from tests.helpers import node_metric, publish

pytestmark = [pytest.mark.engine, pytest.mark.own_nodes, pytest.mark.faults]

PROMPT = corpus.completion_prompt(corpus.UNSEEN_PROMPTS[1])
V1, V2 = corpus.PHRASES["support-v1"], corpus.PHRASES["support-v2"]


def sla(deadline_ms: int) -> str:
    """The cache config's load deadlines: every tenant tier waits ``deadline_ms``; then a
    standard tenant gets the base model (degrade), a batch tenant a 503 with Retry-After."""
    return f"""
  load_queue:
    sla:
      premium:  {{deadline_ms: {deadline_ms}, on_overload: wait}}
      standard: {{deadline_ms: {deadline_ms}, on_overload: degrade}}
      batch:    {{deadline_ms: {deadline_ms}, on_overload: reject}}
"""


# A load deadline short enough that a registry outage shows within a test. A first load from
# the registry (fetch, verify, land, engine add) usually makes it, but not always on a 2-core
# machine running four lanes: before an outage, tests wait with `answered_by_adapter`.
FAST_SLA = sla(8000)
# Once no outage is under way, a deadline that only a broken load misses: what such a test checks
# is what lands, not how fast a 2-core machine running four lanes lands it (8 s degraded one).
PATIENT_SLA = sla(45000)


@pytest.fixture
def private_s3(settings) -> Iterator[tuple[subprocess.Popen, str]]:
    """An S3 server of this test's own (the session's is shared), with the store pointed at it."""
    from apps.registry import storage

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_port(port, proc)
    settings.LORAHUB_S3_ENDPOINT = f"http://127.0.0.1:{port}"
    settings.LORAHUB_S3_BUCKET = S3_ENV["LORAHUB_S3_BUCKET"]
    settings.LORAHUB_S3_ACCESS_KEY = S3_ENV["LORAHUB_S3_ACCESS_KEY"]
    settings.LORAHUB_S3_SECRET_KEY = S3_ENV["LORAHUB_S3_SECRET_KEY"]
    storage.get_store.cache_clear()
    try:
        yield proc, settings.LORAHUB_S3_ENDPOINT
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        stop(proc)
        storage.get_store.cache_clear()


def serves(node: NodeProcess, tenant: str, version_id: int, within: float) -> None:
    """Wait until the node's alias table has ``support`` of ``tenant`` on ``version_id``."""
    wait_until(
        lambda: httpx.get(
            f"{node.url}/internal/alias",
            params={"tenant": tenant, "alias": "support"},
            headers={"Authorization": f"Bearer {NODE_INTERNAL_TOKEN}"},
            timeout=10,
        ),
        f"the node to serve version {version_id}",
        within,
        0.05,
        until=lambda answer: (
            answer.status_code == 200 and answer.json()["stable_version_id"] == version_id
        ),
        describe=lambda answer: f"the node still serves {answer.text}",
    )


def ask(node: NodeProcess, key: str) -> httpx.Response:
    return httpx.post(
        f"{node.url}/v1/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "support", "prompt": PROMPT, "max_tokens": 8, "temperature": 0},
        timeout=60,
    )


def answered_by_adapter(node: NodeProcess, key: str, within: float = 90) -> httpx.Response:
    """The first answer not degraded to the base model, within ``within`` seconds: after an
    outage, and before one, where a first load on a loaded machine may miss the 8 s deadline
    (the load goes on meanwhile)."""
    return wait_until(
        lambda: ask(node, key),
        "an answer from the adapter",
        within,
        0.5,
        until=lambda answer: (
            answer.status_code == 200 and "x-lorahub-degraded" not in answer.headers
        ),
        describe=lambda answer: answer.text,
    )


def test_an_s3_outage_keeps_cached_adapters_serving_and_heals_by_itself(
    private_s3, signing_key, base_model, reviewer, demo_dir, tmp_path, transactional_db
):
    from apps.registry import aliases
    from apps.tenants.auth import principal_for_key

    s3, s3_url = private_s3
    standard = tenant_services.create_tenant(slug="std", name="Standard")
    batch = tenant_services.create_tenant(slug="bat", name="Batch", priority=Priority.BATCH)
    folder = demo_dir / "adapters"
    keys, rows, versions = {}, {}, {}
    for tenant in (standard, batch):
        versions[tenant.slug] = {
            name: publish(tenant, "support", name, folder / src, reviewer)
            for name, src in (("v1", "support-v1"), ("v2", "support-v2"))
        }
        rows[tenant.slug], keys[tenant.slug] = tenant_services.issue_api_key(
            tenant=tenant, name="app", actor=None
        )
        aliases.set_alias(
            principal=principal_for_key(rows[tenant.slug]),
            tenant=tenant,
            name="support",
            version_id=versions[tenant.slug]["v1"],
        )
    (tmp_path / "node").mkdir()
    node = NodeProcess(
        tmp_path / "node",
        s3_url,
        name="fault-node",
        config=NODE_CACHE_CONFIG + FAST_SLA,
    )
    node.start()
    try:
        node.wait_ready()
        for slug in keys:  # v1 lands on disk and in the engine
            first = answered_by_adapter(node, keys[slug])
            assert first.headers["x-lorahub-adapter"] == "support@v1"

        os.kill(s3.pid, signal.SIGSTOP)  # the registry hangs: no answer at all
        outage = time.monotonic()
        for slug in keys:  # what is cached keeps serving
            hot = ask(node, keys[slug])
            assert hot.status_code == 200 and hot.headers["x-lorahub-cache-tier"] == "L1"
            assert hot.json()["choices"][0]["text"].strip().startswith(V1)
        for slug in keys:  # a cold version: the registry is needed
            aliases.set_alias(
                principal=principal_for_key(rows[slug]),
                tenant=standard if slug == "std" else batch,
                name="support",
                version_id=versions[slug]["v2"],
            )
        for slug in keys:  # the node follows the move (it polls or hears the broadcast)
            serves(node, slug, versions[slug]["v2"], within=10)
        degraded = ask(node, keys["std"])
        assert degraded.status_code == 200, degraded.text
        assert degraded.headers.get("x-lorahub-degraded") == "1"  # the base model answered
        refused = ask(node, keys["bat"])
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"]
        assert refused.json()["error"]["code"] in ("load_deadline", "load_queue_full")
        assert httpx.get(f"{node.url}/healthz", timeout=5).status_code == 200

        os.kill(s3.pid, signal.SIGCONT)  # the registry is back
        recovered = answered_by_adapter(node, keys["std"])
        assert recovered.headers["x-lorahub-adapter"] == "support@v2"
        assert recovered.json()["choices"][0]["text"].strip().startswith(V2)
        print(f"s3 outage: recovered {time.monotonic() - outage:.1f} s after it began")
    finally:
        node.stop()


def test_a_node_killed_mid_landing_uses_nothing_half_landed_after_its_restart(
    private_s3, signing_key, base_model, tenant_b, reviewer, demo_dir, tmp_path, transactional_db
):
    """kill -9 while a version is being landed on disk (L3): the restarted node throws the
    half-landed folder away and lands the version again from the registry."""
    from apps.registry import aliases
    from apps.tenants.auth import principal_for_key

    s3, s3_url = private_s3
    v1 = publish(tenant_b, "support", "v1", demo_dir / "adapters" / "support-v1", reviewer)
    row, key = tenant_services.issue_api_key(tenant=tenant_b, name="app", actor=None)
    aliases.set_alias(
        principal=principal_for_key(row), tenant=tenant_b, name="support", version_id=v1
    )
    (tmp_path / "node").mkdir()
    node = NodeProcess(
        tmp_path / "node", s3_url, name="fault-node", config=NODE_CACHE_CONFIG + FAST_SLA
    )
    cache = tmp_path / "node" / "cache"
    node.start()
    try:
        node.wait_ready()
        os.kill(s3.pid, signal.SIGSTOP)  # the download will hang half-way
        assert ask(node, key).headers.get("x-lorahub-degraded") == "1"  # meanwhile: base
        wait_until(lambda: list(cache.glob("t*/*/.landing-*")), "a landing to start")
        node.kill()  # mid-landing
        half = list(cache.glob("t*/*/.landing-*"))
        assert half, "the half-landed folder should still be there after the kill"
        assert not list(cache.glob("t*/*/*/.seal.json"))  # nothing was sealed
        os.kill(s3.pid, signal.SIGCONT)

        (tmp_path / "node" / "cache.yaml").write_text(NODE_CACHE_CONFIG + PATIENT_SLA)
        node.start().wait_ready()
        assert not any(path.exists() for path in half)  # thrown away at start
        answer = ask(node, key)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-lorahub-cache-tier"] == "L4", (  # landed again, in full
            dict(answer.headers),
            node.log_path.read_text(errors="replace").splitlines()[-20:],
        )
        assert answer.json()["choices"][0]["text"].strip().startswith(V1)
        assert len(list(cache.glob("t*/*/*/.seal.json"))) == 1
    finally:
        node.stop()


def test_with_redis_down_the_node_serves_and_alias_moves_still_arrive(
    published, tenant_a, settings, tmp_path, s3_server, transactional_db
):
    """The broadcast channel (Redis pub/sub) stops: inference goes on, and the node falls back
    to watching the database's change marker, so a move still arrives in seconds (not at its
    30 s full refresh); when Redis is back, broadcasts work again.

    The Redis that stops is this test's own (the node's channel points at it), not the
    machine's: so it is no ``outage`` test and runs beside the other lanes."""
    import shutil as _shutil

    from apps.registry import aliases
    from apps.tenants import events
    from apps.tenants.auth import principal_for_key

    redis_server = _shutil.which("redis-server")
    assert redis_server, "redis-server is needed (make test installs it)"
    port = free_port()
    command = [redis_server, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    redis = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    wait_for_port(port, redis)
    settings.LORAHUB_EVENTS_URL = f"redis://127.0.0.1:{port}/0"
    events._client.cache_clear()
    row, key = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    principal = principal_for_key(row)

    def point(version: str) -> None:
        aliases.set_alias(
            principal=principal, tenant=tenant_a, name="support", version_id=published[version]
        )

    def follows(version: str, within: float) -> float:
        started = time.monotonic()

        def served(answer: httpx.Response) -> bool:
            assert answer.status_code == 200, answer.text
            return answer.headers["x-lorahub-adapter"] == f"support@{version}"

        wait_until(lambda: ask(node, key), f"support@{version} to answer", within, until=served)
        return time.monotonic() - started

    point("v1")
    (tmp_path / "node").mkdir()
    node = NodeProcess(
        tmp_path / "node",
        s3_server,
        name="redis-fault-node",
        LORAHUB_EVENTS_URL=settings.LORAHUB_EVENTS_URL,
    )
    node.start()
    try:
        node.wait_ready()
        follows("v1", within=30)
        redis.kill()  # the channel is gone
        redis.wait()
        point("v2")  # the broadcast fails (logged); the change is committed all the same
        took = follows("v2", within=10)
        print(f"redis down: the move arrived after {took:.2f} s")
        redis = subprocess.Popen(command, stdout=subprocess.DEVNULL)  # back
        wait_for_port(port, redis)
        events._client.cache_clear()
        listeners = redis_client.Redis(port=port)
        wait_until(
            lambda: dict(listeners.pubsub_numsub(settings.LORAHUB_EVENTS_CHANNEL)).get(
                settings.LORAHUB_EVENTS_CHANNEL.encode()
            ),
            "the node to subscribe again",
            15,
        )
        listeners.close()
        point("v1")
        follows("v1", within=5)
    finally:
        node.stop()
        redis.kill()
        events._client.cache_clear()


def postgres(action: str) -> None:
    """Stop or start the PostgreSQL cluster the suite runs on (Debian's, as `make test` starts
    it): a real outage for every process connected to it."""
    version = sorted(os.listdir("/etc/postgresql"), key=lambda v: [int(p) for p in v.split(".")])
    command = ["pg_ctlcluster", "--skip-systemctl-redirect", version[-1], "main", action]
    subprocess.run([*command, *(["-m", "fast"] if action == "stop" else [])], check=True)
    if action == "start":
        wait_until(
            lambda: subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1"]).returncode == 0,
            "PostgreSQL to come back",
            60,
            0.2,
        )


@pytest.mark.outage
def test_a_postgresql_restart_keeps_known_callers_served_and_loses_no_statistics(
    published, tenant_a, tmp_path, s3_server, transactional_db
):
    """PostgreSQL stops under a serving node, then comes back: keys and aliases the node has
    cached keep being served; a key it has never seen gets 503 with Retry-After (not a 500);
    the node reconnects by itself; every request it answered meanwhile reaches the request
    log once (or the drop counter says how many did not)."""
    from django.db import connections

    from apps.registry import aliases
    from apps.telemetry.models import RequestLog
    from apps.tenants.auth import principal_for_key

    row, key = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    _, unseen = tenant_services.issue_api_key(tenant=tenant_a, name="new", actor=None)
    aliases.set_alias(
        principal=principal_for_key(row),
        tenant=tenant_a,
        name="support",
        version_id=published["v1"],
    )
    (tmp_path / "node").mkdir()
    node = NodeProcess(tmp_path / "node", s3_server, name="pg-fault-node")
    node.start()
    answered = 0
    try:
        node.wait_ready()
        for _ in range(3):
            assert ask(node, key).status_code == 200
            answered += 1

        postgres("stop")
        try:
            outage = time.monotonic()
            for _ in range(5):  # the node's in-memory tables answer
                served = ask(node, key)
                answered += 1
                assert served.status_code == 200, served.text
                assert served.headers["x-lorahub-cache-tier"] == "L1"
                assert served.json()["choices"][0]["text"].strip().startswith(V1)
            refused = ask(node, unseen)  # needs the database
            answered += 1
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "control_plane_unavailable"
            assert refused.headers["retry-after"]
            assert httpx.get(f"{node.url}/healthz", timeout=5).status_code == 200
            time.sleep(3)  # a few statistics flushes fail meanwhile
            held = node_metric(node.url, "request_stats_backlog")
            assert held >= 6, held  # kept, not lost
        finally:
            postgres("start")
            connections.close_all()  # this process's connection died with the server
        back = time.monotonic()

        def unseen_served() -> bool:  # the node reconnects by itself: the unseen key works
            nonlocal answered
            answer = ask(node, unseen)
            answered += 1
            assert answer.status_code in (200, 503), answer.text
            return answer.status_code == 200

        wait_until(unseen_served, "the node to reconnect to PostgreSQL", 60, 0.5)
        reconnected = time.monotonic() - back

        written = wait_until(
            lambda: RequestLog.objects.filter(node="pg-fault-node").count(),
            f"all {answered} requests in the log",
            60,
            0.5,
            until=lambda written: written >= answered,
        )
        dropped = node_metric(node.url, "request_stats_dropped_total")
        assert written + dropped == answered, (written, dropped, answered)
        assert dropped == 0
        assert node_metric(node.url, "request_stats_backlog") == 0
        print(
            f"postgres outage of {back - outage:.1f} s: {answered} requests answered, "
            f"{written} in the request log, {dropped:.0f} dropped; the node served a new key "
            f"{reconnected:.2f} s after PostgreSQL was back"
        )
    finally:
        node.stop()


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A 256 KiB filesystem (tmpfs) for a node's disk cache: room for one small demo
    adapter (~150 KB), not two. Needs root, as `make test` runs here and in CI."""
    folder = tmp_path / "node" / "cache"
    folder.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    assert mounted.returncode == 0, f"cannot mount a small tmpfs (run as root): {mounted.stderr}"
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def leftovers(cache: Path) -> list[Path]:
    """Anything of a landing that is not a sealed version folder."""
    partial = list(cache.glob("t*/*/.landing-*"))
    unsealed = [f for f in cache.glob("t*/*/*@*") if not (f / ".seal.json").exists()]
    return partial + unsealed


def test_a_full_disk_cache_evicts_to_make_room_or_fails_the_load_cleanly(
    published, tenant_a, small_disk, tmp_path, s3_server, transactional_db
):
    """The disk cache's filesystem is smaller than its configured cap (500 GB by default):
    a landing that hits ENOSPC evicts an L3 copy no one is using and lands; when everything
    on the disk is in use (and the rest is filled by something else) the request gets 503
    `disk_full` naming the problem, nothing half-written stays, and the node keeps serving."""
    from apps.registry import aliases
    from apps.tenants.auth import principal_for_key

    row, key = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    principal = principal_for_key(row)

    def point(alias: str, version: str) -> None:
        aliases.set_alias(
            principal=principal, tenant=tenant_a, name=alias, version_id=published[version]
        )

    def evict_from_engine(version: str) -> None:
        answer = httpx.post(
            f"{node.url}/internal/evict",
            headers={"Authorization": f"Bearer {NODE_INTERNAL_TOKEN}"},
            json={"version_id": published[version], "tier": "L2"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text

    def served(alias: str, version: str) -> httpx.Response:
        def answered(answer: httpx.Response) -> bool:
            """The version answered, or refused for a reason of its own: not a load that
            missed its deadline on a loaded machine (it goes on; the retry finds it)."""
            late = answer.status_code == 503 and "load_deadline" in answer.text
            return answer.headers.get("x-lorahub-adapter") == f"support@{version}" and not late

        return wait_until(  # until the node has followed the alias move (broadcast)
            lambda: httpx.post(
                f"{node.url}/v1/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={"model": alias, "prompt": PROMPT, "max_tokens": 8, "temperature": 0},
                timeout=60,
            ),
            f"support@{version} to answer",
            90,
            0.2,
            until=answered,
            describe=lambda answer: (answer.status_code, answer.text),
        )

    def on_disk() -> list[str]:
        return sorted(s.parent.name.split("@")[0] for s in small_disk.glob("t*/*/*/.seal.json"))

    point("support", "v1")
    node = NodeProcess(tmp_path / "node", s3_server, name="disk-fault-node")
    node.start()
    try:
        node.wait_ready()
        first = served("support", "v1")
        assert first.status_code == 200, first.text
        assert first.headers["x-lorahub-cache-tier"] == "L4"
        evict_from_engine("v1")  # its disk copy stays, now used by nobody

        point("support", "v3")  # as large as v1: the two do not fit on this disk
        landed = served("support", "v3")
        assert landed.status_code == 200, landed.text
        assert landed.headers["x-lorahub-cache-tier"] == "L4"
        assert landed.json()["choices"][0]["text"].strip().startswith(V1)  # v3 = v1's weights
        assert on_disk() == ["v3"]  # v1 was evicted to make room
        assert leftovers(small_disk) == []

        # something else fills the disk, and v3 is in use (the engine serves `support`)
        filler = small_disk / "filler.bin"
        with contextlib.suppress(OSError), filler.open("wb", buffering=0) as out:
            while True:  # until ENOSPC
                out.write(b"\0" * 4096)
        point("second", "v1")
        refused = served("second", "v1")
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "disk_full"
        assert "disk cache is full" in error["message"]
        assert refused.headers["retry-after"]
        assert leftovers(small_disk) == []
        assert on_disk() == ["v3"]
        assert "every version cached there is in use" in node.log_path.read_text()
        hot = served("support", "v3")  # the node keeps serving what it has
        assert hot.status_code == 200 and hot.headers["x-lorahub-cache-tier"] == "L1"

        filler.unlink()  # the operator frees the disk; v3 leaves the engine
        evict_from_engine("v3")
        recovered = served("second", "v1")
        assert recovered.status_code == 200, recovered.text
        assert recovered.headers["x-lorahub-cache-tier"] == "L4"
        assert recovered.json()["choices"][0]["text"].strip().startswith(V1)
        assert on_disk() == ["v1"]
        assert leftovers(small_disk) == []
    finally:
        node.stop()
