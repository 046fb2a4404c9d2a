"""Shared fixtures: personas, and the real parts (S3 server, Celery worker, vLLM engine).

Real parts start once per test session. PostgreSQL and Redis must be reachable (``make test``
starts them); the S3 server (moto's server mode) and the Celery worker are started here on
free ports / a private Redis database and reached the way production reaches them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest
from django.conf import settings

from apps.tenants import services as tenant_services
from apps.tenants.choices import PlatformRole, TenantRole
from tests.harness.otlp import OtlpReceiver
from tests.harness.processes import (
    EngineRunner,
    NodeProcess,
    child_database_url,
    start_worker,
    stop,
)
from tests.harness.s3 import empty_the_bucket, s3_overrides
from tests.harness.waiting import free_port, wait_for_port, wait_until
from tests.personas import (
    make_reviewer,
    make_tenant_a,
    publish_support_versions,
    register_demo_base_model,
)

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent


def _flush_quickly_and_retry_deadlocks() -> None:
    """How transactional tests empty the tables after themselves.

    - DELETE, not TRUNCATE, on PostgreSQL: Django truncates every table, which costs
      150-300 ms here however few rows there are (a new file per table), against ~5 ms to
      delete the rows a test leaves; Django's MySQL backend deletes instead of truncating
      for the same reason. Django makes PostgreSQL's foreign keys DEFERRABLE INITIALLY
      DEFERRED and flushes in one transaction, so the order of the DELETEs does not matter.
      A flush that resets sequences still truncates. The flush first locks the tables
      against writes, as TRUNCATE does, so a live node cannot insert between the DELETEs.
    - Retried on a deadlock: a live serving node may be writing its statistics while the
      flush runs, and PostgreSQL then sometimes picks the flush as the victim. Nothing is
      half-done (it rolled back), so it is simply tried again.
    """
    from django.db import OperationalError
    from django.db.backends.base.operations import BaseDatabaseOperations
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences:
            return truncate(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        if not tables:
            return []
        names = [style.SQL_FIELD(self.quote_name(table)) for table in tables]
        delete_from = f"{style.SQL_KEYWORD('DELETE')} {style.SQL_KEYWORD('FROM')}"
        # TRUNCATE's lock, without its cost: a node still writing (its request log, say)
        # waits for the flush to commit instead of inserting a row between two DELETEs that
        # points at a tenant the next DELETE removes (a foreign-key error at commit).
        lock = f"LOCK TABLE {', '.join(names)} IN EXCLUSIVE MODE;"
        return [lock, *(f"{delete_from} {name};" for name in names)]

    flush = BaseDatabaseOperations.execute_sql_flush

    def execute_sql_flush(self, sql_list):
        for attempt in range(5):
            try:
                return flush(self, sql_list)
            except OperationalError as exc:
                if "deadlock detected" not in str(exc) or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    DatabaseOperations.sql_flush = sql_flush
    BaseDatabaseOperations.execute_sql_flush = execute_sql_flush


_flush_quickly_and_retry_deadlocks()


# --- personas --------------------------------------------------------------------------------


@pytest.fixture
def tenant_a(db):
    return make_tenant_a()


@pytest.fixture
def tenant_b(db):
    tenant = tenant_services.create_tenant(slug="tenant-b", name="Tenant B")
    user = tenant_services.ensure_user(username="bob", password="bob-pass-123")
    tenant_services.add_member(tenant=tenant, user=user, role=TenantRole.ADMIN)
    return tenant


@pytest.fixture
def reviewer(db):
    return make_reviewer()


@pytest.fixture
def operator(db):
    user = tenant_services.ensure_user(username="otto", password="otto-pass-123")
    tenant_services.grant_platform_role(user=user, role=PlatformRole.OPERATOR)
    return user


# --- S3 server -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """moto in server mode, in its own process, on a free port: S3 over real HTTP."""
    port = free_port()
    recording = Path(tempfile.mkdtemp(prefix="moto-")) / "recording.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "MOTO_RECORDER_FILEPATH": str(recording)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)
        shutil.rmtree(recording.parent, ignore_errors=True)


@pytest.fixture
def s3_settings(s3_server, settings):
    """Point the object store at the S3 server, with the test bucket emptied first.

    One bucket for the session, because the Celery worker (a separate process, started once)
    must see the same objects as the test.
    """
    from apps.registry import storage

    for name, value in s3_overrides(s3_server).items():
        setattr(settings, name, value)
    empty_the_bucket()
    yield settings
    storage.get_store.cache_clear()


@pytest.fixture
def signing_key(settings, tmp_path):
    """Fresh platform keys for this test (the Ed25519 key and the model-signing key beside
    it); returns the Ed25519 key's id."""
    settings.LORAHUB_SIGNING_KEY = ""
    settings.LORAHUB_SIGNING_KEY_FILE = tmp_path / "signing-key.pem"
    settings.LORAHUB_BUNDLE_KEY = settings.LORAHUB_BUNDLE_KEY_FILE = ""
    from tests.helpers import write_platform_keys

    return write_platform_keys(settings.LORAHUB_SIGNING_KEY_FILE)


