"""Point 5 of the threat model: a node's control API is never reached from the public
entrance, however the path is spelled: HAProxy (real, from Debian) refuses it on the decoded
path, and a node refuses anything that entrance forwards or that comes from outside the
internal networks."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from starlette.requests import Request

from apps.fleet import haproxy
from apps.serving.node.internal_api import from_internal_network
from tests.harness.waiting import free_port, wait_until


class Backend:
    """Stands where a node stands: records each path it is asked for."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.headers: list[dict] = []
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                backend.paths.append(self.path)
                backend.headers.append(
                    {"path": self.path, **{k.lower(): v for k, v in self.headers.items()}}
                )
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"


@pytest.fixture
def router(tmp_path) -> Iterator[tuple[str, Backend]]:
    binary = shutil.which("haproxy") or shutil.which("/usr/sbin/haproxy")
    assert binary, "HAProxy is installed by `make services` (Debian's haproxy)"
    backend = Backend()
    port, internal = free_port(), free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        haproxy.render(
            [haproxy.Backend("node-1", backend.url)],
            bind=f"127.0.0.1:{port}",
            internal_bind=f"127.0.0.1:{internal}",
            check_interval_ms=200,
        )
    )
    proc = subprocess.Popen([binary, "-W", "-db", "-f", str(config)], stdout=subprocess.DEVNULL)
    try:
        wait_until(  # up, and its check has found the backend
            lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200,
            "HAProxy to come up",
            15,
            ignore=(httpx.HTTPError,),
        )
        yield f"http://127.0.0.1:{port}", backend
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        backend.server.shutdown()


@pytest.mark.parametrize(
    "path",
    [
        "/internal/cache",
        "/%69nternal/cache",
        "/%2569nternal/cache",
        "/%49NTERNAL/cache",
        "//internal/cache",
        "/v1/../internal/cache",
        "/internal%2Fcache",
    ],
)
def test_the_public_entrance_refuses_the_control_api_however_spelled(router, path):
    url, backend = router
    raw = httpx.Request("GET", url)
    raw.url = raw.url.copy_with(raw_path=path.encode())
    answer = httpx.Client().send(raw)
    assert answer.status_code == 404, (path, answer.status_code)
    assert not [p for p in backend.paths if "nternal" in p.lower()], backend.paths


def test_the_public_entrance_marks_what_it_forwards_and_sets_the_callers_address(router):
    url, backend = router
    httpx.get(f"{url}/v1/models", headers={"X-Forwarded-For": "6.6.6.6", "X-Lorahub-Entry": ""})
    (forwarded,) = [h for h in backend.headers if h["path"] == "/v1/models"]
    assert forwarded["x-forwarded-for"] == "127.0.0.1"  # what HAProxy saw, not the claim
    assert forwarded[haproxy.PUBLIC_ENTRY_HEADER.lower()] == "public"


def request(client: str, headers: dict[str, str]) -> Request:
    return Request(
        {
            "type": "http",
            "method": "GET",
            "path": "/internal/cache",
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
            "client": (client, 50000),
        }
    )


def test_a_node_answers_its_control_api_to_the_internal_network_only(settings):
    settings.LORAHUB_INTERNAL_NETWORKS = "127.0.0.0/8"
    assert from_internal_network(request("127.0.0.1", {}))
    assert not from_internal_network(request("203.0.113.9", {}))
    # through the public entrance: refused whatever the address
    assert not from_internal_network(request("127.0.0.1", {"X-Lorahub-Entry": "public"}))
    # the router's forwarded caller counts, not the router
    assert not from_internal_network(request("127.0.0.1", {"X-Forwarded-For": "203.0.113.9"}))
