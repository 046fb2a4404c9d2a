from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = (
        "Run the whole product on this machine: the web console, a Celery worker and the "
        "serving node. Ctrl-C stops all three."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--console-port", type=int, default=8000)
        parser.add_argument("--node-port", type=int, default=settings.LORAHUB_NODE_PORT)

    def handle(self, *args, console_port: int, node_port: int, **options) -> None:
        python = sys.executable
        manage = str(settings.BASE_DIR / "manage.py")
        env = {**os.environ, "LORAHUB_NODE_PORT": str(node_port)}
        # The console reads the node's cache and warms/evicts through the node's internal API;
        # without a token of the operator's, one is made for this run and shared by both.
        env.setdefault("LORAHUB_INTERNAL_TOKEN", secrets.token_urlsafe(32))
        commands = {
            "console": [
                python,
                "-m",
                "uvicorn",
                "lorahub.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(console_port),
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
            ],
            "node": [python, manage, "runnode", "--port", str(node_port)],
        }
        procs: dict[str, subprocess.Popen] = {}
        # Ctrl-C and SIGTERM both stop everything, even when a shell started us with SIGINT
        # ignored (a background job) or a supervisor stops us with SIGTERM.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            for name, cmd in commands.items():
                # Own session: Ctrl-C reaches only this process, which then stops the children
                # in order (SIGTERM: the node drains requests and shuts the engine down).
                procs[name] = subprocess.Popen(
                    cmd, env=env, cwd=settings.BASE_DIR, start_new_session=True
                )
            self.stdout.write(
                "\nlorahub is starting:\n"
                f"  console        http://127.0.0.1:{console_port}/\n"
                f"  REST API docs  http://127.0.0.1:{console_port}/api/docs\n"
                f"  serving node   http://127.0.0.1:{node_port}/healthz "
                "(503 until the engine is ready, ~30 s)\n"
                "Ctrl-C stops everything.\n"
            )
            while True:
                for name, proc in procs.items():
                    if proc.poll() is not None:
                        raise CommandError(f"{name} exited with status {proc.returncode}")
                time.sleep(0.5)
        except KeyboardInterrupt:
            self.stdout.write("\nstopping console, worker and node...")
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            for proc in procs.values():
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
