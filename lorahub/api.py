"""The control plane's REST API: one NinjaAPI that mounts each app's router.

Domain errors become ``{"detail": <what was wrong and what to do>, "code": <machine code>}``
with the status the error class names; nothing else (no stack, no storage detail) leaks.
"""

from __future__ import annotations

import logging

from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import DataError
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI

from apps.evaluations.api import router as evaluations_router
from apps.fleet.api import router as fleet_router
from apps.registry.api import router as registry_router
from apps.registry.storage import StorageError
from apps.releases.api import router as releases_router
from apps.serving.api import router as serving_router
from apps.telemetry.api import router as telemetry_router
from apps.tenants.api import router as tenants_router
from apps.tenants.errors import DomainError, Throttled

logger = logging.getLogger(__name__)

api = NinjaAPI(title="lorahub control plane", version="1", urls_namespace="api")
api.add_router("/", tenants_router)
api.add_router("/", registry_router)
api.add_router("/", serving_router)
api.add_router("/", fleet_router)
api.add_router("/", evaluations_router)
api.add_router("/", releases_router)
api.add_router("/", telemetry_router)


@api.exception_handler(DomainError)
def domain_error(request: HttpRequest, exc: DomainError) -> HttpResponse:
    body: dict = {"detail": exc.message, "code": exc.code}
    fields = getattr(exc, "fields", None)  # per-field messages (a release plan), for forms
    if fields:
        body["fields"] = fields
    response = api.create_response(request, body, status=exc.status)
    if isinstance(exc, Throttled):
        response["Retry-After"] = str(exc.retry_after)
    return response


@api.exception_handler(ValidationError)
def model_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    return api.create_response(
        request, {"detail": " ".join(exc.messages), "code": "conflict"}, status=409
    )


@api.exception_handler(DataError)
def unstorable_value(request: HttpRequest, exc: DataError) -> HttpResponse:
    """A value the database cannot hold (a NUL character, a number out of range): the
    caller's input, not a server fault; the failed statement stored nothing."""
    logger.info("refused an unstorable value on %s: %s", request.path, exc)
    return api.create_response(
        request,
        {
            "detail": "a value in the request cannot be stored (a NUL character, or a number "
            "out of range); remove it and send the request again",
            "code": "invalid_value",
        },
        status=400,
    )


@api.exception_handler(StorageError)
def storage_error(request: HttpRequest, exc: StorageError) -> HttpResponse:
    logger.error("object store error on %s: %s", request.path, exc)
    return api.create_response(
        request,
        {
            "detail": "the object store is unavailable; nothing was stored, try again shortly",
            "code": "storage_unavailable",
        },
        status=503,
    )


@api.exception_handler(ImproperlyConfigured)
def misconfigured(request: HttpRequest, exc: ImproperlyConfigured) -> HttpResponse:
    logger.error("misconfiguration on %s: %s", request.path, exc)
    return api.create_response(
        request,
        {
            "detail": "the server is misconfigured; an operator has to fix it",
            "code": "misconfigured",
        },
        status=500,
    )
