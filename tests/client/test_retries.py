"""The Python client's retries and errors against a scripted HTTP server on a real socket:
``Retry-After`` is honoured (and capped), retries are bounded, and the API's error code and
message reach the caller verbatim."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from lorahub_client import Client, NotFound, Refused, Unavailable

ME = {"username": None, "api_key": "abcd", "platform_roles": [], "tenants": []}


@pytest.fixture
def scripted() -> Iterator[tuple[str, list]]:
    """A server answering each request with the next (status, headers, body) of ``script``,
    recording the requests' paths."""
    script: list[tuple[int, dict[str, str], dict]] = []
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            status, headers, body = script.pop(0)
            raw = json.dumps(body).encode()
            self.send_response(status)
            for name, value in {**headers, "Content-Type": "application/json"}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", script, seen  # type: ignore[misc]
    finally:
        server.shutdown()
        server.server_close()


def test_retry_after_is_honoured_then_the_answer_is_read(scripted):
    url, script, seen = scripted
    busy = {"detail": "the object store is unavailable", "code": "storage_unavailable"}
    script += [(503, {"Retry-After": "2"}, busy), (429, {"Retry-After": "7"}, busy), (200, {}, ME)]
    waits: list[float] = []
    me = Client(url, "lh_x", retries=3, sleep=waits.append).me()
    assert me.api_key == "abcd"
    assert waits == [2.0, 7.0]
    assert len(seen) == 3


def test_retries_are_bounded_and_long_waits_capped(scripted):
    url, script, _ = scripted
    busy = {"detail": "too many requests", "code": "throttled"}
    script += [(429, {"Retry-After": "3600"}, busy)] * 3
    waits: list[float] = []
    with pytest.raises(Unavailable) as raised:
        Client(url, "lh_x", retries=2, max_retry_wait=5, sleep=waits.append).aliases()
    assert waits == [5.0, 5.0]
    assert "answered 429 3 times (too many requests); try again later" in str(raised.value)


def test_the_apis_error_code_and_message_reach_the_caller(scripted):
    url, script, _ = scripted
    script += [
        (409, {}, {"detail": "version '1.0' of 'support' exists", "code": "conflict"}),
        (404, {}, {"detail": "no adapter version 7 that you can see", "code": "not_found"}),
    ]
    client = Client(url, "lh_x", retries=0)
    with pytest.raises(Refused) as refused:
        client.aliases()
    assert (refused.value.status, refused.value.code) == (409, "conflict")
    assert refused.value.detail == "version '1.0' of 'support' exists"
    with pytest.raises(NotFound) as missing:
        client.version(7)
    assert missing.value.detail == "no adapter version 7 that you can see"