@pytest.fixture(autouse=True)
def _local_store_in_tmp(settings, tmp_path) -> Iterator[None]:
    """Where no test names S3, objects go to this test's folder, never the checkout's var/
    (approving a version stores its model-signing bundle)."""
    from apps.registry import storage

    settings.LORAHUB_LOCAL_STORE_DIR = tmp_path / "objectstore"
    storage.get_store.cache_clear()
    yield
    storage.get_store.cache_clear()


# --- registry ------------------------------------------------------------------------------


@pytest.fixture
def base_model(db, demo_dir):
    return register_demo_base_model(demo_dir)


@pytest.fixture
def adapter_files(demo_dir, tmp_path) -> Path:
    """A copy of the support-v1 demo adapter that a test may modify."""
    folder = tmp_path / "support-v1"
    shutil.copytree(demo_dir / "adapters" / "support-v1", folder)
    return folder


@pytest.fixture
def registry(s3_settings, signing_key, base_model, celery_worker, transactional_db):
    """Everything an end-to-end registry test needs: S3, a signing key, the worker.

    On the way out it waits for the worker to finish validations the test queued, so that
    clearing the tables never races a worker transaction.
    """
    from apps.registry.models import AdapterVersion

    yield s3_settings
    deadline = time.monotonic() + 60
    while AdapterVersion.objects.filter(state="validating").exists():
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    wait_for_other_transactions()  # the worker commits, then closes its transaction


def wait_for_other_transactions(timeout_s: float = 30) -> None:
    """Until no other session on the test database is inside a statement or a transaction
    (a worker finishing its commit), so that the table flush after the test never races
    it. Fails naming what stayed busy."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:

        def busy() -> list:
            cursor.execute(
                "SELECT pid, state, left(query, 80) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend' AND state <> 'idle'"
            )
            return cursor.fetchall()

        wait_until(
            busy, "other sessions to go idle", timeout_s, 0.02, until=lambda found: not found
        )


@pytest.fixture
def support_versions(db, signing_key, tenant_a, reviewer) -> dict[str, int]:
    """Tenant A's 'support' adapter with approved, signed versions v1, v2 (rank 16), v3, as rows
    only (``helpers.approved_version``): for rules over versions, under a rolled-back
    transaction. ``published`` makes the same through the real pipeline."""
    from tests.helpers import approved_version

    return {
        name: approved_version(tenant_a, "support", name, reviewer, rank=rank)
        for name, rank in (("v1", 8), ("v2", 16), ("v3", 8))
    }


@pytest.fixture
def published(s3_settings, signing_key, base_model, tenant_a, reviewer, demo_dir, transactional_db):
    """Three approved versions of tenant A's 'support' adapter: v1, v2, v3."""
    return publish_support_versions(tenant_a, reviewer, demo_dir)


# --- Celery worker ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def otlp() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP receiver for the session: the session's worker and node send it their
    traces (tests/test_tracing.py, tests/serving/node/test_node_api.py read them)."""
    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="session")
def celery_worker(django_db_setup, django_db_blocker, s3_server, otlp) -> Iterator[str]:
    """The session's Celery worker (see ``start_worker``)."""
    import redis

    broker = settings.CELERY_BROKER_URL
    if not broker.startswith("redis://"):
        pytest.fail("tests need CELERY_BROKER_URL=redis://...; run them with `make test`")
    redis.Redis.from_url(broker).flushdb()
    proc, name = start_worker(s3_server, **otlp.env)
    try:
        yield name
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def judge_beat(celery_worker, tmp_path_factory) -> Iterator[None]:
    """``celery beat`` with a 1 s tick, sending the release judge to the session's worker."""
    schedule = tmp_path_factory.mktemp("beat") / "schedule"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "lorahub",
            "beat",
            "--loglevel",
            "WARNING",
            "--schedule",
            str(schedule),
        ],
        env={**os.environ, "DATABASE_URL": child_database_url(), "LORAHUB_RELEASE_TICK_S": "1"},
        cwd=ROOT,
    )
    try:
        yield
    finally:
        stop(proc)


# --- the vLLM engine -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def demo_dir() -> Path:
    from apps.demo.assets import build_demo_assets

    return build_demo_assets(demo_dir=settings.LORAHUB_DEMO_DIR).demo_dir


