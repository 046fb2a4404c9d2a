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
a private, loopback or link-local network is refused at delivery (``LORAHUB_WEBHOOK_ALLOW_
PRIVATE=1`` for a platform whose receivers live there), and HTTPS is required in production.
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

from apps.tenants.errors import Invalid
from apps.tenants.models import Tenant, Webhook, WebhookDelivery

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
    "ping": "a test sent from the console",
}
PLATFORM_EVENTS = {"version.quarantined", "node.down"}


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def check_url(url: str) -> str:
    """The URL as given, or ``Invalid`` saying why it cannot be a receiver."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Invalid(f"'{url}' is not an http(s) URL, e.g. https://hooks.example.com/lorahub")
    if settings.LORAHUB_WEBHOOK_REQUIRE_HTTPS and parts.scheme != "https":
        raise Invalid("webhooks must use https:// on this platform")
    if parts.username or parts.password:
        raise Invalid("put no credentials in the URL: the signature proves the sender")
    return url.strip()


def check_address(url: str) -> None:
    """Refuse a receiver inside the platform's networks (checked at each delivery, so a name
    that is re-pointed later is caught too)."""
    if settings.LORAHUB_WEBHOOK_ALLOW_PRIVATE:
        return
    host = urlsplit(url).hostname or ""
    port = urlsplit(url).port or 443
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, port)}
    except OSError as exc:
        raise Invalid(f"the receiver's host '{host}' does not resolve: {exc}") from None
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        if not ip.is_global:
            raise Invalid(
                f"the receiver '{host}' resolves to {ip}, an address inside a private network; "
                "webhooks go to public receivers (an operator can allow private ones: "
                "LORAHUB_WEBHOOK_ALLOW_PRIVATE)"
            )


@transaction.atomic
def create(
    *, tenant: Tenant | None, url: str, events: list[str], format: str, actor: Any
) -> Webhook:
    unknown = sorted(set(events) - set(EVENTS))
    if unknown:
        raise Invalid(f"unknown event(s): {', '.join(unknown)}; known: {', '.join(EVENTS)}")
    if format not in Webhook.Format.values:
        raise Invalid(f"format must be one of {', '.join(Webhook.Format.values)}")
    if tenant is not None and "node.down" in events:
        raise Invalid("node.down goes to the operators' platform-wide webhooks only")
    hook = Webhook.objects.create(
        tenant=tenant,
        url=check_url(url),
        secret=new_secret(),
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
    from celery import current_app

    for pk in ids:
        try:  # by name: the task module imports this one
            current_app.send_task("apps.tenants.tasks.deliver_webhook", args=[pk])
        except Exception:
            logger.warning("could not queue webhook delivery %s; the sweep will", pk, exc_info=True)


def body_of(delivery: WebhookDelivery) -> bytes:
    if delivery.webhook.format == Webhook.Format.SLACK:
        payload = {"text": delivery.payload["summary"], "lorahub": delivery.payload}
    else:
        payload = delivery.payload
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


class DeliveryFailed(Exception):
    """The receiver did not take the delivery; the worker tries again later."""


def attempt(delivery_id: int, *, final: bool) -> str:
    """One attempt at a delivery: its new state. ``final``: the last attempt (failure gives up)."""
    import httpx

    delivery = WebhookDelivery.objects.select_related("webhook").filter(pk=delivery_id).first()
    if delivery is None or delivery.state != WebhookDelivery.State.PENDING:
        return delivery.state if delivery else "gone"
    hook = delivery.webhook
    body = body_of(delivery)
    timestamp = int(time.time())
    status, error = None, ""
    try:
        check_address(hook.url)
        response = httpx.post(
            hook.url,
            content=body,
            headers={
                "Content-Type": "application/json",
                "User-Agent": "lorahub-webhooks/1",
                "X-Lorahub-Event": delivery.event,
                "X-Lorahub-Delivery": str(delivery.delivery_id),
                "X-Lorahub-Timestamp": str(timestamp),
                "X-Lorahub-Signature": sign(hook.secret, timestamp, body),
            },
            timeout=settings.LORAHUB_WEBHOOK_TIMEOUT_S,
            follow_redirects=False,
        )
        status = response.status_code
        if not 200 <= status < 300:
            error = f"the receiver answered {status}: {response.text[:200]}"
    except Invalid as exc:
        error = exc.message
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
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
