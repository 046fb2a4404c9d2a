"""Registry models: base models the platform serves, adapters, immutable versions, aliases.

Single-row rules live here; workflows (and every write) live in ``services.py``.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from apps.registry.choices import AliasAction, VersionState
from apps.tenants.models import Tenant, slug_validator


class BaseModel(models.Model):
    """A base model (name + revision) the platform serves, with the shapes adapters must fit."""

    name = models.CharField(max_length=200)
    revision = models.CharField(max_length=100)
    num_layers = models.PositiveIntegerField()
    # module name -> [in_features, out_features] of the base model's linear layers
    modules = models.JSONField()
    max_lora_rank = models.PositiveIntegerField(default=16)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "revision"], name="one_base_model_revision")
        ]

    def __str__(self) -> str:
        return f"{self.name}@{self.revision}"


class SigningKey(models.Model):
    """A public key the platform signs (or signed) with. Nodes verify with these rows and
    never see a private key."""

    key_id = models.CharField(max_length=32, unique=True)
    public_key = models.CharField(max_length=64)  # raw Ed25519, base64
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.key_id


def _sees_every_tenant(principal) -> bool:
    """Reviewers review every tenant's uploads; operators run the platform."""
    return principal.is_reviewer or principal.is_operator


class AdapterQuerySet(models.QuerySet):
    def for_tenants(self, tenant_ids) -> AdapterQuerySet:
        return self.filter(tenant_id__in=tenant_ids)

    def visible_to(self, principal) -> AdapterQuerySet:
        """What ``principal`` may see: its tenants' adapters, or every one for a reviewer or
        an operator (the API and the console read through here)."""
        return self if _sees_every_tenant(principal) else self.for_tenants(principal.tenant_ids)


class Adapter(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="adapters")
    adapter_id = models.CharField(max_length=63, validators=[slug_validator])
    created_at = models.DateTimeField(auto_now_add=True)

    objects = AdapterQuerySet.as_manager()

    class Meta:
        ordering = ["tenant__slug", "adapter_id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "adapter_id"], name="adapter_id_per_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.adapter_id}"


class AdapterVersionQuerySet(models.QuerySet):
    def for_tenants(self, tenant_ids) -> AdapterVersionQuerySet:
        return self.filter(adapter__tenant_id__in=tenant_ids)

    def visible_to(self, principal) -> AdapterVersionQuerySet:
        """What ``principal`` may see: its tenants' versions, or every one for a reviewer or
        an operator (the API, the console and releases read through here)."""
        qs = self.select_related("adapter__tenant", "uploaded_by", "uploaded_by_key", "reviewer")
        return qs if _sees_every_tenant(principal) else qs.for_tenants(principal.tenant_ids)


# Fields fixed at creation: what the version *is*. Only review and lifecycle fields change.
CONTENT_FIELDS = (
    "adapter_id",
    "version",
    "uploaded_by_id",
    "training_data_summary",
    "created_at",
)
# Fields fixed once validation has filled them in.
VALIDATED_FIELDS = (
    "base_model",
    "base_model_revision",
    "rank",
    "lora_alpha",
    "target_modules",
    "size_bytes",
    "files",
    "manifest_digest",
    "storage_prefix",
    "report",
)
SIGNATURE_FIELDS = ("signature", "signing_key_id")


