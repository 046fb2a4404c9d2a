"""Webhooks: signed, retried by the real worker until the receiver takes them, delivered once
per delivery id, and a release's rollback reaching a real HTTP receiver within 5 s of the
judgement that made it."""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from lorahub_client.webhooks import SignatureError, verify

from apps.registry import aliases
from apps.registry.models import AdapterVersion
from apps.releases import services as releases
from apps.releases.models import Release
from apps.telemetry import records, writers
from apps.tenants import webhooks
from apps.tenants.auth import principal_for_user
from apps.tenants.errors import Invalid
from apps.tenants.models import Webhook, WebhookDelivery
from tests.harness.waiting import wait_until
from tests.helpers import user_client


class Receiver:
    """A real HTTP receiver: answers 500 to the next ``fail`` calls, records every call, and
    processes each delivery id once, as the docs tell receivers to."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.processed: list[str] = []
        self.fail = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.calls.append(
                    {"headers": dict(self.headers), "body": body, "at": time.monotonic()}
                )
                if receiver.fail:
                    receiver.fail -= 1
                    self.send_response(500)
                    self.end_headers()
                    return
                delivery = self.headers["X-Lorahub-Delivery"]
                if delivery not in receiver.processed:
                    receiver.processed.append(delivery)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, event: str, timeout: float = 15) -> list[dict]:
        return wait_until(
            lambda: [c for c in self.calls if c["headers"]["X-Lorahub-Event"] == event],
            f"a {event} webhook",
            timeout,
            0.05,
            until=lambda found: (
                found and found[-1]["headers"]["X-Lorahub-Delivery"] in self.processed
            ),
            on_timeout=lambda: self.calls,
        )


@pytest.fixture
def receiver():
    found = Receiver()
    yield found
    found.server.shutdown()


def test_signatures_verify_and_a_changed_body_or_an_old_call_is_refused():
    body = b'{"event":"ping"}'
    now = int(time.time())
    headers = {
        "X-Lorahub-Timestamp": str(now),
        "X-Lorahub-Signature": webhooks.sign("whsec_x", now, body),
    }
    assert verify("whsec_x", headers, body) == {"event": "ping"}
    with pytest.raises(SignatureError, match="does not match"):
        verify("whsec_x", headers, body.replace(b"ping", b"pong"))
    with pytest.raises(SignatureError, match="does not match"):
        verify("another-secret", headers, body)
    with pytest.raises(SignatureError, match="outside the 300 s window"):
        verify("whsec_x", headers, body, now=now + 301)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8001/x", "http://169.254.169.254/latest", "http://10.0.0.5/"]
)
def test_a_receiver_inside_the_platform_is_refused(settings, url):
    settings.LORAHUB_WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(Invalid, match="inside a private network"):
        webhooks.resolve_receiver(url)


def test_bad_urls_and_events_are_refused_and_nothing_is_stored(settings, db, tenant_a):
    settings.LORAHUB_WEBHOOK_REQUIRE_HTTPS = True
    for url, message in (
        ("ftp://example.com/x", "is not an http(s) URL"),
        ("http://hooks.example.com/x", "must use https://"),
        ("https://user:pw@hooks.example.com/x", "no credentials"),
    ):
        with pytest.raises(Invalid, match=re.escape(message)):
            webhooks.create(tenant=tenant_a, url=url, events=[], format="lorahub", actor=None)
    with pytest.raises(Invalid, match="unknown event"):
        webhooks.create(
            tenant=tenant_a, url="https://h.example.com", events=["nope"], format="x", actor=None
        )
    with pytest.raises(Invalid, match="operators' platform-wide webhooks only"):
        webhooks.create(
            tenant=tenant_a,
            url="https://h.example.com",
            events=["node.down"],
            format="lorahub",
            actor=None,
        )
    assert not Webhook.objects.exists()


def test_a_slack_webhook_gets_text_and_the_event(db, tenant_a):
    hook = webhooks.create(
        tenant=tenant_a, url="https://hooks.slack.com/x", events=[], format="slack", actor=None
    )
    (delivery,) = webhooks.notify(
        "version.rejected", tenant=tenant_a, data={"version": "support@v9", "reason": "rank 0"}
    )
    body = json.loads(webhooks.body_of(delivery))
    assert body["text"] == (
        "lorahub: an upload was rejected (by validation or by a reviewer): support@v9 (rank 0)"
    )
    assert body["lorahub"]["event"] == "version.rejected"
    assert hook.signing_secret.startswith("whsec_")


def test_a_rollback_reaches_a_real_receiver_within_5_s_retried_once_processed_once(
    receiver, celery_worker, transactional_db, signing_key, tenant_a, reviewer
):
    from tests.helpers import approved_version

    alice = user_client("alice", "alice-pass-123")
    page = alice.post(
        "/t/tenant-a/webhooks/",
        {
            "action": "create",
            "url": receiver.url,
            "format": "lorahub",
            "events": ["release.started", "release.rolled_back"],
        },
    )
    assert page.status_code == 200
    secret = page.context["created"].signing_secret
    hook = Webhook.objects.get(tenant=tenant_a)

    # "Send a test" from the console
    alice.post("/t/tenant-a/webhooks/", {"action": "test", "webhook": hook.pk})
    ping = receiver.wait_for("ping")[0]
    assert verify(secret, ping["headers"], ping["body"])["tenant"] == "tenant-a"
    # the worker that sent it is traced (the session's OTLP receiver): nothing of its trace
    # leaves for the tenant's receiver
    sent = {name.lower() for name in ping["headers"]}
    assert not sent & {"traceparent", "tracestate", "baggage"}, sent

    versions = {v: approved_version(tenant_a, "support", v, reviewer) for v in ("v1", "v2")}
    principal = principal_for_user(get_user_model().objects.get(username="alice"))
    alias = aliases.set_alias(
        principal=principal, tenant=tenant_a, name="support", version_id=versions["v1"]
    )
    release = releases.start(
        principal=principal,
        alias=alias,
        candidate=AdapterVersion.objects.get(pk=versions["v2"]),
        plan={
            "interval_s": 1,
            "failure_threshold": 2,
            "prewarm": False,
            "canary_steps": [{"percent": 50, "dwell_s": 60, "min_requests": 3}],
        },
    )
    receiver.wait_for("release.started")
    # the worker judges a release as it starts (queue_judgement): that judgement must be over
    # before this test judges, or it holds the row ("busy") or counts the failures below too
    wait_until(
        lambda: Release.objects.get(pk=release.pk).last_judged_at,
        "the worker to judge the started release",
        60,
        0.05,
    )
    Release.objects.filter(pk=release.pk).update(
        step_started_at=timezone.now() - timedelta(seconds=2)
    )

    def record(version: str, n: int, status: int) -> None:
        writers.write_records(
            "n1",
            [
                records.RequestRecord(
                    tenant_id=tenant_a.pk,
                    alias="support",
                    adapter_id="support",
                    version=version,
                    tier="L1",
                    status=status,
                    ttft_ms=30.0,
                )
                for _ in range(n)
            ],
        )

    record("v1", 20, 200)
    record("v2", 5, 503)
    receiver.fail = 1  # the receiver's first answer to the rollback is a 500
    assert releases.judge(release.pk) == "fail"
    assert releases.judge(release.pk) == "fail"
    judged = time.monotonic()
    calls = receiver.wait_for("release.rolled_back")
    arrived = calls[-1]["at"] - judged
    print(f"\nrollback notification processed {arrived:.2f} s after the judgement")
    assert arrived < 5.0
    assert len(calls) == 2  # the 500, then the retry
    assert {c["headers"]["X-Lorahub-Delivery"] for c in calls} == {
        calls[0]["headers"]["X-Lorahub-Delivery"]
    }
    assert receiver.processed.count(calls[0]["headers"]["X-Lorahub-Delivery"]) == 1
    event = verify(secret, calls[-1]["headers"], calls[-1]["body"])
    assert event["event"] == "release.rolled_back"
    assert event["data"]["candidate"] == "support@v2"
    (gate,) = event["data"]["failed_gates"]
    assert (gate["gate"], gate["value"]) == ("canary error rate", 1.0)
    # the receiver has processed it; the worker records the answer once it has read it
    delivery = wait_until(
        lambda: WebhookDelivery.objects.filter(
            event="release.rolled_back", state=WebhookDelivery.State.DELIVERED
        ).first(),
        "the worker recording the retried delivery",
        timeout=15,
    )
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("delivered", 2, 204)

    log = alice.get("/t/tenant-a/webhooks/").content.decode()
    assert str(delivery.delivery_id) in log and "delivered" in log


def test_operators_hear_of_every_quarantine_and_of_a_node_down_once(
    db, tenant_a, reviewer, signing_key
):
    from apps.fleet import quarantine
    from apps.fleet.models import ServingNode
    from apps.fleet.tasks import watch_nodes
    from tests.helpers import approved_version

    platform = webhooks.create(
        tenant=None, url="https://ops.example.com/h", events=[], format="slack", actor=None
    )
    tenant_hook = webhooks.create(
        tenant=tenant_a, url="https://a.example.com/h", events=[], format="lorahub", actor=None
    )
    version = approved_version(tenant_a, "support", "v1", reviewer)
    now = timezone.now()
    ServingNode.objects.create(
        name="node-1", url="http://node-1:8001", engine="ready", started_at=now, heartbeat_at=now
    )
    assert quarantine.record(version_id=version, node="node-1", tier="L4", reason="sha256 differs")
    assert not WebhookDelivery.objects.filter(event="version.quarantined").exists()  # not yet
    assert quarantine.announce()  # the control plane checked it: the registry copy fails here
    heard = WebhookDelivery.objects.filter(event="version.quarantined")
    assert {d.webhook_id for d in heard} == {platform.pk, tenant_hook.pk}
    assert heard.first().payload["data"]["version"] == "support@v1"

    long_ago = timezone.now() - timedelta(hours=1)
    ServingNode.objects.create(
        name="node-7", url="http://node-7:8001", engine="ready", started_at=long_ago,
        heartbeat_at=long_ago,
    )  # fmt: skip
    assert watch_nodes() == ["node-7"]
    assert watch_nodes() == []  # told once
    down = WebhookDelivery.objects.get(event="node.down")
    assert down.webhook_id == platform.pk  # the operators', not the tenant's
    assert down.payload["data"]["node"] == "node-7" and down.payload["tenant"] is None
    ServingNode.objects.filter(name="node-7").update(heartbeat_at=timezone.now())
    watch_nodes()  # back: it may be reported again the next time it goes down
    assert ServingNode.objects.get(name="node-7").down_notified_at is None
