"""How long an alias move takes to reach a serving node: the latency the tests only bound.

One run: a node on a throwaway SQLite control plane (embedded defaults: the node polls a
change marker every 0.5 s) serves tenant acme's alias ``support``. The alias is moved back
and forth between two versions ``--moves`` times through the registry's service; after each
move a client sends greedy completions back to back until the answer is the new version's.
Printed: the time from the move's commit to the first answer from the new version
(p50/p95/max), and, as the baseline measured in the same run, one request's latency (the
finest step the client can see a change with).

With ``--events redis://…`` the node listens for the registry's broadcast instead (what the
test suite and a production install run).

Usage: .venv/bin/python bench/alias_moves.py [--moves 20] [--events redis://127.0.0.1:6379/13]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.node_overhead import pct, prepare, start_node  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moves", type=int, default=20)
    parser.add_argument(
        "--events", default="", help="a Redis URL: broadcast changes instead of polling"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lorahub-alias-moves-") as tmp:
        env, key, alias = prepare(Path(tmp))
        if args.events:  # both sides: this process publishes, the node listens
            from django.conf import settings

            settings.LORAHUB_EVENTS_URL = env["LORAHUB_EVENTS_URL"] = args.events
        import httpx
        from django.contrib.auth.models import User

        from apps.demo import corpus
        from apps.registry import aliases
        from apps.registry.models import AdapterVersion
        from apps.tenants.auth import principal_for_user
        from apps.tenants.models import Tenant

        acme = Tenant.objects.get(slug="acme")
        owner = principal_for_user(User.objects.get(username="alice"))
        versions = list(
            AdapterVersion.objects.filter(adapter__tenant=acme, adapter__adapter_id="support")
            .order_by("pk")
            .values_list("pk", flat=True)[:2]
        )
        phrases = [corpus.PHRASES["support-v1"], corpus.PHRASES["support-v2"]]
        node, url = start_node(env)
        body = {
            "model": alias,
            "prompt": corpus.completion_prompt(corpus.UNSEEN_PROMPTS[1]),
            "max_tokens": 12,
            "temperature": 0,
        }
        moves, requests = [], []
        try:
            with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:

                def answer() -> str:
                    started = time.perf_counter()
                    text = client.post(f"{url}/v1/completions", json=body).json()
                    if "choices" not in text:
                        raise SystemExit(f"the node refused: {text}")
                    requests.append((time.perf_counter() - started) * 1000)
                    return text["choices"][0]["text"].strip()

                answer()  # the first use loads the adapter
                for i in range(args.moves):
                    target = (i + 1) % 2
                    aliases.set_alias(
                        principal=owner, tenant=acme, name=alias, version_id=versions[target]
                    )
                    moved = time.perf_counter()
                    while not answer().startswith(phrases[target]):
                        if time.perf_counter() - moved > 30:
                            raise SystemExit("the node never served the moved alias")
                    moves.append((time.perf_counter() - moved) * 1000)
        finally:
            node.terminate()
            node.wait(timeout=60)
    how = f"Redis broadcast ({args.events})" if args.events else "embedded defaults: polling"
    print(f"\nalias moves reaching one node ({how}), {args.moves} moves\n")
    print(f"{'':<34}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}")
    for label, values in (
        ("one request (baseline)", requests),
        ("move committed -> new version", moves),
    ):
        print(
            f"{label:<34}{statistics.median(values):>9.1f}{pct(values, 0.95):>9.1f}"
            f"{max(values):>9.1f}"
        )


if __name__ == "__main__":
    main()
