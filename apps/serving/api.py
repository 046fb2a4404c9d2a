"""Operator endpoints of the serving side: the adapter-cache configuration."""

from __future__ import annotations

import json

from django.http import HttpRequest
from ninja import Router

from apps.serving import config
from apps.tenants.auth import OPERATOR_AUTH, Principal
from apps.tenants.errors import Invalid

router = Router(tags=["cache"], auth=OPERATOR_AUTH)


def _operator(request: HttpRequest) -> Principal:
    principal: Principal = request.auth  # type: ignore[attr-defined]  # set by ninja's auth
    principal.require_operator()
    return principal


@router.get("/cache-config", response=dict)
def get_cache_config(request: HttpRequest):
    """The configuration in force, in the seed's YAML shape, as JSON."""
    _operator(request)
    return config.effective_config().model_dump(mode="json")


@router.put("/cache-config", response=dict)
def put_cache_config(request: HttpRequest):
    """Replace the whole configuration (send what GET returned, changed). Nodes apply it at
    once, except the settings listed in ``needs_restart``."""
    principal = _operator(request)
    try:
        data = json.loads(request.body or b"null")
    except json.JSONDecodeError:
        raise Invalid(
            "the body is not valid JSON; send the configuration as a JSON object"
        ) from None
    stored, needs_restart = config.set_config(data=data, principal=principal)
    return {"config": stored.model_dump(mode="json"), "needs_restart": needs_restart}
