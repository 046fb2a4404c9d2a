"""The caller's address, defined once for the console and the nodes.

Behind a router (HAProxy, an ingress) every connection comes from the router, so the caller's
address is in ``X-Forwarded-For``, which anyone can also write. The rule, as in RFC 7239's
advice and uvicorn's and Werkzeug's proxy fixes: the header is read only when the connection
comes from a configured proxy (``LORAHUB_TRUSTED_PROXIES``), and then from the *right*, past
every trusted hop; the first untrusted address is the caller. The left-most value is the
client's own claim and is never believed. ``*`` (trust anyone) is refused at start-up.

The servers' own proxy handling is off (uvicorn's ``proxy_headers``, gunicorn's
``--forwarded-allow-ips``): the console reads its caller through ``CallerAddressMiddleware``,
the node through ``caller_address``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(raw: str, *, name: str = "LORAHUB_TRUSTED_PROXIES") -> tuple[Network, ...]:
    """``"127.0.0.1, 10.89.0.0/16, ::1"`` → networks; ``*`` and bad entries are refused."""
    networks = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        if item == "*":
            raise ImproperlyConfigured(
                f"{name}='*' would let every caller choose its own address (X-Forwarded-For "
                "is written by the client): name the router's addresses or network instead, "
                "e.g. 10.89.0.0/16"
            )
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not an IP address or network (e.g. 10.0.0.0/8)"
            ) from None
    return tuple(networks)


def _address(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    value = value.strip().strip('"')
    if value.startswith("["):  # "[::1]:8080"
        value = value[1:].partition("]")[0]
    elif value.count(":") == 1:  # "10.0.0.1:8080"
        value = value.partition(":")[0]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def is_in(value: str, networks: Iterable[Network]) -> bool:
    address = _address(value)
    return address is not None and any(address in network for network in networks)


def caller_address(
    peer: str, forwarded_for: Iterable[str], trusted: Iterable[Network] | None = None
) -> str:
    """The caller behind ``peer``: ``X-Forwarded-For`` (every header line, in order) walked
    from the right past trusted proxies. A malformed hop ends the walk at that hop's sender,
    so a client cannot smuggle an address past it."""
    trusted = tuple(trusted_proxies() if trusted is None else trusted)
    if not is_in(peer, trusted):
        return peer
    hops = [hop.strip() for line in forwarded_for for hop in line.split(",") if hop.strip()]
    caller = peer
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:
            return caller
        caller = str(address)
        if not is_in(caller, trusted):
            return caller
    return caller


def trusted_proxies() -> tuple[Network, ...]:
    return parse_networks(settings.LORAHUB_TRUSTED_PROXIES)


def internal_networks() -> tuple[Network, ...]:
    return parse_networks(settings.LORAHUB_INTERNAL_NETWORKS, name="LORAHUB_INTERNAL_NETWORKS")


class CallerAddressMiddleware:
    """The console's ``REMOTE_ADDR`` becomes the caller's address (first, before anything
    reads it: django-axes' lockout, the bad-key throttle, the audit)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # X-Forwarded-Proto by the same rule: only a trusted router says the scheme was HTTPS
        # (Django's SECURE_PROXY_SSL_HEADER reads it); anyone else's header is dropped
        if "HTTP_X_FORWARDED_PROTO" in request.META and not is_in(
            request.META.get("REMOTE_ADDR", ""), trusted_proxies()
        ):
            del request.META["HTTP_X_FORWARDED_PROTO"]
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR")
        if forwarded:
            request.META["REMOTE_ADDR"] = caller_address(
                request.META.get("REMOTE_ADDR", ""), [forwarded]
            )
        return self.get_response(request)
