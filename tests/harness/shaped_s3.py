"""An S3 server whose fetches cost what the seeds' do: moto in a network namespace of its own,
reached over a veth pair whose two ends are shaped with ``tc … tbf`` (this kernel has no
``netem``), and a first-byte delay on every request like a real GET's.

    with ShapedS3(rate_mbit=10_000, first_byte_ms=30) as s3:
        s3.endpoint  # http://10.x.y.2:9000, reachable from this host only
        s3.floors()  # what the harness achieved: first byte (ms) and MB/s for one object

``stop`` (or leaving the ``with``) ends the server and deletes the namespace, which takes
the veth pair and both qdiscs with it: nothing is left behind. Needs root (``ip netns``).

``python -m tests.harness.shaped_s3 serve --host H --port P --first-byte-ms D`` is the
server itself, started inside the namespace.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent


def _ip(*args: str, netns: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*prefix, *args], check=True, capture_output=True, text=True)


def namespaces() -> list[str]:
    """The network namespaces this harness created that still exist."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith("lh-s3-")]


class ShapedS3:
    def __init__(self, *, rate_mbit: int = 10_000, first_byte_ms: float = 30.0) -> None:
        self.rate_mbit, self.first_byte_ms = rate_mbit, first_byte_ms
        tag = uuid.uuid4().hex[:6]
        self.netns = f"lh-s3-{tag}"
        self._host_if, self._peer_if = f"lhs3h{tag}", f"lhs3p{tag}"
        subnet = int(tag, 16) % 250 + 1  # 10.237.<subnet>.0/30
        self._host_ip, self._s3_ip = f"10.237.{subnet}.1", f"10.237.{subnet}.2"
        self.endpoint = f"http://{self._s3_ip}:9000"
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> ShapedS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ShapedS3:
        try:
            _ip("ip", "netns", "add", self.netns)
            _ip("ip", "link", "add", self._host_if, "type", "veth", "peer", "name", self._peer_if)
            _ip("ip", "link", "set", self._peer_if, "netns", self.netns)
            _ip("ip", "addr", "add", f"{self._host_ip}/30", "dev", self._host_if)
            _ip("ip", "link", "set", self._host_if, "up")
            _ip("ip", "addr", "add", f"{self._s3_ip}/30", "dev", self._peer_if, netns=self.netns)
            _ip("ip", "link", "set", self._peer_if, "up", netns=self.netns)
            _ip("ip", "link", "set", "lo", "up", netns=self.netns)
            # both directions: uploads leave the host's end, downloads the namespace's
            # a bucket of one kernel tick's bytes (HZ 250), the least tbf can keep the rate with
            burst = max(self.rate_mbit * 125_000 // 250, 32 * 1024)
            shape = ["root", "tbf", "rate", f"{self.rate_mbit}mbit", "burst", str(burst),
                     "latency", "100ms"]  # fmt: skip
            _ip("tc", "qdisc", "add", "dev", self._host_if, *shape)
            _ip("tc", "qdisc", "add", "dev", self._peer_if, *shape, netns=self.netns)
            self._proc = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, sys.executable, "-m",
                 "tests.harness.shaped_s3", "serve", "--host", self._s3_ip, "--port", "9000",
                 "--first-byte-ms", str(self.first_byte_ms)],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(
                    f"the S3 server in {self.netns} exited ({self._proc.returncode})"
                )
            with contextlib.suppress(OSError), socket.create_connection((self._s3_ip, 9000), 0.5):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the S3 server in {self.netns} did not listen within {timeout:.0f} s")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        # the namespace takes its end of the pair with it, and the pair the host's end
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("ip", "netns", "del", self.netns)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("ip", "link", "del", self._host_if)

    def client(self, **env: str) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=env.get("key", "testing"),
            aws_secret_access_key=env.get("secret", "testing"),
            region_name="us-east-1",
            config=Config(retries={"max_attempts": 1}),
        )

    def floors(self, size_mb: int = 64, tries: int = 3) -> dict[str, float]:
        """What the harness achieved: the median first byte of a small GET (ms) and the best
        MB/s of a ``size_mb`` object (first byte to last), over ``tries``."""
        s3 = self.client()
        bucket = f"floors-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(Bucket=bucket)
        try:
            s3.put_object(Bucket=bucket, Key="small", Body=b"x")
            s3.put_object(Bucket=bucket, Key="big", Body=os.urandom(size_mb << 20))
            first, rates = [], []
            for _ in range(tries):
                started = time.perf_counter()
                s3.get_object(Bucket=bucket, Key="small")["Body"].read()
                first.append((time.perf_counter() - started) * 1000)
                body = s3.get_object(Bucket=bucket, Key="big")["Body"]
                began = time.perf_counter()
                got = len(body.read())
                rates.append(got / (1 << 20) / (time.perf_counter() - began))
            return {"first_byte_ms": sorted(first)[len(first) // 2], "mb_per_s": max(rates)}
        finally:
            for key in ("small", "big"):
                s3.delete_object(Bucket=bucket, Key=key)
            s3.delete_bucket(Bucket=bucket)


def delayed(app: Callable, seconds: float) -> Callable:
    """A WSGI app that answers ``seconds`` later than ``app``: a real GET's first byte."""

    def wrapped(environ: dict, start_response: Callable) -> Iterable[bytes]:
        time.sleep(seconds)
        return app(environ, start_response)

    return wrapped


def serve(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="shaped_s3 serve")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--first-byte-ms", type=float, default=30.0)
    args = parser.parse_args(argv)
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import run_simple

    os.environ.setdefault("MOTO_PORT", str(args.port))
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(args.host, args.port, delayed(app, args.first_byte_ms / 1000), threaded=True)


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"]:
        sys.exit("usage: python -m tests.harness.shaped_s3 serve --host H --port P")
    serve(sys.argv[2:])
