"""Point 8 of the threat model: a tenant's webhook URL must not reach inside the platform
(rebinding, proxies, IPv6 forms of private addresses), hold the worker's slots, or loop
forever; a URL that cannot be sent is refused when saved."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from apps.tenants import sealing, webhooks
from apps.tenants.errors import Invalid
from apps.tenants.models import Webhook, WebhookDelivery

pytestmark = pytest.mark.django_db

PUBLIC = "8.8.4.4"  # checked as global; the test refuses the connection itself


class Receiver:
    """A real HTTP receiver on loopback; ``drip`` makes it answer a byte a second."""

    def __init__(self, *, drip: bool = False) -> None:
        self.hits: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.hits.append(self.headers.get("Host", ""))
                self.send_response(200)
                self.end_headers()
                if drip:
                    for _ in range(30):
                        try:
                            self.wfile.write(b"x")
                            self.wfile.flush()
                        except OSError:
                            return
                        time.sleep(1)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def delivery_to(url: str, tenant) -> WebhookDelivery:
    hook = Webhook.objects.create(
        tenant=tenant, url=url, secret=sealing.seal("whsec_test"), events=[]
    )
    return WebhookDelivery.objects.create(
        webhook=hook, delivery_id=uuid.uuid4(), event="ping", payload={"summary": "x"}
    )


def test_a_name_that_rebinds_to_loopback_after_the_check_is_not_reached(
    settings, monkeypatch, tenant_a
):
    """The name answers a public address when checked, then 127.0.0.1 (DNS rebinding):
    the delivery connects to the address that was checked, never to the receiver inside."""
    settings.LORAHUB_WEBHOOK_ALLOW_PRIVATE = False
    receiver = Receiver()
    answers = iter([PUBLIC, "127.0.0.1", "127.0.0.1", "127.0.0.1"])
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.create_connection
    connected: list[str] = []

    def rebinding(host, port, *args, **kwargs):
        if host != "hooks.rebind.test":
            return real_getaddrinfo(host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

    def connect(address, *args, **kwargs):
        connected.append(address[0])
        if address[0] == PUBLIC:  # no traffic leaves this machine
            raise ConnectionRefusedError("refused by the test")
        return real_connect(address, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    monkeypatch.setattr(socket, "create_connection", connect)
    try:
        delivery = delivery_to(f"http://hooks.rebind.test:{receiver.port}/x", tenant_a)
        with pytest.raises(webhooks.DeliveryFailed):
            webhooks.attempt(delivery.pk, final=False)
    finally:
        receiver.stop()
    assert receiver.hits == []
    assert PUBLIC in connected and "127.0.0.1" not in connected
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and "ConnectError" in delivery.last_error


def test_proxy_variables_are_not_taken_from_the_environment(settings, monkeypatch, tenant_a):
    settings.LORAHUB_WEBHOOK_ALLOW_PRIVATE = True
    proxy, target = Receiver(), Receiver()
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy.port}")
    try:
        delivery = delivery_to(f"http://127.0.0.1:{target.port}/x", tenant_a)
        assert webhooks.attempt(delivery.pk, final=False) == WebhookDelivery.State.DELIVERED
    finally:
        proxy.stop()
        target.stop()
    assert proxy.hits == [] and target.hits == [f"127.0.0.1:{target.port}"]


@pytest.mark.parametrize(
    "address", ["::127.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::1", "::ffff:10.0.0.1"]
)
def test_ipv6_forms_of_private_addresses_are_refused(settings, address):
    import ipaddress

    assert webhooks.refused_because(ipaddress.ip_address(address))


def test_a_receiver_that_drips_its_answer_is_cut_off(settings, tenant_a):
    settings.LORAHUB_WEBHOOK_ALLOW_PRIVATE = True
    settings.LORAHUB_WEBHOOK_TIMEOUT_S = 2
    receiver = Receiver(drip=True)
    outcome: list[str] = []
    try:
        delivery = delivery_to(f"http://127.0.0.1:{receiver.port}/x", tenant_a)
        worker = threading.Thread(
            target=lambda: outcome.append(webhooks.attempt(delivery.pk, final=True)), daemon=True
        )
        started = time.monotonic()
        worker.start()
        worker.join(timeout=20)  # the receiver drips for 30 s
        took = time.monotonic() - started
    finally:
        receiver.stop()
    assert outcome, "the attempt was still waiting on the receiver after 20 s"
    assert took < 20


def test_webhook_deliveries_have_their_own_queue_and_a_time_limit():
    from apps.tenants.tasks import deliver_webhook
    from lorahub.celery import app

    route = app.amqp.router.route({}, deliver_webhook.name)
    assert route["queue"].name == "webhooks"
    assert deliver_webhook.time_limit and deliver_webhook.soft_time_limit


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://hooks.example.com:99999/x", "no valid port"),
        ("https://hooks.example.com:0/x", "no valid port"),
    ],
)
def test_a_url_that_cannot_be_sent_is_refused_when_saved(settings, tenant_a, url, message):
    with pytest.raises(Invalid, match=message):
        webhooks.create(tenant=tenant_a, url=url, events=[], format="lorahub", actor=None)
    assert not Webhook.objects.exists()


def test_a_delivery_that_fails_before_sending_is_recorded_and_ends(settings, tenant_a):
    delivery = delivery_to("https://hooks.example.com:99999/x", tenant_a)  # an older row
    assert webhooks.attempt(delivery.pk, final=False) == WebhookDelivery.State.FAILED
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and "no valid port" in delivery.last_error


@pytest.mark.parametrize("address", ["::ffff:0:7f00:1", "::ffff:0:a00:1", "fec0::1"])
def test_ipv4_translated_and_site_local_ipv6_are_refused(settings, address):
    """RFC 2765's IPv4-translated range and the deprecated site-local one, which Python counts
    as global."""
    import ipaddress

    assert webhooks.refused_because(ipaddress.ip_address(address))
