from __future__ import annotations

from django.db import models


class TenantRole(models.TextChoices):
    ADMIN = "admin", "Tenant admin"
    MEMBER = "member", "Tenant member"


class PlatformRole(models.TextChoices):
    """Platform roles are Django groups: a reviewer or operator is a user, not a tenant."""

    REVIEWER = "reviewer", "Reviewer"
    OPERATOR = "operator", "Operator"


class Priority(models.IntegerChoices):
    """SLA tier; higher keeps adapters hot longer and gets a larger guaranteed cache share."""

    BATCH = 0, "Batch"
    STANDARD = 1, "Standard"
    PREMIUM = 2, "Premium"
