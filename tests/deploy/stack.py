"""The compose stack of ``deploy/``, as the tests build and drive it with podman.

The images are the ones users build (``deploy/*.Containerfile``), on ``debian:bookworm-slim``
built here with debootstrap from the configured Debian mirror and tagged with its upstream
name; the services the compose file takes from upstream images (PostgreSQL, Redis, MinIO,
HAProxy, Prometheus) are stand-ins built from Debian's packages and PyPI, chosen by
``deploy/test/compose.test.yaml``. Every step's duration is kept in ``FIGURES`` for
``docs/deploy.md``.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import functools
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.harness.waiting import free_port
from tests.harness.waiting import wait_until as harness_wait_until

ROOT = Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"
WORK = DEPLOY / "test" / "work"
PROJECT = "lorahub-test"
BASE_IMAGE = "docker.io/library/debian:bookworm-slim"
IMAGES = {
    "control-plane": ("localhost/lorahub-control-plane:test", "deploy/control-plane.Containerfile"),
    "node": ("localhost/lorahub-node:test", "deploy/node.Containerfile"),
    "services": ("localhost/lorahub-test-services:latest", "deploy/test/services.Containerfile"),
}
CONTAINERS_CONF = """\
# lorahub's deploy tests (tests/deploy/stack.py): runc (crun refuses this machine's hybrid
# cgroups) and explicit limits
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
"""
FIGURES: dict[str, object] = {}


def run(*command: str, timeout: float = 600, check: bool = True, **kwargs) -> str:
    """A command's output; on failure, an error that carries what it printed."""
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )
    if check and done.returncode:
        raise RuntimeError(
            f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-3000:]}"
        )
    return done.stdout


def timed(name: str, fn: Callable[[], object]) -> object:
    started = time.monotonic()
    result = fn()
    FIGURES[name] = round(time.monotonic() - started, 1)
    return result


# the stack answers slowly and drops connections while it starts: a check that fails that way
# has not passed yet
wait_until = functools.partial(
    harness_wait_until, every=1.0, ignore=(httpx.HTTPError, RuntimeError)
)


# --- the machine --------------------------------------------------------------------------


def ensure_podman() -> None:
    """podman, runc and debootstrap from Debian's packages; the runtime settings above.
    iptables too: netavark sets up the containers' network with it, and without it every
    container fails to start with "netavark: No such file or directory" (seen on a fresh
    machine)."""
    tools = ("podman", "runc", "debootstrap", "iptables")
    needed = [
        tool for tool in tools if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists()
    ]
    if needed:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        run("apt-get", "update", "-qq", env=env)
        run(
            "apt-get", "install", "-y", "-qq", "podman", "runc", "netavark", "aardvark-dns",
            "debootstrap", "iptables", env=env,
        )  # fmt: skip
    conf = Path("/etc/containers/containers.conf")
    if not conf.exists() or 'runtime = "runc"' not in conf.read_text():
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(CONTAINERS_CONF)


