"""``manage.py check --deploy``: every setting of the trust boundary that is unsafe in
production is named, with what to set instead (docs/security.md, "Threat model"). Errors stop
the images at start (their entrypoint runs the check with --fail-level ERROR); warnings are
choices an operator may make knowingly."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from lorahub.addresses import parse_networks
from lorahub.tokens import url_password


@register(Tags.security, deploy=True)
def check_trust_boundary(app_configs, **kwargs) -> list:
    found: list = []
    if settings.LORAHUB_DJANGO_ADMIN and settings.PRODUCTION:
        found.append(
            Warning(
                "LORAHUB_DJANGO_ADMIN=1: /admin/ is on in production (it obeys the console's "
                "sign-in rules, and edits rows outside the services' audit)",
                hint="unset it unless you need the admin now",
                id="lorahub.W201",
            )
        )
    for network in parse_networks(settings.LORAHUB_TRUSTED_PROXIES):
        if network.prefixlen == 0:
            found.append(
                Error(
                    f"LORAHUB_TRUSTED_PROXIES includes {network}: every caller could choose "
                    "its own address",
                    hint="name the router's addresses or network",
                    id="lorahub.E201",
                )
            )
    if settings.PRODUCTION and not settings.REQUIRE_SECOND_FACTOR:
        found.append(
            Warning(
                "LORAHUB_REQUIRE_SECOND_FACTOR=0: reviewers and operators approve, sign and "
                "promote with a password alone",
                id="lorahub.W202",
            )
        )
    if settings.LORAHUB_WEBHOOK_ALLOW_PRIVATE:
        found.append(
            Warning(
                "LORAHUB_WEBHOOK_ALLOW_PRIVATE=1: tenants' webhooks may reach private "
                "addresses, the platform's own services among them",
                id="lorahub.W203",
            )
        )
    if settings.PRODUCTION and not settings.LORAHUB_WEBHOOK_REQUIRE_HTTPS:
        found.append(
            Warning(
                "LORAHUB_WEBHOOK_REQUIRE_HTTPS=0: webhooks may go in plain HTTP", id="lorahub.W204"
            )
        )
    for name in ("CELERY_BROKER_URL", "LORAHUB_BAD_KEY_STORAGE"):
        url = getattr(settings, name)
        if settings.PRODUCTION and url.startswith("redis") and not url_password(url):
            found.append(
                Warning(
                    f"{name} names Redis without a password: anyone on its network may queue "
                    "tasks or read results",
                    hint="redis://:PASSWORD@host:6379/0, with requirepass on the server",
                    id="lorahub.W205",
                )
            )
    if settings.DATA_UPLOAD_MAX_MEMORY_SIZE is None:
        found.append(
            Error(
                "DATA_UPLOAD_MAX_MEMORY_SIZE is unbounded: one request may take the console's "
                "memory",
                hint="LORAHUB_MAX_BODY_KB",
                id="lorahub.E202",
            )
        )
    if settings.PRODUCTION and not settings.NODE_PROCESS and not settings.LORAHUB_INTERNAL_TOKEN:
        found.append(Error("LORAHUB_INTERNAL_TOKEN is not set", id="lorahub.E203"))
    internal = parse_networks(settings.LORAHUB_INTERNAL_NETWORKS, name="LORAHUB_INTERNAL_NETWORKS")
    if any(n.prefixlen == 0 for n in internal):
        found.append(
            Error(
                "LORAHUB_INTERNAL_NETWORKS includes every address: a node's control API "
                "answers anyone with the token",
                id="lorahub.E204",
            )
        )
    return found
