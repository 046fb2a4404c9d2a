"""The fleet's pure parts: the routers of the fleet simulation, the rendered HAProxy
configuration (checked by the real ``haproxy -c``), and the node registry's states."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections import Counter
from datetime import timedelta

import numpy as np
import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from apps.fleet import haproxy
from apps.fleet import node_registry as registry
from apps.fleet.models import ServingNode
from apps.serving.replay import fleet, traces
from apps.serving.replay.simulate import Capacity, simulate
from apps.tenants.models import AuditEvent
from tests.helpers import key_client, user_client


@pytest.fixture(scope="module")
def trace() -> traces.Trace:
    return traces.zipf(requests=4000, world=traces.World(200, 10, "uniform", 3), rate=20.0)


def test_consistent_hashing_sends_each_adapter_to_one_node(trace):
    nodes = fleet.route(trace, "consistent", 4, service_s=1.0, speedup=1.0)
    owners: dict[int, set[int]] = {}
    for key, node in zip(trace.keys, nodes, strict=True):
        owners.setdefault(key, set()).add(int(node))
    assert all(len(o) == 1 for o in owners.values())
    assert len({next(iter(o)) for o in owners.values()}) == 4  # every node owns some


def test_adding_a_node_moves_only_the_keys_it_takes_over():
    before, after = fleet.Ring(4), fleet.Ring(5)
    keys = [f"t{i % 7}/a{i}" for i in range(2000)]
    moved = [k for k in keys if next(before.walk(k)) != next(after.walk(k))]
    assert all(next(after.walk(k)) == 4 for k in moved)  # only to the new node
    assert 0.1 < len(moved) / len(keys) < 0.3  # about 1/5 of the keys


def test_bounded_loads_never_exceed_the_bound(trace):
    factor, nodes, service = 1.25, 4, 2.0
    assignment = fleet.route(trace, f"bounded-{factor}", nodes, service_s=service, speedup=1.0)
    finishing: list[tuple[float, int]] = []
    load = Counter()
    for at, node in zip(trace.at, assignment, strict=True):
        for done in [f for f in finishing if f[0] <= at]:
            finishing.remove(done)
            load[done[1]] -= 1
        bound = math.ceil(factor * (sum(load.values()) + 1) / nodes)
        assert load[int(node)] < bound
        load[int(node)] += 1
        finishing.append((at + service, int(node)))


def test_round_robin_is_even_and_consistent_hashing_beats_it(trace):
    capacity = Capacity(l1_slots=2, l2_slots=8)
    rr = fleet.simulate(trace, router="round-robin", nodes=4, capacity=capacity, service_s=1.0)
    ch = fleet.simulate(trace, router="consistent", nodes=4, capacity=capacity, service_s=1.0)
    assert rr.imbalance == pytest.approx(1.0, abs=0.001)
    assert ch.hit_rate > rr.hit_rate + 0.1
    assert sum(ch.per_node) == ch.requests == len(trace)


def test_one_node_fleet_is_the_single_node_replay(trace):
    capacity = Capacity(l1_slots=2, l2_slots=8)
    one = fleet.simulate(trace, router="bounded-1.5", nodes=1, capacity=capacity)
    alone = simulate(trace, "weighted", capacity)
    assert (one.hits, one.local) == (alone.hits, alone.hits + alone.tiers["L3"])
    pooled = fleet.pooled(capacity, 3)
    assert (pooled.l1_slots, pooled.l2_slots, pooled.l3_bytes) == (6, 24, None)


def test_bad_router_names_are_refused(trace):
    with pytest.raises(ValueError, match="router must be one of"):
        fleet.route(trace, "random", 2, service_s=1.0, speedup=1.0)
    with pytest.raises(ValueError, match=r"at least 1\.0"):
        fleet.route(trace, "bounded-0.5", 2, service_s=1.0, speedup=1.0)


# --- HAProxy's configuration -------------------------------------------------------------------


def _backends(n: int) -> list[haproxy.Backend]:
    return [haproxy.Backend(f"node-{i}", f"http://10.0.0.{i}:8001") for i in range(1, n + 1)]


def test_the_rendered_configuration_is_valid_haproxy(tmp_path):
    if shutil.which("haproxy") is None:
        pytest.fail("HAProxy is not installed; `make test` installs Debian's haproxy package")
    path = tmp_path / "haproxy.cfg"
    path.write_text(haproxy.render(_backends(3), stats_socket=str(tmp_path / "admin.sock")))
    checked = subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    text = path.read_text()
    assert "hash-type consistent" in text
    assert "hash-balance-factor 150" in text  # 3 nodes: the tighter default
    assert "hash-balance-factor 200" in haproxy.render(_backends(8))


def test_server_ids_do_not_depend_on_the_other_nodes():
    def ids(text: str) -> dict[str, str]:
        rows = [line.split() for line in text.splitlines() if line.strip().startswith("server ")]
        return {row[1]: row[row.index("id") + 1] for row in rows}

    three, four = ids(haproxy.render(_backends(3))), ids(haproxy.render(_backends(4)))
    assert {name: four[name] for name in three} == three


@pytest.mark.parametrize(
    ("url", "message"),
    [("https://n:8001", "http://host:port"), ("http://n", "http://host:port")],
)
def test_node_addresses_haproxy_cannot_use_are_refused(url, message):
    with pytest.raises(ValueError, match=message):
        haproxy.render([haproxy.Backend("n", url)])
    with pytest.raises(ValueError, match="above 100"):
        haproxy.render(_backends(2), balance_factor=90)


# --- the node registry -------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_node_is_ready_then_lost_then_stopped(settings):
    """(The session's own node may be registered too: it starts at the session's first test,
    as another node of a real fleet would be there. Only n1 is looked at.)"""
    started = timezone.now()
    identity = registry.Identity(name="n1", url="http://127.0.0.1:9001", max_loras=4)

    def state() -> list[str]:
        return [row["state"] for row in registry.listing() if row["name"] == "n1"]

    def routable() -> list[str]:
        return [n.name for n in registry.routable() if n.name == "n1"]

    registry.heartbeat(identity, engine="starting", started_at=started)
    assert state() == ["starting"]
    registry.heartbeat(identity, engine="ready", started_at=started)
    assert state() == ["ready"]
    ServingNode.objects.filter(name="n1").update(
        heartbeat_at=timezone.now() - timedelta(seconds=settings.LORAHUB_NODE_LOST_AFTER_S + 1)
    )
    assert state() == ["lost"]
    assert routable() == ["n1"]  # health checks keep it out
    registry.deregister("n1", started_at=started - timedelta(seconds=1))  # an older run's stop
    assert state() == ["lost"]
    registry.deregister("n1", started_at=started)
    assert state() == ["stopped"]
    assert routable() == []
    restarted = timezone.now()
    registry.heartbeat(identity, engine="starting", started_at=restarted)
    assert state() == ["starting"]  # the same row again, not a second one


def test_route_draws_are_reproducible(trace):
    a = fleet.route(trace, "bounded-1.25", 3, service_s=1.0, speedup=2.0)
    b = fleet.route(trace, "bounded-1.25", 3, service_s=1.0, speedup=2.0)
    assert np.array_equal(a, b)


# --- the console's and the REST API's view of the fleet -----------------------------------------


def _register(name: str, *, lost: bool = False) -> None:
    started = timezone.now()
    registry.heartbeat(
        registry.Identity(name=name, url="http://127.0.0.1:9", base_model="demo", max_loras=2),
        engine="ready",
        started_at=started,
    )
    if lost:
        ServingNode.objects.filter(name=name).update(heartbeat_at=started - timedelta(minutes=5))


@pytest.mark.django_db
def test_the_nodes_page_lists_the_registry_with_each_state(operator, settings):
    settings.LORAHUB_NODES = []
    settings.LORAHUB_INTERNAL_TOKEN = "token"
    _register("gpu-1")
    _register("gpu-2", lost=True)
    page = user_client("otto", "otto-pass-123").get("/operator/nodes/").content.decode()
    fleet_table = page[page.index('id="fleet"') : page.index("</table>")]
    assert 'data-node="gpu-1"' in fleet_table and "badge-ok" in fleet_table
    assert 'data-node="gpu-2"' in fleet_table and ">lost<" in fleet_table
    # a lost node is not called (its age: 300 s before the test, plus the test's own time)
    assert re.search(r"no heartbeat for 3\d\d s", page)
    assert "node &#x27;gpu-1&#x27; did not answer" in page  # a registered one is


@pytest.mark.django_db
def test_alias_actions_name_what_was_wrong_and_record_what_was_done(
    operator, tenant_a, settings, caplog
):
    settings.LORAHUB_NODES = []
    settings.LORAHUB_INTERNAL_TOKEN = "token"
    settings.LORAHUB_ROUTER_INTERNAL_URL = ""
    _register("gpu-1")
    otto = user_client("otto", "otto-pass-123")
    missing = otto.post(
        "/api/nodes/warm", {"tenant": "tenant-a", "alias": "nope"}, content_type="application/json"
    )
    assert missing.status_code == 404
    assert "tenant 'tenant-a' has no alias 'nope'" in missing.json()["detail"]
    bad_tier = otto.post(
        "/api/nodes/warm",
        {"tenant": "tenant-a", "alias": "nope", "tier": "L9"},
        content_type="application/json",
    )
    assert bad_tier.status_code == 422
    answer = otto.post("/operator/fleet/warm", {"tenant": "tenant-a", "alias": "x", "tier": "L2"})
    assert answer.status_code == 302
    followed = otto.get(answer["Location"]).content.decode()
    assert "tenant &#x27;tenant-a&#x27; has no alias &#x27;x&#x27;" in followed
    assert not AuditEvent.objects.filter(action="alias.warm").exists()
    tenant = key_client(tenant_a)
    assert tenant.get("/api/nodes").status_code == 403
    # refused for who it is, before its body is read: not told what is wrong with the body
    refused = tenant.post("/api/nodes/warm", {}, content_type="application/json")
    assert refused.status_code == 403, refused.content
    assert refused.json()["detail"] == "only an operator may do this"


@pytest.mark.django_db
def test_haproxy_config_renders_the_registry_without_stopped_nodes(tmp_path):
    started = timezone.now()
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        registry.heartbeat(
            registry.Identity(name=name, url=f"http://10.0.0.{len(name)}:8001"),
            engine="ready",
            started_at=started,
        )
    ServingNode.objects.filter(name="gpu-b").update(url="http://10.0.0.2:8001")
    registry.deregister("gpu-c", started_at=started)
    out = tmp_path / "haproxy.cfg"
    call_command("haproxy_config", output=out, bind="0.0.0.0:80", balance_factor=175)
    text = out.read_text()
    servers = [line.split()[1:3] for line in text.splitlines() if "    server " in line]
    # (the session's own node may be registered too: only this test's nodes are looked at)
    ours = [server for server in servers if server[0].startswith("gpu-")]
    assert ours == [["gpu-a", "10.0.0.5:8001"], ["gpu-b", "10.0.0.2:8001"]]
    assert "bind 0.0.0.0:80" in text and "hash-balance-factor 175" in text
    ServingNode.objects.filter(name="gpu-a").update(url="https://gpu-a")
    with pytest.raises(CommandError, match="must look like http://host:port"):
        call_command("haproxy_config", output=out)
    assert out.read_text() == text  # a refused render leaves the file as it was
