from __future__ import annotations

import os
import secrets
import shutil
import signal
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from apps.fleet import haproxy
from lorahub.supervise import Supervisor


class Command(BaseCommand):
    help = (
        "Run the whole product on this machine: the web console, a Celery worker and the "
        "serving node. With --nodes N: N serving nodes behind HAProxy (adapter-affinity "
        "routing), as a fleet runs in production. Ctrl-C stops everything."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--console-port", type=int, default=8000)
        parser.add_argument("--node-port", type=int, default=settings.LORAHUB_NODE_PORT)
        parser.add_argument("--nodes", type=int, default=1, help="serving nodes to run")
        parser.add_argument("--router-port", type=int, default=8080, help="HAProxy's port")
        parser.add_argument(
            "--router-internal-port", type=int, default=8091, help="HAProxy's internal port"
        )

    def handle(
        self,
        *args,
        console_port: int,
        node_port: int,
        nodes: int,
        router_port: int,
        router_internal_port: int,
        **options,
    ) -> None:
        if nodes < 1:
            raise CommandError("--nodes must be at least 1")
        haproxy_bin = shutil.which("haproxy")
        if nodes > 1 and haproxy_bin is None:
            raise CommandError(
                "--nodes > 1 runs the nodes behind HAProxy, which is not installed: "
                "apt-get install haproxy (or `make run NODES=3`, which installs it)"
            )
        python = sys.executable
        manage = str(settings.BASE_DIR / "manage.py")
        env = {**os.environ, "LORAHUB_NODE_PORT": str(node_port)}
        # The console reads the node's cache and warms/evicts through the node's internal API;
        # without a token of the operator's, one is made for this run and shared by both.
        env.setdefault("LORAHUB_INTERNAL_TOKEN", secrets.token_urlsafe(32))
        if nodes > 1:
            env["LORAHUB_ROUTER_INTERNAL_URL"] = f"http://127.0.0.1:{router_internal_port}"
        commands = self._control_plane(python, console_port)
        node_envs: dict[str, dict[str, str]] = {}
        backends = []
        for i in range(nodes):
            name = settings.LORAHUB_NODE_NAME if nodes == 1 else f"node-{i + 1}"
            port = node_port + i
            commands[name] = [python, manage, "runnode", "--port", str(port)]
            node_envs[name] = {
                "LORAHUB_NODE_NAME": name,
                "LORAHUB_NODE_PORT": str(port),
                **(
                    {"LORAHUB_NODE_CACHE_DIR": str(settings.LORAHUB_NODE_CACHE_DIR / name)}
                    if nodes > 1
                    else {}
                ),
            }
            backends.append(haproxy.Backend(name, f"http://127.0.0.1:{port}"))
        if nodes > 1:
            config = settings.VAR_DIR / "haproxy.cfg"
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(
                haproxy.render(
                    backends,
                    bind=f"127.0.0.1:{router_port}",
                    internal_bind=f"127.0.0.1:{router_internal_port}",
                )
            )
            commands["haproxy"] = [str(haproxy_bin), "-W", "-db", "-f", str(config)]
        supervisor = Supervisor(
            {name: (cmd, {**env, **node_envs.get(name, {})}) for name, cmd in commands.items()},
            cwd=settings.BASE_DIR,
        )
        # Ctrl-C and SIGTERM both stop everything, even when a shell started us with SIGINT
        # ignored (a background job) or a supervisor stops us with SIGTERM.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            # Each child in its own session: Ctrl-C reaches only this process, which then stops
            # the children in order (SIGTERM: the node drains requests and shuts the engine
            # down). A child that exits is restarted with a backoff; the others keep running.
            supervisor.start_all()
            lines = self._banner(console_port, backends, nodes, router_port)
            self.stdout.write("\n".join([*lines, "Ctrl-C stops everything.", ""]))
            supervisor.run()
        except KeyboardInterrupt:
            self.stdout.write("\nstopping console, worker, nodes and router...")
        finally:
            # a node drains before it stops (LORAHUB_NODE_DRAIN_*): give it that long
            supervisor.stop_all(
                grace_s=settings.LORAHUB_NODE_DRAIN_LEAVE_S
                + settings.LORAHUB_NODE_DRAIN_TIMEOUT_S
                + 30
            )

    @staticmethod
    def _control_plane(python: str, console_port: int) -> dict[str, list[str]]:
        """The console and the worker (with the beat)."""
        return {
            "console": [
                python,
                "-m",
                "uvicorn",
                "lorahub.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(console_port),
                # the caller's address is read by lorahub/addresses.py alone
                "--no-proxy-headers",
            ],
            "worker": [
                python,
                "-m",
                "celery",
                "-A",
                "lorahub",
                "worker",
                "--loglevel",
                "INFO",
                "--concurrency",
                "2",
                # the periodic jobs (the stale-validation sweep): one worker here, so it may
                # carry the scheduler; production runs `celery -A lorahub beat` once
                "--beat",
                "--schedule",
                str(settings.VAR_DIR / "celerybeat-schedule"),
            ],
        }

    @staticmethod
    def _banner(
        console_port: int, backends: list[haproxy.Backend], nodes: int, router_port: int
    ) -> list[str]:
        lines = [
            "",
            "lorahub is starting:",
            f"  console        http://127.0.0.1:{console_port}/",
            f"  REST API docs  http://127.0.0.1:{console_port}/api/docs",
        ]
        for backend in backends:
            lines.append(
                f"  serving node   {backend.url}/healthz ({backend.name}; 503 until its "
                "engine is ready, ~30 s)"
            )
        if nodes > 1:
            lines.append(
                f"  inference      http://127.0.0.1:{router_port}/v1/ (HAProxy, routed by "
                "API key and model)"
            )
        return lines
