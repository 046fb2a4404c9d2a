from __future__ import annotations

from binascii import unhexlify

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice, default_key

from apps.tenants import sealing
from apps.tenants.choices import Priority, TenantRole

slug_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9-]{1,62}$",
    "Use 2-63 lowercase letters, digits and hyphens, starting with a letter or digit.",
)


class TenantQuerySet(models.QuerySet):
    def for_user(self, user) -> TenantQuerySet:
        return self.filter(memberships__user=user)


class Tenant(models.Model):
    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    priority = models.IntegerField(choices=Priority.choices, default=Priority.STANDARD)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=TenantRole.choices, default=TenantRole.MEMBER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="one_membership_per_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"


class ApiKeyQuerySet(models.QuerySet):
    def active(self) -> ApiKeyQuerySet:
        """Not revoked (an expired key is still listed as active: it names its own expiry)."""
        return self.filter(revoked_at__isnull=True)


class ApiKey(models.Model):
    """A tenant's API key. Only a sha256 of the secret is stored; the key is shown once.

    Keys look like ``lh_<prefix>_<secret>``: the prefix finds the row, the hash of the whole
    key proves it. Secrets are 32 random bytes, so a plain (fast) hash is safe here, unlike
    passwords, and keeps per-request authentication cheap.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    # An admin key acts as an admin of its tenant (its keys, its audit log, its quota), for a
    # tenant's tooling (``lorahub keys …``); only a person who administers the tenant issues
    # one, and an admin key may issue member keys only, so a leaked key cannot mint successors
    # with its own power.
    admin = models.BooleanField(default=False)
    key_hash = models.CharField(max_length=64)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    last_used_from = models.GenericIPAddressField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # None: the key lasts until it is revoked
    expires_at = models.DateTimeField(null=True, blank=True)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name} (lh_{self.prefix}_…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and not self.is_expired

    @property
    def is_expired(self) -> bool:
        from django.utils import timezone

        return self.expires_at is not None and self.expires_at <= timezone.now()


class ExternalIdentity(models.Model):
    """A user as the OpenID provider knows them: the issuer's subject, which never changes
    (an e-mail address may change or pass to someone else)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="identities"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    # the groups the provider sent at the last sign-in, as the roles were computed from them
    groups = models.JSONField(default=list, blank=True)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="one_user_per_subject")
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"


class Quota(models.Model):
    """Per-tenant limits. Defaults apply until an operator sets them."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="quota")
    max_hot_adapters = models.PositiveIntegerField(default=2)  # pinned in device slots (L1)
    max_warm_adapters = models.PositiveIntegerField(default=8)  # in the engine (L1 + L2)
    max_hot_memory_mb = models.PositiveIntegerField(default=512)
    max_adapters = models.PositiveIntegerField(default=50)
    max_versions_per_adapter = models.PositiveIntegerField(default=100)
    max_upload_mb = models.PositiveIntegerField(default=200)
    requests_per_minute = models.PositiveIntegerField(default=600)
    # The tenant's share of the engine, in percent of its tier's weight (batch ¼, standard 1,
    # premium 2): 100 is its tier's share, 200 twice it (apps/serving/fairness.py).
    engine_weight = models.PositiveIntegerField(default=100)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"quota of {self.tenant.slug}"


class AuditEvent(models.Model):
    """Who did what to which object, with the state before and after. Append-only.

    It lives in the tenants app, the bottom of the dependency chain, so that every app can
    record events without importing upwards.
    """

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_key = models.ForeignKey(ApiKey, null=True, on_delete=models.SET_NULL, related_name="+")
    tenant = models.ForeignKey(
        Tenant, null=True, on_delete=models.SET_NULL, related_name="audit_events"
    )
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    note = models.TextField(blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.action} {self.object_type}:{self.object_id}"


class Webhook(models.Model):
    """Where a tenant's (or, with no tenant, the platform's) notifications go: a URL that gets
    each event signed with ``secret`` (apps/tenants/webhooks.py)."""

    class Format(models.TextChoices):
        LORAHUB = "lorahub", "lorahub (JSON, signed)"
        SLACK = "slack", 'Slack-compatible ({"text": …}, signed)'

    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="webhooks"
    )
    url = models.URLField(max_length=500)
    # signs each body; shown once at creation, kept sealed (apps/tenants/sealing.py)
    secret = models.CharField(max_length=255)
    events = models.JSONField(default=list, blank=True)  # [] for every event
    format = models.CharField(max_length=8, choices=Format.choices, default=Format.LORAHUB)
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.tenant.slug if self.tenant else 'platform'} → {self.url}"

    @property
    def signing_secret(self) -> str:
        """The secret itself (the column holds it sealed)."""
        return sealing.unseal(self.secret)

    def wants(self, event: str) -> bool:
        return self.active and (not self.events or event in self.events)


class WebhookDelivery(models.Model):
    """One event for one webhook, delivered at least once: retried with backoff until the
    receiver answers 2xx; ``delivery_id`` stays the same across attempts (idempotency)."""

    class State(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # gave up after the last attempt

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    delivery_id = models.UUIDField(unique=True)
    event = models.CharField(max_length=64)
    payload = models.JSONField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "created_at"], name="delivery_state_created")]

    def __str__(self) -> str:
        return f"{self.event} → {self.webhook.url} ({self.state})"


# --- the second factor's devices, sealed at rest (apps/tenants/sealing.py) ----------------


class SealedTOTPDevice(TOTPDevice):
    """django-otp's TOTP device whose key column holds the key sealed (``key`` is never the
    plain hex key): a database reader cannot compute anyone's codes."""

    class Meta:
        proxy = True

    @classmethod
    def create_for(cls, user, *, name: str) -> SealedTOTPDevice:
        return cls.objects.create(
            user=user, name=name, confirmed=False, key=sealing.seal(default_key())
        )

    @property
    def bin_key(self) -> bytes:
        return unhexlify(sealing.unseal(self.key).encode())


class HashedRecoveryCodes(StaticDevice):
    """django-otp's static device whose tokens are keyed digests of the recovery codes, never
    the codes (``sealing.code_digests``)."""

    class Meta:
        proxy = True

    def set_codes(self, codes: list[str]) -> None:
        StaticToken.objects.bulk_create(
            StaticToken(device=self, token=sealing.code_digests(code)[0]) for code in codes
        )

    def verify_token(self, token: str) -> bool:
        allowed, _ = self.verify_is_allowed()
        if not allowed:
            return False
        match = self.token_set.filter(token__in=sealing.code_digests(token)).first()
        if match is None:
            self.throttle_increment()
            return False
        match.delete()
        self.throttle_reset(commit=False)
        self.set_last_used_timestamp(commit=False)
        self.save()
        return True
