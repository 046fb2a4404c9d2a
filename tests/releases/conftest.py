"""Fixtures of the release drills: the judge on a real beat (a tick of 1 s), callers' traffic
to the session node, and helpers to read the node's cache and follow a release."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

import httpx

from apps.demo import corpus
from tests.harness.processes import NODE_INTERNAL_TOKEN
from tests.harness.waiting import wait_until

QUESTION = corpus.UNSEEN_PROMPTS[1]


@dataclass
class Answer:
    at: float  # time.time()
    status: int
    adapter: str
    text: str


@dataclass
class Traffic:
    """Callers of the alias, one request at a time from each thread, each with its own
    request key (so that a canary split applies), greedy."""

    url: str
    key: str
    threads: int = 1
    answers: list[Answer] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._workers = [
            threading.Thread(target=self._run, daemon=True) for _ in range(self.threads)
        ]

    def _run(self) -> None:
        with httpx.Client(
            base_url=self.url, timeout=60, headers={"Authorization": f"Bearer {self.key}"}
        ) as client:
            while not self._stop.is_set():
                response = client.post(
                    "/v1/completions",
                    json={
                        "model": "support",
                        "prompt": corpus.completion_prompt(QUESTION),
                        "max_tokens": 8,
                        "temperature": 0,
                        "user": uuid.uuid4().hex,
                    },
                )
                body = response.json() if response.status_code == 200 else {}
                self.answers.append(
                    Answer(
                        time.time(),
                        response.status_code,
                        response.headers.get("x-lorahub-adapter", ""),
                        (body.get("choices") or [{}])[0].get("text", "").strip(),
                    )
                )
                time.sleep(0.05)

    def __enter__(self) -> Traffic:
        for worker in self._workers:
            worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=60)


def node_cache(url: str) -> dict[str, set[int]]:
    """The version ids in each of the node's tiers."""
    tiers = httpx.get(
        f"{url}/internal/cache", headers={"Authorization": f"Bearer {NODE_INTERNAL_TOKEN}"}
    ).json()["tiers"]
    return {
        tier: {row["version_id"] for row in rows}
        for tier, rows in tiers.items()
        if tier != "loading"
    }


def inject(url: str, version_id: int, **fault: object) -> None:
    """The node's test seam: this version's requests fail (``error=True``) or answer late."""
    response = httpx.post(
        f"{url}/internal/test-seams/faults",
        json={"version_id": version_id, **fault},
        headers={"Authorization": f"Bearer {NODE_INTERNAL_TOKEN}"},
    )
    assert response.status_code == 200, response.text


def followed(client, release_id: int, states: tuple[str, ...], seconds: float = 120) -> dict:
    """The release once it reaches one of ``states`` (fails after ``seconds``, with its
    timeline)."""
    return wait_until(
        lambda: client.get(f"/api/releases/{release_id}").json(),
        f"release {release_id} to reach {' or '.join(states)}",
        seconds,
        0.2,
        until=lambda release: release["state"] in states,
        describe=lambda release: f"{release['state']}: {release['last_check']}\n{_events(release)}",
    )


def event_of(client, release_id: int, kind: str, seconds: float = 60) -> dict:
    """The release's first event of ``kind``, once it is recorded: a rollback's ``cooled``
    comes after the state has changed, once the nodes have let the candidate go."""
    release = wait_until(
        lambda: client.get(f"/api/releases/{release_id}").json(),
        f"a {kind} event of release {release_id}",
        seconds,
        0.2,
        until=lambda release: any(e["kind"] == kind for e in release["events"]),
        describe=lambda release: f"{release['state']}\n{_events(release)}",
    )
    return next(e for e in release["events"] if e["kind"] == kind)


def _events(release: dict) -> str:
    """The release's events, one a line, for a failing wait's message."""
    return "\n".join(f"{e['kind']} {e['to_state']} {e['note']}" for e in release["events"])


def timeline(release: dict) -> str:
    lines = []
    for event in release["events"]:
        gates = ", ".join(
            f"{g['gate']}={g['value']} ({g['verdict']}, {g['op']} {g['threshold']})"
            for g in event["gates"]
        )
        lines.append(
            f"  {event['at'][11:23]} {event['kind']:8} {event['to_state']:12} "
            f"{event['note'][:90]} {gates}"
        )
    return "\n".join(lines)
