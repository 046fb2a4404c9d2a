"""The console's bound on request bodies that Django reads into memory (forms, JSON):
``LORAHUB_MAX_BODY_KB``. Refused before anything reads the body (the CSRF check reads a
form first), with 413 and what the limit is. Uploads (multipart) stream to disk under their
own limit (``LORAHUB_MAX_UPLOAD_MB`` and the tenant's quota), so they pass here."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


class BodyLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        length = request.META.get("CONTENT_LENGTH") or "0"
        multipart = request.META.get("CONTENT_TYPE", "").startswith("multipart/")
        if limit and not multipart and length.isdigit() and int(length) > limit:
            message = (
                f"the request body is over the console's limit of {limit // 1024} KiB "
                "(LORAHUB_MAX_BODY_KB); files go in an upload (multipart/form-data)"
            )
            if request.path.startswith("/api/"):
                return JsonResponse({"code": "body_too_large", "detail": message}, status=413)
            return HttpResponse(message + "\n", status=413, content_type="text/plain")
        return self.get_response(request)
