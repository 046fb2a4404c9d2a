"""Two serving nodes behind a real HAProxy on loopback: registry, affinity, spill, fan-out,
broadcast, and the node-loss drill. Every part is real: two ``runnode`` processes (each with
its vLLM engine on the demo model), HAProxy from Debian's package with the configuration
rendered from the node registry, PostgreSQL, Redis and the S3 server."""

from __future__ import annotations

import concurrent.futures
import queue
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from django.db import transaction
from django.test import Client

from apps.demo import corpus
from apps.fleet import node_registry as fleet_registry
from apps.fleet.haproxy import Backend, render
from apps.fleet.models import ServingNode
from apps.tenants import services as tenant_services
from apps.tenants.models import ApiKey
from tests.harness.processes import NODE_INTERNAL_TOKEN, NodeProcess, stop
from tests.harness.waiting import free_port, wait_for_port, wait_until
from tests.helpers import stream_completion, user_client

pytestmark = [pytest.mark.engine, pytest.mark.own_nodes]

PROMPT = corpus.completion_prompt(corpus.UNSEEN_PROMPTS[1])
V1, V2 = corpus.PHRASES["support-v1"], corpus.PHRASES["support-v2"]
CHECK_MS = 500  # HAProxy's health-check interval here: a node is out after 2 failed checks


class Router:
    """HAProxy, run in the foreground from a rendered configuration."""

    def __init__(self, work: Path) -> None:
        self.config = work / "haproxy.cfg"
        self.port = self.internal_port = 0
        self.proc: subprocess.Popen | None = None
        self.log = work / "haproxy.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def internal_url(self) -> str:
        return f"http://127.0.0.1:{self.internal_port}"

    def render(self, names: set[str]) -> None:
        """From the registry, as ``manage.py haproxy_config`` does, keeping only this test's
        nodes (the session's other test nodes register in the same database)."""
        backends = [Backend(n.name, n.url) for n in fleet_registry.routable() if n.name in names]
        assert {b.name for b in backends} == names
        self.config.write_text(
            render(
                backends,
                bind=f"127.0.0.1:{self.port}",
                internal_bind=f"127.0.0.1:{self.internal_port}",
                check_interval_ms=CHECK_MS,
            )
        )
        checked = subprocess.run(
            ["haproxy", "-c", "-f", str(self.config)], capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr

    def start(self, names: set[str], tries: int = 3) -> None:
        """Picks the ports, renders and starts. The ports are picked right before HAProxy binds
        them, and picked again when another process (the test lanes run side by side, each
        starting engines) took one in between."""
        for attempt in range(1, tries + 1):
            self.port, self.internal_port = free_port(), free_port()
            self.render(names)
            with self.log.open("ab") as log:
                printed_from = log.tell()
                self.proc = subprocess.Popen(
                    ["haproxy", "-db", "-f", str(self.config)], stdout=log, stderr=subprocess.STDOUT
                )
            try:
                wait_for_port(self.port, self.proc)
                time.sleep(0.3)  # a foreign listener answered? then HAProxy has exited by now
                if self.proc.poll() is not None:
                    raise RuntimeError(f"HAProxy exited with {self.proc.returncode}")
                return
            except RuntimeError as exc:
                printed = self.log.read_bytes()[printed_from:].decode(errors="replace")
                if attempt == tries or "cannot bind" not in printed:
                    raise RuntimeError(f"{exc}; HAProxy printed:\n{printed[-2000:]}") from exc

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


@pytest.fixture(scope="module")
def fleet(
    django_db_setup, django_db_blocker, s3_server, demo_dir, tmp_path_factory, otlp
) -> Iterator:
    """Two nodes (registered in the registry), then HAProxy rendered from the registry."""
    if shutil.which("haproxy") is None:
        pytest.fail("HAProxy is not installed; `make test` installs Debian's haproxy package")
    nodes = {
        name: NodeProcess(
            tmp_path_factory.mktemp(name),
            s3_server,
            name=name,
            LORAHUB_NODE_HEARTBEAT_S="1",
            LORAHUB_NODE_LOST_AFTER_S="3",
            # out of rotation before it stops listening: two failed checks of CHECK_MS each
            LORAHUB_NODE_DRAIN_LEAVE_S="2",
            **otlp.env,  # their traces, for the traceparent through HAProxy
        )
        for name in ("fleet-a", "fleet-b")
    }
    router = Router(tmp_path_factory.mktemp("router"))
    try:
        for node in nodes.values():
            node.start()
        for node in nodes.values():
            node.wait_ready()
        with django_db_blocker.unblock():
            registered = wait_until(
                lambda: set(ServingNode.objects.values_list("name", flat=True)) >= set(nodes),
                "both nodes registered",
            )
            assert registered
            router.start(set(nodes))
        yield {"nodes": nodes, "router": router}
    finally:
        router.stop()
        with concurrent.futures.ThreadPoolExecutor() as pool:  # each drains its engine
            left = dict(zip(nodes, pool.map(NodeProcess.stop, nodes.values()), strict=True))
    assert not any(left.values()), f"processes outlived their node: {left}"


@pytest.fixture
def world(fleet, published, tenant_a, operator, settings):
    """Tenant A's alias `support` → v1, one API key (the upload keys revoked), the console
    pointed at the router."""
    settings.LORAHUB_ROUTER_INTERNAL_URL = fleet["router"].internal_url
    settings.LORAHUB_INTERNAL_TOKEN = NODE_INTERNAL_TOKEN
    for old in ApiKey.objects.active().filter(tenant=tenant_a):
        with transaction.atomic():
            tenant_services.revoke_api_key(key=old, actor=None)
    _, key = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    control = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    point(control, published["v1"])
    return {**fleet, "key": key, "versions": published, "tenant": tenant_a, "control": control}


def point(control: Client, version_id: int) -> None:
    moved = control.put(
        "/api/aliases/support", {"version_id": version_id}, content_type="application/json"
    )
    assert moved.status_code == 200, moved.content


def operator_client() -> Client:
    return user_client("otto", "otto-pass-123")


def complete(url: str, key: str, *, model: str = "support", max_tokens: int = 8) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0},
        timeout=120,
    )


