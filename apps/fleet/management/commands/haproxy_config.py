from __future__ import annotations

import os
import tempfile
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.fleet import haproxy, node_registry


class Command(BaseCommand):
    help = (
        "Render HAProxy's configuration from the node registry: every node that has not "
        "stopped cleanly becomes a server (health checks keep a lost one out of rotation). "
        "Adding a node: start it (it registers itself), re-render, reload HAProxy."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("-o", "--output", type=Path, help="write here (atomically)")
        parser.add_argument("--bind", default="127.0.0.1:8080", help="the public listener")
        parser.add_argument(
            "--internal-bind",
            default="127.0.0.1:8091",
            help="the control plane's listener for /internal/* (keep it private)",
        )
        parser.add_argument(
            "--balance-factor",
            type=int,
            help="hash-balance-factor in percent; default 150 up to 4 nodes, 200 above",
        )
        parser.add_argument("--check-interval-ms", type=int, default=1000)
        parser.add_argument("--stats-socket", default="", help="HAProxy's runtime API socket")
        parser.add_argument(
            "--node",
            action="append",
            default=[],
            metavar="NAME=URL",
            help="a node to route to, instead of the registry's (repeat for each node)",
        )
        parser.add_argument(
            "--dns",
            action="store_true",
            help="resolve the nodes' host names while HAProxy runs: nodes with stable names "
            "(compose services, StatefulSet pods) join and leave with no new configuration",
        )

    def handle(self, *args, output: Path | None, node: list[str], **options) -> None:
        backends = []
        for entry in node:
            name, _, url = entry.partition("=")
            if not name or not url:
                raise CommandError(f"--node {entry!r} must look like name=http://host:port")
            backends.append(haproxy.Backend(name, url))
        if not node:
            backends = [haproxy.Backend(n.name, n.url) for n in node_registry.routable()]
        try:
            text = haproxy.render(
                backends,
                bind=options["bind"],
                internal_bind=options["internal_bind"],
                balance_factor=options["balance_factor"],
                check_interval_ms=options["check_interval_ms"],
                stats_socket=options["stats_socket"],
                dns=options["dns"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if output is None:
            self.stdout.write(text, ending="")
            return
        output.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, output)
        self.stderr.write(f"wrote {output} with {len(backends)} node(s); reload HAProxy")
