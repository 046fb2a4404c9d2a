from __future__ import annotations

from apps.tenants.errors import Invalid


class Rejected(Invalid):
    """The upload is not a servable adapter; the message says why and how to fix it."""

    code = "rejected"