def stream(url: str, key: str, max_tokens: int, started: queue.Queue | None = None) -> dict:
    """A streamed completion; the answering node's name goes to ``started`` at its first
    chunk."""
    return stream_completion(
        url, key, prompt=PROMPT, max_tokens=max_tokens, on_first_chunk=started and started.put
    )


def test_nodes_register_themselves_and_operators_list_them(world, operator):
    client = operator_client()

    def fleet_rows() -> list[dict]:
        return [n for n in client.get("/api/nodes").json() if n["name"].startswith("fleet-")]

    # the test database was emptied after the last test: the next heartbeats write the rows
    def both_ready() -> list[dict]:
        rows = fleet_rows()
        return rows if len(rows) == 2 and all(r["state"] == "ready" for r in rows) else []

    listed = wait_until(
        both_ready,
        "both nodes registered as ready",
        on_timeout=fleet_rows,
    )
    assert {n["name"] for n in listed} == {"fleet-a", "fleet-b"}
    for row in listed:
        assert row["url"] == world["nodes"][row["name"]].url
        assert row["base_model"] == "lorahub-demo-tiny"
        assert row["base_model_revision"] == "r1"
        assert row["lora"]["max_loras"] == 2
        assert row["heartbeat_age_s"] < 3
    cache = client.get("/api/nodes/fleet-a/cache")
    assert cache.status_code == 200
    assert cache.json()["limits"]["max_loras"] == 2
    # tenants do not see the fleet
    tenant = Client(HTTP_AUTHORIZATION=f"Bearer {world['key']}")
    assert tenant.get("/api/nodes").status_code == 403


def test_requests_for_one_alias_land_on_one_node(world):
    router, key = world["router"], world["key"]
    answers = [complete(router.url, key) for _ in range(6)]
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    nodes = Counter(r.headers["x-lorahub-node"] for r in answers)
    assert len(nodes) == 1, nodes
    # after the first load the owner serves it from its engine
    assert [r.headers["x-lorahub-cache-tier"] for r in answers[1:]] == ["L1"] * 5
    assert all(r.json()["choices"][0]["text"].strip().startswith(V1) for r in answers)


