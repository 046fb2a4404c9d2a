"""Notifications: per-tenant webhooks (release events, quarantines, rejected uploads, reviews)
and platform-wide ones for operators (every quarantine, a node down).

``notify`` stores one delivery per interested webhook inside the caller's transaction and
queues it when that commits; the worker (``tasks.deliver_webhook``) posts it and retries with
backoff until the receiver answers 2xx, so each event arrives at least once. Each request says:

- ``X-Lorahub-Event``: the event, e.g. ``release.rolled_back``;
- ``X-Lorahub-Delivery``: the delivery's id, the same on every attempt: a receiver that has
  seen it already drops it (idempotency);
- ``X-Lorahub-Timestamp``: Unix seconds when this attempt was signed;
- ``X-Lorahub-Signature``: ``sha256=`` + hex HMAC-SHA256 of ``"<timestamp>.<body>"`` with the
  webhook's secret. A receiver recomputes it, compares in constant time, and refuses a
  timestamp older than ``REPLAY_WINDOW_S`` (``lorahub_client.webhooks.verify`` does all three).

The URL is the tenant's, so it must not reach inside the platform: an address that resolves to
a private, loopback or link-local network (or an IPv6 form of one) is refused at delivery
(``LORAHUB_WEBHOOK_ALLOW_PRIVATE=1`` for a platform whose receivers live there), the connection
goes to the address that was checked, no proxy is taken from the environment, and HTTPS is
required in production. Deliveries run on their own Celery queue (``webhooks``) with a time
limit, so a slow receiver never holds the slots that judge releases.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import secrets
import socket
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.tenants import sealing
from apps.tenants.errors import Invalid
from apps.tenants.models import Tenant, Webhook, WebhookDelivery
from lorahub import queueing, tracing

logger = logging.getLogger(__name__)
REPLAY_WINDOW_S = 300
# every event a webhook may ask for; "platform" ones reach the operators' webhooks too
EVENTS = {
    "release.started": "a release started",
    "release.step": "a release moved to its next canary step",
    "release.promoted": "a release promoted its candidate",
    "release.rolled_back": "a release rolled back (the failing gate and its value)",
    "release.aborted": "a release was aborted by hand",
    "version.quarantined": "a node quarantined a version (its bytes differ from the signed)",
    "version.rejected": "an upload was rejected (by validation or by a reviewer)",
    "version.approved": "a reviewer approved and signed a version",
    "node.down": "a serving node stopped heartbeating or its engine died (operators only)",
    "second_factor.changed": "a user set up a second factor or made new recovery codes "
    "(operators only)",
    "ping": "a test sent from the console",
}
PLATFORM_EVENTS = {"version.quarantined", "node.down", "second_factor.changed"}
OPERATOR_ONLY_EVENTS = {"node.down", "second_factor.changed"}


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def check_url(url: str) -> str:
    """The URL as given, or ``Invalid`` saying why it cannot be a receiver (checked when it is
    saved, so a URL that could never be sent is never stored)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Invalid(f"'{url}' is not an http(s) URL, e.g. https://hooks.example.com/lorahub")
    if settings.LORAHUB_WEBHOOK_REQUIRE_HTTPS and parts.scheme != "https":
        raise Invalid("webhooks must use https:// on this platform")
    if parts.username or parts.password:
        raise Invalid("put no credentials in the URL: the signature proves the sender")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise Invalid(f"'{url}' has no valid port: a port is a number from 1 to 65535")
    try:
        parts.hostname.encode("idna")
    except UnicodeError:
        raise Invalid(f"'{parts.hostname}' is not a valid host name") from None
    return url.strip()


# IPv6 ranges that carry an IPv4 address, or tunnel to one, which Python counts as global:
# a receiver there may reach 127.0.0.1 or a private network through the translation
_TRANSLATED = [
    ipaddress.ip_network(n)
    for n in (
        "::/96",
        "::ffff:0:0:0/96",  # IPv4-translated (RFC 2765): not the mapped range Python knows
        "64:ff9b::/96",
        "64:ff9b:1::/48",
        "2002::/16",
        "2001::/32",
    )
]
# site-local (RFC 3879 deprecated it, so Python counts it global), still routed inside sites
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")


