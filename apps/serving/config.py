"""The adapter-cache configuration in force, and an operator's changes to it at run time.

The node's YAML file (``LORAHUB_CACHE_CONFIG``) is the default. An operator's ``PUT
/api/cache-config`` stores a complete replacement (validated first, so nothing invalid is
ever stored), audits it, and broadcasts it: every node applies what it can at once (policy,
TTL, disk cap, memory caps, load queue, prewarm list) and reports the rest — the LoRA slot
counts, the rank and the base model — as waiting for a node restart.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, transaction

from apps.serving.cache.device_budget import device_budget_problem
from apps.serving.models import CacheSettings
from apps.tenants.errors import Invalid
from apps.tenants.events import publish_change
from apps.tenants.services import record_event
from lorahub.cacheconfig import CacheConfig, load_cache_config, parse_cache_config

if TYPE_CHECKING:
    from apps.tenants.auth import Principal

logger = logging.getLogger(__name__)
SETTINGS_ID = 1


def file_config() -> CacheConfig:
    return load_cache_config(settings.LORAHUB_CACHE_CONFIG)


def stored_config() -> CacheConfig | None:
    row = CacheSettings.objects.filter(pk=SETTINGS_ID).first()
    if row is None:
        return None
    return parse_cache_config(row.data, source="the stored cache config")


def effective_config() -> CacheConfig:
    """The operator's stored configuration if there is one, else the file's.

    A database that cannot be read (a node starting before migrations ran) means the file.
    """
    try:
        return stored_config() or file_config()
    except DatabaseError:
        logger.warning(
            "cannot read the stored cache config; using %s", settings.LORAHUB_CACHE_CONFIG
        )
        return file_config()


@transaction.atomic
def set_config(*, data: object, principal: Principal | None) -> tuple[CacheConfig, list[str]]:
    """Validate and store a complete configuration; return it and the settings that wait
    for a node restart. Raises ``Invalid`` naming each bad key; nothing is stored then.
    ``principal``: the operator (with a second factor where the platform asks for one), or
    None for the platform's own seeding."""
    if principal is not None:
        principal.require_operator()
        principal.require_second_factor("changing the cache tiers' capacities")
    actor = principal.user if principal is not None else None
    try:
        config = parse_cache_config(data, source="cache config")
    except ImproperlyConfigured as exc:
        raise Invalid(str(exc)) from None
    # (checked here too when the base model is readable: a node would refuse to restart)
    problem = device_budget_problem(
        config, settings.LORAHUB_BASE_MODEL_DIR, settings.LORAHUB_ENGINE_DTYPE
    )
    if problem:
        raise Invalid(f"cache config: {problem}")
    before = effective_config()
    row, _ = CacheSettings.objects.select_for_update().get_or_create(
        pk=SETTINGS_ID, defaults={"data": {}}
    )
    row.data = config.model_dump(mode="json")
    row.updated_by = actor
    row.save()
    record_event(
        action="cache_config.set",
        obj=row,
        actor=actor,
        before=before.model_dump(mode="json"),
        after=row.data,
    )
    publish_change("cache_config")
    return config, config.restart_fields(before)