def test_haproxy_passes_the_callers_traceparent_to_the_node_that_answers(world, otlp):
    import secrets

    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    answer = httpx.post(
        f"{world['router'].url}/v1/completions",
        headers={
            "Authorization": f"Bearer {world['key']}",
            "traceparent": f"00-{caller_trace}-{caller_span}-01",
        },
        json={"model": "support", "prompt": PROMPT, "max_tokens": 4, "temperature": 0},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    spans = otlp.wait_for(
        caller_trace, lambda spans: any(s.name == "lorahub.stream" for s in spans)
    )
    (server,) = [s for s in spans if s.parent_id == caller_span]
    assert server.attributes["lorahub.node"] == answer.headers["x-lorahub-node"]


def test_a_burst_on_one_alias_spreads_to_a_second_node(world):
    router, key = world["router"], world["key"]
    owner = complete(router.url, key).headers["x-lorahub-node"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        streams = list(pool.map(lambda _: stream(router.url, key, 240), range(8)))
    assert all(s["status"] == 200 and s["done"] for s in streams), streams
    served = Counter(s["node"] for s in streams)
    assert set(served) == {"fleet-a", "fleet-b"}, served
    assert served[owner] > served.most_common()[-1][1]  # the owner still takes the most


def test_alias_warm_and_evict_go_to_the_owner_only(world, operator):
    """One key, so one owner: the call goes through HAProxy's internal listener with the
    key's routing key, and only the node that key's requests land on is touched."""
    router, key = world["router"], world["key"]
    client = operator_client()
    warmed = client.post(
        "/api/nodes/warm",
        {"tenant": world["tenant"].slug, "alias": "support", "tier": "L2"},
        content_type="application/json",
    )
    assert warmed.status_code == 200, warmed.content
    results = warmed.json()["results"]
    assert len(results) == 1 and "error" not in results[0], results
    owner = results[0]["node"]
    # a request for the alias goes to the same node, and finds the version in its engine
    answer = complete(router.url, key)
    assert answer.headers["x-lorahub-node"] == owner
    assert answer.headers["x-lorahub-cache-tier"] in ("L1", "L2")
    other = next(n for n in world["nodes"].values() if n.name != owner)
    other_cache = httpx.get(
        f"{other.url}/internal/cache",
        headers={"Authorization": f"Bearer {NODE_INTERNAL_TOKEN}"},
    ).json()
    resident = {r["version_id"] for tier in other_cache["tiers"].values() for r in tier}
    assert world["versions"]["v1"] not in resident  # nothing was sent to the other node

    evicted = client.post(
        "/api/nodes/evict",
        {"tenant": world["tenant"].slug, "alias": "support", "tier": "L2"},
        content_type="application/json",
    )
    assert evicted.status_code == 200, evicted.content
    assert [r["node"] for r in evicted.json()["results"]] == [owner]


def test_an_alias_move_reaches_every_node(world):
    """The move is broadcast: each node's table follows it long before its 30 s full refresh
    (the time each took is printed), and each then answers with the new version."""
    key, nodes, tenant = world["key"], world["nodes"], world["tenant"]
    for node in nodes.values():
        assert complete(node.url, key, max_tokens=1).headers["x-lorahub-adapter"] == "support@v1"

    def serves(node: NodeProcess) -> str:
        answer = httpx.get(
            f"{node.url}/internal/alias",
            params={"tenant": tenant.slug, "alias": "support"},
            headers={"Authorization": f"Bearer {NODE_INTERNAL_TOKEN}"},
        )
        assert answer.status_code == 200, answer.text
        return answer.json()["stable"]

    assert {serves(node) for node in nodes.values()} == {"support@v1"}
    moved = time.monotonic()
    point(world["control"], world["versions"]["v2"])

    def follows(node: NodeProcess) -> float:
        while serves(node) != "support@v2":
            assert time.monotonic() - moved < 10, f"{node.name} still serves v1 after 10 s"
            time.sleep(0.005)
        return time.monotonic() - moved

    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        took = dict(zip(nodes, pool.map(follows, nodes.values()), strict=True))
    print("alias move seen by " + ", ".join(f"{n} in {t:.3f} s" for n, t in took.items()))
    for node in nodes.values():
        assert complete(node.url, key, max_tokens=1).headers["x-lorahub-adapter"] == "support@v2"


def test_node_loss_drill(world, operator):
    """Kill the owner of an alias mid-stream: its streams fail cleanly, HAProxy routes around
    it within its health checks, the alias is served by the other node; restarted, the node
    registers again and takes its aliases back."""
    router, key, nodes = world["router"], world["key"], world["nodes"]
    client = operator_client()

    def state() -> str | None:
        return {n["name"]: n["state"] for n in client.get("/api/nodes").json()}.get(owner.name)

    owner = nodes[complete(router.url, key).headers["x-lorahub-node"]]
    survivor = next(n for n in nodes.values() if n is not owner)
    # the test database was emptied after the last test: let the owner's heartbeat write its
    # row again, or there is nothing to show as lost
    wait_until(lambda: state() == "ready", "the owner's registry row")
    started: queue.Queue = queue.Queue()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        running = [pool.submit(stream, router.url, key, 460, started) for _ in range(3)]
        while started.get(timeout=60) != owner.name:  # a stream is under way on the owner
            pass
        killed = time.monotonic()
        owner.kill()
        ended = [f.result(timeout=90) for f in running]
    cut = [s for s in ended if s["node"] in (owner.name, None)]
    assert cut and not any(s["done"] for s in cut), ended  # cut short, not hung
    assert all(s["done"] for s in ended if s["node"] == survivor.name), ended
    timeline = [("streams on the killed node cut", time.monotonic() - killed)]
    # requests for the alias now land on the survivor: HAProxy retries a refused connection
    # on the next node at once, and its health checks take the dead node out
    answer = wait_until(
        lambda: (r := complete(router.url, key)).status_code == 200 and r,
        "the alias to be served again",
        timeout=10,
        every=0.05,
    )
    timeline.append(("alias served again", time.monotonic() - killed))
    assert answer.headers["x-lorahub-node"] == survivor.name
    assert answer.json()["choices"][0]["text"].strip().startswith(V1)
    wait_until(
        lambda: state() == "lost",
        "the registry to show the killed node as lost",
        on_timeout=lambda: client.get("/api/nodes").json(),
    )
    timeline.append(("registry shows it lost", time.monotonic() - killed))

    owner.start()
    timeline.append(("restarted", time.monotonic() - killed))
    owner.wait_ready()
    timeline.append(("its engine ready", time.monotonic() - killed))
    wait_until(lambda: state() == "ready", "the restarted node to register again")
    timeline.append(("registered again", time.monotonic() - killed))
    wait_until(
        lambda: complete(router.url, key).headers["x-lorahub-node"] == owner.name,
        "HAProxy to route the alias back to its owner",
        timeout=15,
        every=0.05,
    )
    timeline.append(("alias routed back to it", time.monotonic() - killed))
    print("drill: " + "; ".join(f"{what} +{t:.2f} s" for what, t in timeline))


def test_a_rolling_restart_under_streaming_load_loses_no_request(world, operator):
    """Both nodes stopped (SIGTERM) and started again, one after the other, while two clients
    stream through the router without pause: each node drains (readiness fails, the registry
    says draining, new requests get a retryable 503, its streams finish), its engine stops
    with it, and no client request fails."""
    router, key, nodes = world["router"], world["key"], world["nodes"]
    client = operator_client()
    states = lambda: {n["name"]: n["state"] for n in client.get("/api/nodes").json()}  # noqa: E731
    for node in nodes.values():
        wait_until(lambda n=node: states().get(n.name) == "ready", f"{node.name} registered")
    stop_streaming = False
    served: Counter = Counter()

    def keep_streaming(seed: int) -> list[dict]:
        ended = []
        while not stop_streaming:
            ended.append(
                stream_completion(router.url, key, prompt=PROMPT, max_tokens=48, seed=seed)
            )
            served[ended[-1]["node"]] += 1
            time.sleep(0.3)  # back to back, two clients slowed each restart to minutes
        return ended

    seen: dict[str, dict] = {}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        clients = [pool.submit(keep_streaming, seed) for seed in (1, 2)]
        try:
            wait_until(lambda: sum(served.values()) >= 4, "the clients to stream")
            for node in nodes.values():
                proc = psutil.Process(node.proc.pid)
                engine = proc.children(recursive=True)
                assert engine, f"{node.name} runs no engine process"
                node.proc.terminate()  # SIGTERM: what podman stop and Kubernetes send
                health = wait_until(
                    lambda n=node: (
                        (r := httpx.get(f"{n.url}/healthz", timeout=5)).status_code == 503 and r
                    ),
                    f"{node.name}'s readiness to fail",
                    timeout=5,
                    every=0.02,
                )
                refused = complete(node.url, key)
                seen[node.name] = {
                    "health": health.json()["status"],
                    "refused": (refused.status_code, refused.headers.get("retry-after")),
                    "code": refused.json()["error"]["code"],
                    "registry": wait_until(
                        lambda n=node: states().get(n.name) == "draining" and "draining",
                        f"the registry to show {node.name} draining",
                        timeout=5,
                        every=0.05,
                    ),
                }
                node.proc.wait(timeout=60)
                _, alive = psutil.wait_procs(engine, timeout=10)
                assert not alive, f"{node.name}'s processes outlived it: {alive}"
                node.start()
                node.wait_ready()
                # HAProxy takes it back after two passed checks (CHECK_MS apart)
                time.sleep(4 * CHECK_MS / 1000)
        finally:
            stop_streaming = True
            ended = [s for c in clients for s in c.result(timeout=180)]
    failed = [s for s in ended if s["status"] != 200 or not s["done"]]
    print(f"rolling restart: {len(ended)} streams, {len(failed)} failed, by node {dict(served)}")
    assert not failed, failed
    assert len(served) == 2, served  # the alias moved to the other node and back
    for name, what in seen.items():
        assert what["health"] == "draining", (name, what)
        assert what["refused"] == (503, "2"), (name, what)
        assert what["code"] == "node_draining", (name, what)
        assert what["registry"] == "draining", (name, what)