def refused_because(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """Why ``ip`` may not receive webhooks, or "" if it may."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return refused_because(ip.ipv4_mapped)
        if any(ip in net for net in _TRANSLATED):
            return "an IPv6 address that stands for an IPv4 one (IPv4-compatible, NAT64, 6to4)"
        if ip in _SITE_LOCAL:
            return "an address inside a private network (IPv6 site-local)"
    if not ip.is_global:
        return "an address inside a private network"
    return ""


def resolve_receiver(url: str) -> str:
    """The one address a delivery connects to: the receiver's name resolved once, each of its
    addresses checked (unless private receivers are allowed). The connection is pinned to it,
    so a name that resolves elsewhere a moment later (DNS rebinding) changes nothing."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise Invalid(f"the receiver's host '{host}' does not resolve: {exc}") from None
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    if not settings.LORAHUB_WEBHOOK_ALLOW_PRIVATE:
        for ip in addresses:
            if reason := refused_because(ip):
                raise Invalid(
                    f"the receiver '{host}' resolves to {ip}, {reason}; webhooks go to public "
                    "receivers (an operator can allow private ones: LORAHUB_WEBHOOK_ALLOW_PRIVATE)"
                )
    if not addresses:
        raise Invalid(f"the receiver's host '{host}' has no address")
    return str(addresses[0])


@transaction.atomic
def create(
    *, tenant: Tenant | None, url: str, events: list[str], format: str, actor: Any
) -> Webhook:
    unknown = sorted(set(events) - set(EVENTS))
    if unknown:
        raise Invalid(f"unknown event(s): {', '.join(unknown)}; known: {', '.join(EVENTS)}")
    if format not in Webhook.Format.values:
        raise Invalid(f"format must be one of {', '.join(Webhook.Format.values)}")
    if tenant is not None and OPERATOR_ONLY_EVENTS & set(events):
        names = ", ".join(sorted(OPERATOR_ONLY_EVENTS & set(events)))
        raise Invalid(f"{names}: the operators' platform-wide webhooks only")
    hook = Webhook.objects.create(
        tenant=tenant,
        url=check_url(url),
        secret=sealing.seal(new_secret()),
        events=sorted(set(events)),
        format=format,
        created_by=actor if actor is not None and actor.is_authenticated else None,
    )
    from apps.tenants.services import record_event

    record_event(
        action="webhook.create",
        obj=hook,
        actor=actor,
        tenant=tenant,
        after={"url": hook.url, "events": hook.events, "format": hook.format},
    )
    return hook


def summary_of(event: str, data: dict) -> str:
    """One line a person reads in Slack or an e-mail."""
    subject = data.get("version") or data.get("alias") or data.get("node") or ""
    what = EVENTS.get(event, event)
    detail = data.get("reason") or data.get("outcome") or data.get("note") or ""
    return f"lorahub: {what}: {subject}" + (f" ({detail})" if detail else "")


def notify(event: str, *, tenant: Tenant | None, data: dict) -> list[WebhookDelivery]:
    """Store a delivery for each webhook that wants ``event`` (the tenant's, and the
    platform's for platform events) and queue them once the caller's transaction commits."""
    scope = Q(tenant=tenant) if tenant is not None else Q(pk__in=[])
    if event in PLATFORM_EVENTS:
        scope |= Q(tenant__isnull=True)
    deliveries = []
    at = timezone.now()
    for hook in Webhook.objects.filter(scope, active=True):
        if not hook.wants(event):
            continue
        delivery_id = uuid.uuid4()
        payload = {
            "id": str(delivery_id),
            "event": event,
            "at": at.isoformat(),
            "tenant": tenant.slug if tenant is not None else None,
            "summary": summary_of(event, data),
            "data": data,
        }
        deliveries.append(
            WebhookDelivery.objects.create(
                webhook=hook, delivery_id=delivery_id, event=event, payload=payload
            )
        )
    ids = [d.pk for d in deliveries]
    if ids:
        transaction.on_commit(lambda: queue(ids))
    return deliveries


def queue(ids: list[int]) -> None:
    """Hand deliveries to the worker; one that cannot be queued now is picked up by the
    sweep (``sweep_webhooks``), so a broker outage delays a notification but loses none."""
    for pk in ids:  # by name: the task module imports this one
        queueing.send("apps.tenants.tasks.deliver_webhook", pk)


def body_of(delivery: WebhookDelivery) -> bytes:
    if delivery.webhook.format == Webhook.Format.SLACK:
        payload = {"text": delivery.payload["summary"], "lorahub": delivery.payload}
    else:
        payload = delivery.payload
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


class DeliveryFailed(Exception):
    """The receiver did not take the delivery; the worker tries again later."""


# how much of a receiver's answer is read: enough for an error message, never its memory
MAX_ANSWER_BYTES = 64 * 1024


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    """POST to the receiver at its checked address (Host and TLS name kept), with no proxy but
    ``LORAHUB_WEBHOOK_PROXY`` and no redirects, within ``LORAHUB_WEBHOOK_TIMEOUT_S`` in all:
    the status and the start of the answer. A receiver that drips its answer is cut off."""
    import httpx

    parts = urlsplit(url)
    address = resolve_receiver(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    pinned = parts._replace(netloc=f"[{address}]:{port}" if ":" in address else f"{address}:{port}")
    limit_s = settings.LORAHUB_WEBHOOK_TIMEOUT_S
    deadline = time.monotonic() + limit_s
    extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
    with (
        # no trace header to a tenant's receiver, and no span of its URL
        tracing.untraced(),
        httpx.Client(
            trust_env=False,
            proxy=settings.LORAHUB_WEBHOOK_PROXY or None,
            timeout=httpx.Timeout(limit_s),
            follow_redirects=False,
        ) as client,
        client.stream(
            "POST",
            pinned.geturl(),
            content=body,
            headers={**headers, "Host": parts.netloc},
            extensions=extensions,
        ) as response,
    ):
        answer = b""
        for chunk in response.iter_raw():
            answer += chunk
            if len(answer) >= MAX_ANSWER_BYTES or time.monotonic() > deadline:
                break
        return response.status_code, answer[:200].decode("utf-8", "replace")


def attempt(delivery_id: int, *, final: bool) -> str:
    """One attempt at a delivery: its new state. ``final``: the last attempt (failure gives up).
    Every attempt is recorded, one that fails before anything is sent too; a delivery whose
    URL can never be sent ends at once instead of being tried again."""
    import httpx

    delivery = WebhookDelivery.objects.select_related("webhook").filter(pk=delivery_id).first()
    if delivery is None or delivery.state != WebhookDelivery.State.PENDING:
        return delivery.state if delivery else "gone"
    hook = delivery.webhook
    body = body_of(delivery)
    timestamp = int(time.time())
    status, error, hopeless = None, "", False
    try:
        check_url(hook.url)
    except Invalid as exc:
        error, hopeless = f"this URL cannot be sent to: {exc.message}", True
    if not error:
        try:
            status, answer = post(
                hook.url,
                body,
                {
                    "Content-Type": "application/json",
                    "User-Agent": "lorahub-webhooks/1",
                    "X-Lorahub-Event": delivery.event,
                    "X-Lorahub-Delivery": str(delivery.delivery_id),
                    "X-Lorahub-Timestamp": str(timestamp),
                    "X-Lorahub-Signature": sign(hook.signing_secret, timestamp, body),
                },
            )
            if not 200 <= status < 300:
                error = f"the receiver answered {status}: {answer}"
        except Invalid as exc:
            error = exc.message
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        except Exception as exc:  # whatever it was, it is recorded, and the worker goes on
            logger.warning("webhook delivery %s failed before sending", delivery.pk, exc_info=True)
            error, hopeless = f"{type(exc).__name__}: {exc}"[:300], True
    return _record(delivery, status, error, final=final or hopeless)


def _record(delivery: WebhookDelivery, status: int | None, error: str, *, final: bool) -> str:
    now = timezone.now()
    delivered = not error
    state = (
        WebhookDelivery.State.DELIVERED
        if delivered
        else WebhookDelivery.State.FAILED
        if final
        else WebhookDelivery.State.PENDING
    )
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        attempts=delivery.attempts + 1,
        last_status=status,
        last_error=error,
        last_attempt_at=now,
        delivered_at=now if delivered else None,
        state=state,
    )
    if not delivered and not final:
        raise DeliveryFailed(error)
    return state


def send_test(hook: Webhook) -> WebhookDelivery:
    """The console's "Send a test": a ``ping`` to this webhook alone."""
    with transaction.atomic():
        delivery_id = uuid.uuid4()
        delivery = WebhookDelivery.objects.create(
            webhook=hook,
            delivery_id=delivery_id,
            event="ping",
            payload={
                "id": str(delivery_id),
                "event": "ping",
                "at": timezone.now().isoformat(),
                "tenant": hook.tenant.slug if hook.tenant else None,
                "summary": "lorahub: a test from the console: this webhook works",
                "data": {},
            },
        )
        transaction.on_commit(lambda: queue([delivery.pk]))
    return delivery
