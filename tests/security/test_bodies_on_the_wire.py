"""The console's body bounds hold on a real socket, before Django reads the body.

Django's ASGI handler spools a whole body to a temporary file before any middleware runs, so
a bound checked by middleware came after the bytes were on disk (and multipart was exempt):
an anonymous multi-GB POST filled the disk. Django's test client skips that path, so these
tests talk to the console as production serves it (uvicorn on ``lorahub.asgi``) over a
socket, and send only part of what they announce: the answer must come before the rest.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.harness.processes import ROOT, child_database_url, stop
from tests.harness.waiting import free_port, wait_for_port

pytestmark = pytest.mark.django_db(transaction=True)

BODY_KB = 64
UPLOAD_MB = 2


@pytest.fixture
def console() -> Iterator[int]:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": child_database_url(),
        "LORAHUB_MAX_BODY_KB": str(BODY_KB),
        "LORAHUB_MAX_UPLOAD_MB": str(UPLOAD_MB),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "lorahub.asgi:application", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc, timeout=60)
        yield port
    finally:
        stop(proc)


def send(port: int, head: str, body_part: bytes = b"") -> tuple[int, bytes]:
    """Send ``head`` and ``body_part`` (often less than announced), then wait for the answer:
    its status and body. A server that waits for the whole announced body never answers
    within the socket's timeout, and the test fails."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # the server may answer and close while the body is still going out
        with contextlib.suppress(OSError):
            sock.sendall(head.encode() + b"\r\n" + body_part)
        answer = b""
        try:
            while not _complete(answer):
                got = sock.recv(65536)
                if not got:
                    break
                answer += got
        except TimeoutError:
            pass
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line, "no answer: the server waited for the whole body"
    return int(status_line.split()[1]), rest.split(b"\r\n\r\n", 1)[-1]


def _complete(answer: bytes) -> bool:
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def test_an_announced_body_over_the_limit_is_refused_before_it_is_sent(console):
    # 20 GB announced, none of it sent: the answer comes from the header alone
    status, body = send(
        console,
        "POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 20000000000\r\n",
    )
    assert status == 413
    assert f"limit of {BODY_KB} KiB" in body.decode()


def test_a_chunked_body_is_cut_off_when_the_bytes_pass_the_limit(console):
    status, body = send(
        console,
        "POST /api/aliases/x/canary HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n",
        body_part=b"".join(
            b"%x\r\n%s\r\n" % (16384, b"1" * 16384) for _ in range(BODY_KB // 16 + 2)
        ),
    )
    assert status == 413
    assert b"body_too_large" in body


def test_multipart_is_bounded_too_and_uploads_by_their_own_limit(console):
    multipart = "Content-Type: multipart/form-data; boundary=b\r\n"
    # anonymous multipart to the sign-in page: the ordinary body limit
    status, body = send(
        console,
        "POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"{multipart}Content-Length: 5000000\r\n",
    )
    assert status == 413 and f"limit of {BODY_KB} KiB".encode() in body
    # an upload with a key: its own, larger bound, still enforced before the bytes arrive
    upload = (
        "POST /api/adapters/support/versions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer lh_x_y\r\n{multipart}"
    )
    status, body = send(console, upload + f"Content-Length: {(UPLOAD_MB + 2) << 20}\r\n")
    assert status == 413 and f"limit of {UPLOAD_MB} MiB".encode() in body
    # under its bound, the upload reaches the API, which refuses the made-up key, not the size
    form = (
        b'--b\r\nContent-Disposition: form-data; name="files"; filename="adapter_config.json"'
        b"\r\nContent-Type: application/octet-stream\r\n\r\n" + b"0" * 300_000 + b"\r\n--b--\r\n"
    )
    status, body = send(console, upload + f"Content-Length: {len(form)}\r\n", form)
    assert status in (401, 403) and b"body_too_large" not in body, body
