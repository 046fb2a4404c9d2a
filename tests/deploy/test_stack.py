"""``deploy/compose.yaml`` brought up with podman and driven as a platform team would: images
built from the Containerfiles, the CLI pushes adapters, a reviewer approves, the alias is set,
inference through the router answers with that version, a release promotes the next one; the
owning node killed, the router answers from the other; both nodes restarted in turn under two
streaming clients without a failed request; Prometheus has the nodes up; ``down`` then ``up``
keeps the data; ``down`` leaves no container.

Real parts throughout (PostgreSQL, Redis, an S3 server, HAProxy, Prometheus and the two vLLM
nodes each in their container); ``make test`` runs this alone, after every other lane
(``tools/run_tests.py``), as two engines in containers need the machine's two cores. The
figures it measured go to ``deploy/test/work/figures.json`` and the test's output.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from apps.demo import corpus
from tests.deploy.stack import (
    FIGURES,
    ROOT,
    WORK,
    Stack,
    build_images,
    run,
    stack_up,
    timed,
    wait_until,
)
from tests.helpers import stream_completion

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(3600)]

PROMPT = corpus.completion_prompt(corpus.UNSEEN_PROMPTS[1])
ADAPTERS = ROOT / "var" / "demo" / "adapters"
TENANT_SETUP = """
from apps.tenants import services as t
from apps.tenants.choices import PlatformRole, TenantRole
tenant = t.create_tenant(slug="acme", name="Acme")
alice = t.ensure_user(username="alice", password="{alice}")
t.add_member(tenant=tenant, user=alice, role=TenantRole.ADMIN)
rita = t.ensure_user(username="rita", password="{rita}")
t.grant_platform_role(user=rita, role=PlatformRole.REVIEWER)
_, key = t.issue_api_key(tenant=tenant, name="ci", actor=None)
_, admin = t.issue_api_key(tenant=tenant, name="alice's", actor=alice, admin=True)
print("KEY=" + key, "ADMIN=" + admin)
"""


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    timed("images, all", build_images)
    with stack_up() as up:
        yield up
    print("figures: " + json.dumps(FIGURES))
    assert FIGURES["left after down"] == [], "containers outlived `down`"


def cli(stack: Stack, key: str, *args: str) -> str:
    """The tenant's ``lorahub`` command line, configured from the environment as in a CI job."""
    env = {
        **os.environ,
        "LORAHUB_URL": stack.console,
        "LORAHUB_API_KEY": key,
        "LORAHUB_INFERENCE_URL": stack.router,
        "LORAHUB_CONFIG": str(WORK / "cli.json"),
    }
    return run(sys.executable, "-m", "lorahub_client.cli", *args, env=env)


def reviewer_approves(stack: Stack, password: str, version_ids: list[int]) -> None:
    """Signs in on the console as a reviewer would, sets up the second factor that production
    asks reviewers for (an authenticator app's code, computed here), then approves each
    version over REST."""
    from django_otp.oath import TOTP

    def csrf(page: httpx.Response) -> str:
        return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)

    with httpx.Client(base_url=stack.console, timeout=30) as browser:
        page = browser.get("/accounts/login/")
        signed_in = browser.post(
            "/accounts/login/",
            data={"username": "rita", "password": password, "csrfmiddlewaretoken": csrf(page)},
        )
        assert signed_in.status_code == 302, signed_in.text[:500]
        assert signed_in.headers["location"] == "/accounts/second-factor/"
        refused = browser.post(
            f"/api/versions/{version_ids[0]}/approve",
            json={"note": "no second factor yet"},
            headers={"X-CSRFToken": browser.cookies["csrftoken"]},
        )
        assert refused.status_code == 403 and refused.json()["code"] == "second_factor_required"
        setup = browser.get("/accounts/second-factor/")
        secret = re.search(r'id="totp-secret">([A-Z2-7=]+)<', setup.text).group(1)
        code = f"{TOTP(base64.b32decode(secret)).token():06d}"
        enrolled = browser.post(
            "/accounts/second-factor/",
            data={"action": "confirm", "code": code, "csrfmiddlewaretoken": csrf(setup)},
        )
        assert enrolled.status_code == 200 and "recovery-codes" in enrolled.text
        for version_id in version_ids:
            approved = browser.post(
                f"/api/versions/{version_id}/approve",
                json={"note": "reviewed in the deploy test"},
                headers={"X-CSRFToken": browser.cookies["csrftoken"]},
            )
            assert approved.status_code == 200, approved.text
            assert approved.json()["signed"] is True