def build_base_image() -> None:
    """``debian:bookworm-slim`` from the configured Debian mirror (debootstrap's minbase, with
    the downloaded packages and the package lists removed, as the upstream image has them)."""
    if subprocess.run(["podman", "image", "exists", BASE_IMAGE], check=False).returncode == 0:
        return
    mirror = "http://deb.debian.org/debian"
    for sources in (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")):
        if sources.exists():
            for line in sources.read_text().splitlines():
                words = line.split()
                if words and words[0] in ("URIs:", "deb") and "security" not in line:
                    mirror = next(w for w in words[1:] if w.startswith("http"))
                    break
            break
    rootfs = WORK / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    run("debootstrap", "--variant=minbase", "bookworm", str(rootfs), mirror, timeout=900)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (rootfs / junk).glob("*"):
            if path.is_file():
                path.unlink()
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    run("podman", "import", "-", BASE_IMAGE, stdin=tar.stdout)
    tar.wait()
    shutil.rmtree(rootfs, ignore_errors=True)


def prepare_build_context() -> None:
    """This machine's extra CAs (its egress proxy re-signs TLS) and its CPU torch wheel (PyPI
    has none; PyTorch's own index is not reachable here) for the builds."""
    for crt in Path("/usr/local/share/ca-certificates").glob("*.crt"):
        shutil.copy(crt, DEPLOY / "ca-certificates" / crt.name)
    lock = (DEPLOY / "requirements" / "node-cpu.txt").read_text()
    torch = next(line for line in lock.splitlines() if line.startswith("torch=="))
    version = torch.split("==")[1].split()[0]
    links = run(sys.executable, "-m", "pip", "config", "list", check=False)
    folders = [Path("/opt/wheels")] + [
        Path(item.strip("'\"")) for line in links.splitlines() if "find-links" in line
        for item in line.split("=", 1)[1].split()
    ]  # fmt: skip
    for folder in folders:
        for wheel in folder.glob(f"torch-{version}-*.whl") if folder.is_dir() else []:
            target = DEPLOY / "wheelhouse" / wheel.name
            if not target.exists():
                shutil.copy(wheel, target)


def build_images() -> None:
    """The three images at once: their builds wait on downloads more than on the CPU."""
    ensure_podman()
    WORK.mkdir(parents=True, exist_ok=True)
    timed("base image", build_base_image)
    prepare_build_context()

    def build(name: str) -> None:
        tag, containerfile = IMAGES[name]
        extra = ["--build-arg", "TORCH_INDEX="] if name == "node" else []
        command = ["podman", "build", "--network", "host", "-f", containerfile, "-t", tag]
        timed(f"build {name}", lambda: run(*command, *extra, ".", cwd=ROOT, timeout=1800))
        FIGURES[f"size {name}"] = image_size(tag)

    with concurrent.futures.ThreadPoolExecutor(len(IMAGES)) as pool:
        for done in [pool.submit(build, name) for name in IMAGES]:
            done.result()


def image_size(tag: str) -> str:
    return run("podman", "image", "inspect", tag, "--format", "{{.Size}}").strip()


# --- the stack ------------------------------------------------------------------------------


def process_tree(root: int) -> str:
    """``ps`` lines of ``root`` and everything below it (a container's processes, seen from
    the host)."""
    lines = run("ps", "-e", "-o", "pid=,ppid=,stat=,etime=,args=", check=False).splitlines()
    rows = {int(line.split()[0]): (int(line.split()[1]), line) for line in lines if line.strip()}
    tree, level = [root], [root]
    while level:
        level = [pid for pid, (ppid, _) in rows.items() if ppid in level]
        tree += level
    return "\n".join(rows[pid][1][:200] for pid in tree if pid in rows)


@dataclass
class Stack:
    console_port: int = field(default_factory=free_port)
    router_port: int = field(default_factory=free_port)
    prometheus_port: int = field(default_factory=free_port)
    internal_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    @property
    def console(self) -> str:
        return f"http://127.0.0.1:{self.console_port}"

    @property
    def router(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    @property
    def prometheus(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    def write_env(self) -> None:
        built = ROOT / "var" / "demo" / "base-model"
        assert built.is_dir(), "the demo model is missing: `make demo` builds it"
        # readable by the images' user (uid 10001), as an operator's model folder must be
        demo_model = WORK / "base-model"
        shutil.rmtree(demo_model, ignore_errors=True)
        shutil.copytree(built, demo_model)
        for path in [demo_model, *demo_model.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        values = {
            "LORAHUB_SECRET_KEY": secrets.token_urlsafe(50),
            "LORAHUB_INTERNAL_TOKEN": self.internal_token,
            "LORAHUB_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "POSTGRES_PASSWORD": secrets.token_urlsafe(16),
            "LORAHUB_NODE_DB_PASSWORD": secrets.token_urlsafe(16),
            "REDIS_PASSWORD": secrets.token_urlsafe(16),
            "LORAHUB_FIELD_KEYS": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
            "REDIS_NODE_PASSWORD": secrets.token_urlsafe(16),
            "S3_ACCESS_KEY": "lorahub",
            "S3_SECRET_KEY": secrets.token_urlsafe(16),
            "S3_NODE_ACCESS_KEY": "lorahub-node",
            "S3_NODE_SECRET_KEY": secrets.token_urlsafe(16),
            "LORAHUB_MODEL_DIR": str(demo_model),
        }
        (WORK / "test.env").write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        self.env = {
            **os.environ,
            **values,
            "LORAHUB_ENV_FILE": str(WORK / "test.env"),
            "LORAHUB_CONTROL_PLANE_IMAGE": IMAGES["control-plane"][0],
            "LORAHUB_NODE_IMAGE": IMAGES["node"][0],
            "LORAHUB_CONSOLE_PUBLISH": f"127.0.0.1:{self.console_port}",
            "LORAHUB_ROUTER_PUBLISH": f"127.0.0.1:{self.router_port}",
            "LORAHUB_PROMETHEUS_PUBLISH": f"127.0.0.1:{self.prometheus_port}",
        }

    def compose(self, *args: str, timeout: float = 900) -> str:
        return run(
            sys.executable, "-m", "podman_compose", "-p", PROJECT,
            "-f", str(DEPLOY / "compose.yaml"), "-f", str(DEPLOY / "test" / "compose.test.yaml"),
            *args, env=self.env, cwd=DEPLOY, timeout=timeout,
        )  # fmt: skip

    def container(self, service: str) -> str:
        return f"{PROJECT}_{service}_1"

    def containers(self) -> list[str]:
        out = run(
            "podman", "ps", "-a", "--format", "{{.Names}}",
            "--filter", f"label=io.podman.compose.project={PROJECT}",
        )  # fmt: skip
        return out.split()

    def manage(self, *args: str) -> str:
        return run("podman", "exec", self.container("console"), "python", "manage.py", *args)

    def node_ready(self, service: str) -> bool:
        probe = "import urllib.request as u; u.urlopen('http://127.0.0.1:8001/healthz', timeout=3)"
        done = subprocess.run(
            ["podman", "exec", self.container(service), "python", "-c", probe],
            capture_output=True,
            check=False,
        )
        return done.returncode == 0

    def stop_service(self, service: str, timeout_s: int = 90) -> float:
        """``podman stop`` (SIGTERM, SIGKILL after ``timeout_s``); the seconds it took. If the
        container outlives the SIGTERM, the error lists what was still running in it."""
        container = self.container(service)
        host_pid = run("podman", "inspect", container, "--format", "{{.State.Pid}}").strip()
        started = time.monotonic()
        stopping = subprocess.Popen(
            ["podman", "stop", "-t", str(timeout_s), container],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        seen: list[str] = []
        while stopping.poll() is None:
            if time.monotonic() - started > timeout_s - 15:
                seen.append(process_tree(int(host_pid)))
            time.sleep(5)
        if stopping.returncode:
            raise RuntimeError(
                f"podman stop {container}: {stopping.stdout.read()}; still running:\n"
                + "\n".join(seen[-2:])
            )
        return time.monotonic() - started

    def logs_of(self, container: str, lines: int = 40) -> str:
        return subprocess.run(
            ["podman", "logs", "--tail", str(lines), container],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        ).stdout


@contextlib.contextmanager
def stack_up() -> Iterator[Stack]:
    stack = Stack()
    stack.write_env()
    with contextlib.suppress(RuntimeError):  # what an interrupted run left
        stack.compose("down", "-v", "-t", "5")
    try:
        started = time.monotonic()
        stack.compose("up", "-d")
        FIGURES["compose up returned"] = round(time.monotonic() - started, 1)
        yield stack
    finally:
        logs = WORK / "logs"
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir()
        for name in stack.containers():  # what each part said, for a failure's reader
            (logs / f"{name}.log").write_text(stack.logs_of(name, lines=5000))
        stack.compose("down", "-v")
        FIGURES["left after down"] = stack.containers()
        (WORK / "figures.json").write_text(json.dumps(FIGURES, indent=2))