@pytest.fixture(scope="session")
def engine_starting(demo_dir) -> Iterator[Future[EngineRunner]]:
    """The in-process engine's start, begun in a background thread (``engine`` waits for it;
    ``_start_engines_early`` begins it at the session's first test). Closing it ends here,
    after the serving node has stopped (see ``_start_engines_early``); ``engine`` begins it."""
    from apps.serving.node.engine import Engine, EngineSettings

    # the prefix cache on, as production may run it (test_engine.py checks it per version)
    engine_settings = dataclasses.replace(
        EngineSettings.from_django_settings(), max_loras=2, max_cpu_loras=4, prefix_caching=True
    )
    engine = Engine(engine_settings)

    def start() -> EngineRunner:
        engine.start()
        return EngineRunner(engine)

    with ThreadPoolExecutor(1, thread_name_prefix="engine-start") as pool:
        future = pool.submit(start)
        try:
            yield future
        finally:
            with contextlib.suppress(Exception):
                future.result(timeout=300).close()
            engine.shutdown()  # a no-op once the runner closed it


@pytest.fixture(scope="session")
def engine(engine_starting: Future[EngineRunner]) -> Iterator[EngineRunner]:
    """The real vLLM engine on the demo model, started once per test session.

    Small LoRA capacities (2 device slots, 4 host slots) so that tests reach the interesting
    states (full slots, eviction) with the three demo adapters and a few extras.
    """
    runner = engine_starting.result(timeout=300)
    yield runner
    runner.begin_close()


# --- the serving node ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def node_work(tmp_path_factory) -> Path:
    """The serving node's working folder: its cache config, its disk cache, its log."""
    return tmp_path_factory.mktemp("node")


@pytest.fixture(scope="session")
def session_node_starting(
    django_db_setup, s3_server, demo_dir, node_work, otlp
) -> Iterator[NodeProcess]:
    """The session node's process, spawned and not yet waited for (``session_node`` waits)."""
    # with vLLM's prefix cache on (test_node_api.py moves an alias with it), sending its traces
    node = NodeProcess(node_work, s3_server, LORAHUB_ENGINE_PREFIX_CACHING="1", **otlp.env).start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def session_node(session_node_starting: NodeProcess) -> NodeProcess:
    """A real serving node process (uvicorn + vLLM) on the test database, Redis and S3.

    Small capacities (2 device slots, 4 host slots, 4 concurrent generations, 16 waiting) so
    that tests reach full slots and overload with a handful of requests.
    """
    return session_node_starting.wait_ready()


@pytest.fixture(scope="session", autouse=True)
def _start_engines_early(request: pytest.FixtureRequest) -> None:
    """Begins the session's two long-lived engines (the session node's and the in-process
    one) at its first test, where a selected test uses them, instead of at the first test
    that needs each: a start takes 20-40 s, mostly one core's work (spawned processes
    importing torch and vLLM), which then overlaps the tests before it instead of adding
    to the run.

    The in-process engine first: fixtures end in the reverse order, so at the session's end
    the serving node stops (~7 s) between ``engine`` beginning the in-process engine's close
    (~5 s) and ``engine_starting`` waiting for it, and the two overlap."""
    needed = set().union(*(item.fixturenames for item in request.session.items))
    if "engine" in needed:
        request.getfixturevalue("engine_starting")
    if "session_node" in needed:
        request.getfixturevalue("session_node_starting")


@pytest.fixture(scope="session")
def node_url(session_node: NodeProcess) -> str:
    """The session node's address."""
    return session_node.url


@pytest.fixture(autouse=True)
def _fresh_bad_key_counts() -> Iterator[None]:
    """Each test starts with no bad API keys counted against its client address."""
    from apps.tenants import throttle

    throttle.bad_keys.cache_clear()
    throttle._anonymous_audit_limiter.cache_clear()
    yield
    throttle.bad_keys.cache_clear()
    throttle._anonymous_audit_limiter.cache_clear()


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """A fast password hasher for the test personas: Django's PBKDF2 (1,000,000 iterations)
    costs ~0.4 s per hash here, and the suite creates and signs in ~190 of them. Production
    settings keep PBKDF2; nothing in the tests is about the hash itself."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marks ``in_process_engine`` the tests that use the in-process engine and no serving
    node: ``make test`` runs them in the fault drills' lane, so that the session node's lane
    (the longest) does not start two engines at once."""
    names = getattr(item, "fixturenames", ())
    if "engine" in names and "session_node" not in names:
        item.add_marker(pytest.mark.in_process_engine)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Browser tests last (after pytest-django's own ordering): they start the serving node,
    which then reacts to every later test's alias moves and statistics, as it does for the
    node's own tests, which also run late."""
    items.sort(key=lambda item: item.get_closest_marker("browser") is not None)