def complete(stack: Stack, key: str) -> httpx.Response:
    return httpx.post(
        f"{stack.router}/v1/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "support", "prompt": PROMPT, "max_tokens": 8, "temperature": 0},
        timeout=120,
    )


def answered_by(stack: Stack, key: str, adapter: str) -> httpx.Response | None:
    answer = complete(stack, key)
    ok = answer.status_code == 200 and answer.headers.get("x-lorahub-adapter") == adapter
    return answer if ok else None


def prometheus_up(stack: Stack) -> dict[str, str]:
    targets = httpx.get(f"{stack.prometheus}/api/v1/targets", timeout=10).json()
    return {t["labels"]["instance"]: t["health"] for t in targets["data"]["activeTargets"]}


def test_the_compose_stack_serves_fails_over_restarts_without_loss_and_keeps_its_data(
    stack: Stack,
):
    started = time.monotonic()
    wait_until(
        lambda: httpx.get(f"{stack.console}/healthz", timeout=5).status_code == 200,
        "the console",
        timeout=300,
    )
    FIGURES["up to console healthy"] = round(time.monotonic() - started, 1)
    # validation accepts adapters for the base model the nodes serve: they say which once up
    for node in ("node-1", "node-2"):
        wait_until(lambda n=node: stack.node_ready(n), f"{node}'s engine", timeout=600, every=2)
    FIGURES["up to both nodes ready"] = round(time.monotonic() - started, 1)
    passwords = {"alice": "alice-" + "x" * 12, "rita": "rita-" + "y" * 12}
    out = stack.manage("shell", "-c", TENANT_SETUP.format(**passwords))
    key = out.split("KEY=")[1].split()[0]  # a member key, as a training job has
    admin = out.split("ADMIN=")[1].split()[0]  # the tenant admin's, who runs releases

    # a tenant's CI pushes two versions; a reviewer approves them on the console
    ids = []
    for version in ("v1", "v2"):
        pushed = cli(
            stack, key, "push", str(ADAPTERS / f"support-{version}"), "-a", "support",
            "--version", version, "--wait", "--json",
        )  # fmt: skip
        ids.append(json.loads(pushed)["id"])
    reviewer_approves(stack, passwords["rita"], ids)
    cli(stack, key, "alias", "set", "support", "support@v1")
    answer = wait_until(
        lambda: answered_by(stack, key, "support@v1"), "an answer from support@v1", timeout=600
    )
    FIGURES["up to first answer"] = round(time.monotonic() - started, 1)
    assert answer.json()["choices"][0]["text"].strip().startswith(corpus.PHRASES["support-v1"])

    # the trust boundary through the router: 25 bad keys (every caller here has one address)
    # cost nobody a valid key, and a node's control API is not public however it is spelled
    bad = [complete(stack, "lh_00000000_x").status_code for _ in range(25)]
    assert set(bad) <= {401, 429} and 429 in bad, bad
    assert answered_by(stack, key, "support@v1") is not None
    for path in ("/internal/cache", "/%69nternal/cache"):
        raw = httpx.Request(
            "GET", stack.router, headers={"Authorization": f"Bearer {stack.internal_token}"}
        )
        raw.url = raw.url.copy_with(raw_path=path.encode())
        assert httpx.Client().send(raw).status_code == 404, path

    # a release of v2, promoted by its controls
    cli(stack, admin, "release", "start", "support", "support@v2")
    cli(stack, admin, "release", "promote", "support")
    wait_until(lambda: answered_by(stack, key, "support@v2"), "support@v2 to answer", timeout=120)

    # the node that owns the alias is killed: the router answers from the other
    owner = complete(stack, key).headers["x-lorahub-node"]
    other = "node-2" if owner == "node-1" else "node-1"
    assert stack.node_ready(other)
    killed = time.monotonic()
    run("podman", "kill", stack.container(owner))
    answer = wait_until(
        lambda: answered_by(stack, key, "support@v2"), "the other node", timeout=30, every=0.1
    )
    FIGURES["failover after podman kill (s)"] = round(time.monotonic() - killed, 2)
    assert answer.headers["x-lorahub-node"] == other
    # podman does not restart a container it killed itself (`restart:` is for crashes)
    run("podman", "start", stack.container(owner))
    wait_until(lambda: stack.node_ready(owner), f"{owner} restarted", timeout=600, every=2)
    FIGURES["killed node back (s)"] = round(time.monotonic() - killed, 1)

    # a rolling restart of both nodes under two streaming clients
    stop = threading.Event()
    served: Counter = Counter()

    def keep_streaming(seed: int) -> list[dict]:
        ended = []
        while not stop.is_set():
            ended.append(
                stream_completion(stack.router, key, prompt=PROMPT, max_tokens=32, seed=seed)
            )
            served[ended[-1]["node"]] += 1
            # a client's pause: two clients streaming back to back saturated the 2-core test
            # machine, where a restarting node then took 200 s to start its engine
            time.sleep(0.3)
        return ended

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        clients = [pool.submit(keep_streaming, seed) for seed in (1, 2)]
        try:
            wait_until(lambda: sum(served.values()) >= 4, "the clients to stream", timeout=60)
            for node in ("node-1", "node-2"):
                restarted = time.monotonic()
                took = stack.stop_service(node)  # SIGTERM: it drains, then stops
                FIGURES[f"{node} drained and stopped (s)"] = round(took, 1)
                run("podman", "start", stack.container(node))
                wait_until(lambda n=node: stack.node_ready(n), f"{node} back", 600, every=2)
                time.sleep(3)  # HAProxy takes it back after two passed checks
                FIGURES[f"{node} restarted (s)"] = round(time.monotonic() - restarted, 1)
        finally:
            stop.set()
            ended = [s for c in clients for s in c.result(timeout=300)]
    failed = [s for s in ended if s["status"] != 200 or not s["done"]]
    FIGURES["rolling restart"] = {
        "streams": len(ended),
        "failed": len(failed),
        "by node": dict(served),
    }
    assert not failed, failed[:5]

    # Prometheus scrapes both nodes and the console
    health = wait_until(
        lambda: (h := prometheus_up(stack)) and len(h) == 3 and set(h.values()) == {"up"} and h,
        "Prometheus to have its targets up",
        timeout=120,
        every=3,
    )
    assert set(health) == {"node-1:8001", "node-2:8001", "console:8000"}

    # down, then up: the same alias version is served, from verified copies
    downed = time.monotonic()
    stack.compose("down")
    assert stack.containers() == []
    stack.compose("up", "-d")
    again = wait_until(
        lambda: answered_by(stack, key, "support@v2"), "support@v2 after up", timeout=600
    )
    FIGURES["down, up, first answer (s)"] = round(time.monotonic() - downed, 1)
    assert again.json()["choices"][0]["text"].strip().startswith(corpus.PHRASES["support-v2"])
    versions = json.loads(cli(stack, key, "versions", "list", "-a", "support", "--json"))
    assert {v["version"]: v["signed"] for v in versions} == {"v1": True, "v2": True}