class AdapterVersion(models.Model):
    """One immutable version of an adapter.

    Immutability is enforced three ways: ``save()`` refuses to change a content field of an
    existing row, the validated fields once set, or a signature once set; storage keys are
    written once (see ``storage.py``); and versions are never deleted, so a version string is
    never reused.
    """

    adapter = models.ForeignKey(Adapter, on_delete=models.PROTECT, related_name="versions")
    version = models.CharField(max_length=64)
    state = models.CharField(
        max_length=20, choices=VersionState.choices, default=VersionState.VALIDATING
    )
    uploaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    uploaded_by_key = models.ForeignKey(
        "tenants.ApiKey", null=True, on_delete=models.SET_NULL, related_name="+"
    )
    training_data_summary = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # where the raw upload waits for validation; emptied once validation has run
    staging_prefix = models.CharField(max_length=200, blank=True)

    # filled in by validation
    base_model = models.CharField(max_length=200, blank=True)
    base_model_revision = models.CharField(max_length=100, blank=True)
    rank = models.PositiveIntegerField(null=True)
    lora_alpha = models.FloatField(null=True)
    target_modules = models.JSONField(default=list)
    size_bytes = models.BigIntegerField(null=True)
    files = models.JSONField(default=dict)  # name -> {"sha256": ..., "size": ...}
    manifest_digest = models.CharField(max_length=64, blank=True)
    storage_prefix = models.CharField(max_length=512, blank=True)
    # the validation report a reviewer reads (tensors, dtypes, per-module layers and norms)
    report = models.JSONField(default=dict, blank=True)
    validated_at = models.DateTimeField(null=True)
    rejection_reason = models.TextField(blank=True)

    # review and signature
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    review_note = models.TextField(blank=True)
    reviewed_at = models.DateTimeField(null=True)
    signature = models.TextField(blank=True)
    signing_key_id = models.CharField(max_length=32, blank=True)
    deprecated_at = models.DateTimeField(null=True)

    objects = AdapterVersionQuerySet.as_manager()

    class Meta:
        ordering = ["adapter", "-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["adapter", "version"], name="version_per_adapter")
        ]

    def __str__(self) -> str:
        return f"{self.adapter}@{self.version}"

    def save(self, *args, **kwargs) -> None:
        if self.pk is not None:
            stored = (
                type(self)
                .objects.filter(pk=self.pk)
                .values(*CONTENT_FIELDS, *VALIDATED_FIELDS, *SIGNATURE_FIELDS)
                .first()
            )
            if stored is not None:
                self._refuse_content_changes(stored)
        super().save(*args, **kwargs)

    def _refuse_content_changes(self, stored: dict) -> None:
        changed = [f for f in CONTENT_FIELDS if getattr(self, f) != stored[f]]
        if stored["manifest_digest"]:
            changed += [f for f in VALIDATED_FIELDS if getattr(self, f) != stored[f]]
        if stored["signature"]:
            changed += [f for f in SIGNATURE_FIELDS if getattr(self, f) != stored[f]]
        if changed:
            raise ValidationError(
                f"adapter versions are immutable; refused to change {', '.join(changed)}. "
                "Upload a new version instead."
            )

    @property
    def label(self) -> str:
        return f"{self.adapter.adapter_id}@{self.version}"

    @property
    def is_servable(self) -> bool:
        return self.state == VersionState.APPROVED and bool(self.signature)

    def manifest(self) -> dict:
        """What the signature covers: the version's identity and every file's sha256."""
        return {
            "tenant": self.adapter.tenant.slug,
            "adapter_id": self.adapter.adapter_id,
            "version": self.version,
            "base_model": self.base_model,
            "base_model_revision": self.base_model_revision,
            "rank": self.rank,
            "files": {name: meta["sha256"] for name, meta in sorted(self.files.items())},
        }


class Alias(models.Model):
    """A tenant's stable name for an adapter, pointing at one approved version (+ a canary)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="aliases")
    name = models.CharField(max_length=63, validators=[slug_validator])
    adapter = models.ForeignKey(Adapter, on_delete=models.PROTECT, related_name="aliases")
    version = models.ForeignKey(AdapterVersion, on_delete=models.PROTECT, related_name="+")
    canary_version = models.ForeignKey(
        AdapterVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    canary_percent = models.PositiveSmallIntegerField(default=0)
    canary_api_keys = models.JSONField(default=list, blank=True)  # key prefixes
    # a version that gets a copy of shadow_percent of the alias's requests, off the response
    # path: its answers are compared, never returned
    shadow_version = models.ForeignKey(
        AdapterVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    shadow_percent = models.PositiveSmallIntegerField(default=0)
    # keep a bounded sample of (request, live answer, shadow answer) for the alias page
    shadow_keep_examples = models.BooleanField(default=False)
    # What drives the alias now besides people, e.g. "release #3": while set, moves by hand
    # are refused with this name (aliases.py); the holder passes it to move the alias itself.
    held_by = models.CharField(max_length=100, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant__slug", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="alias_name_per_tenant"),
            models.CheckConstraint(
                condition=models.Q(canary_percent__gte=0, canary_percent__lte=100),
                name="canary_percent_0_100",
            ),
            models.CheckConstraint(
                condition=models.Q(shadow_percent__gte=0, shadow_percent__lte=100),
                name="shadow_percent_0_100",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name}"


class AliasEvent(models.Model):
    """The alias's history: every move, who made it, from where to where, and why."""

    alias = models.ForeignKey(Alias, on_delete=models.CASCADE, related_name="history")
    action = models.CharField(max_length=20, choices=AliasAction.choices)
    from_version = models.ForeignKey(
        AdapterVersion, null=True, on_delete=models.PROTECT, related_name="+"
    )
    to_version = models.ForeignKey(
        AdapterVersion, null=True, on_delete=models.PROTECT, related_name="+"
    )
    canary_version = models.ForeignKey(
        AdapterVersion, null=True, on_delete=models.PROTECT, related_name="+"
    )
    canary_percent = models.PositiveSmallIntegerField(default=0)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_label = models.CharField(max_length=150, blank=True)
    reason = models.TextField(blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.alias} {self.action} at {self.at:%Y-%m-%d %H:%M:%S}"
