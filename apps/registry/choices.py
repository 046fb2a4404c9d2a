from __future__ import annotations

from django.db import models


class VersionState(models.TextChoices):
    VALIDATING = "validating", "Validating"
    PENDING_REVIEW = "pending_review", "Pending review"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    DEPRECATED = "deprecated", "Deprecated"


class AliasAction(models.TextChoices):
    SET = "set", "Set stable version"
    CANARY = "canary", "Set canary"
    CLEAR_CANARY = "clear_canary", "Clear canary"
    PROMOTE = "promote", "Promote canary"
    ROLLBACK = "rollback", "Roll back"
    SHADOW = "shadow", "Set shadow"
    CLEAR_SHADOW = "clear_shadow", "Clear shadow"


# Actions after which the alias's stable version is a different one.
STABLE_MOVES = (AliasAction.SET, AliasAction.PROMOTE, AliasAction.ROLLBACK)
