"""Console pages of the registry: adapters and versions, uploads, the review queue, aliases.

Reads use the same visibility rules as the REST API
(``AdapterVersion.objects.visible_to``); writes call the same
services the API calls, so what a page offers and what the server allows cannot drift.
"""

from __future__ import annotations

import json

from django.db.models import Count, Max, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from django.views.decorators.http import require_POST

from apps.registry import aliases, services, snapshots
from apps.registry import review as reviewing
from apps.registry.choices import AliasAction, VersionState
from apps.registry.models import Adapter, AdapterVersion, Alias, AliasEvent
from apps.tenants.console import (
    act,
    principal_of,
    require,
    reviewers,
    signed_in,
    table,
    tenant_or_404,
)
from apps.tenants.errors import Invalid

STATE_FILTERS = [(s.value, s.label) for s in VersionState]


# --- adapters and versions ---------------------------------------------------------------------


@require(signed_in, "signed-in users")
def adapter_list(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_or_404(principal_of(request), slug)
    qs = Adapter.objects.filter(tenant=tenant).annotate(
        n_versions=Count("versions"),
        n_approved=Count("versions", filter=Q(versions__state=VersionState.APPROVED)),
        n_pending=Count("versions", filter=Q(versions__state=VersionState.PENDING_REVIEW)),
        last_upload=Max("versions__created_at"),
    )
    if q := request.GET.get("q", "").strip():
        qs = qs.filter(adapter_id__icontains=q)
    listing = table(
        request,
        qs,
        sorts={"id": "adapter_id", "versions": "n_versions", "last": "last_upload"},
        default="id",
    )
    return render(
        request,
        "registry/adapter_list.html",
        {"tenant": tenant, "table": listing, "q": q, "section": "adapters"},
    )


@require(signed_in, "signed-in users")
def adapter_detail(request: HttpRequest, slug: str, adapter_id: str) -> HttpResponse:
    principal = principal_of(request)
    tenant = tenant_or_404(principal, slug)
    adapter = Adapter.objects.filter(tenant=tenant, adapter_id=adapter_id).first()
    if adapter is None:
        raise Http404(f"tenant '{slug}' has no adapter '{adapter_id}'")
    qs = AdapterVersion.objects.filter(adapter=adapter).select_related(
        "uploaded_by", "uploaded_by_key", "reviewer"
    )
    state = request.GET.get("state", "")
    if state in VersionState.values:
        qs = qs.filter(state=state)
    listing = table(
        request,
        qs,
        sorts={
            "version": "version",
            "uploaded": "created_at",
            "state": "state",
            "size": "size_bytes",
        },
        default="-uploaded",
    )
    serving = Alias.objects.filter(adapter=adapter).select_related("version", "canary_version")
    return render(
        request,
        "registry/adapter_detail.html",
        {
            "tenant": tenant,
            "adapter": adapter,
            "table": listing,
            "states": STATE_FILTERS,
            "state": state,
            "aliases": serving,
            "section": "adapters",
        },
    )


@require(signed_in, "signed-in users")
def upload(request: HttpRequest, slug: str) -> HttpResponse:
    """The upload form. The browser sends the files to the REST API (progress bar), then
    polls the version until validation ends."""
    tenant = tenant_or_404(principal_of(request), slug)
    existing = Adapter.objects.filter(tenant=tenant).values_list("adapter_id", flat=True)
    return render(
        request,
        "registry/upload.html",
        {
            "tenant": tenant,
            "existing": list(existing),
            "preset": request.GET.get("adapter", ""),
            "limit_mb": services.upload_limit_bytes(tenant) // 1048576,
            "section": "upload",
        },
    )


def _comparison(version: AdapterVersion, serving: AdapterVersion | None) -> AdapterVersion | None:
    """What a reviewer compares against: ``serving``, the version the adapter's alias serves
    now, else (no alias yet, or it serves this one) the newest other approved version."""
    if serving is not None and serving.pk != version.pk:
        return serving
    return (
        AdapterVersion.objects.filter(adapter_id=version.adapter_id, state=VersionState.APPROVED)
        .exclude(pk=version.pk)
        .order_by("-reviewed_at", "-pk")
        .first()
    )


def _differences(version: AdapterVersion, other: AdapterVersion | None) -> list[dict]:
    if other is None:
        return []
    rows = [
        ("Rank", version.rank, other.rank),
        ("Alpha", version.lora_alpha, other.lora_alpha),
        ("Target modules", ", ".join(version.target_modules), ", ".join(other.target_modules)),
        ("Size (bytes)", version.size_bytes, other.size_bytes),
        ("Base revision", version.base_model_revision, other.base_model_revision),
        ("Tensors", version.report.get("tensors"), other.report.get("tensors")),
    ]
    for module in sorted(
        set(version.report.get("modules", {})) | set(other.report.get("modules", {}))
    ):
        mine = version.report.get("modules", {}).get(module, {})
        theirs = other.report.get("modules", {}).get(module, {})
        rows.append((f"{module} ‖B‖", mine.get("norm_b"), theirs.get("norm_b")))
    return [{"what": w, "this": a, "other": b, "changed": a != b} for w, a, b in rows]


@require(signed_in, "signed-in users")
def version_detail(request: HttpRequest, version_id: int) -> HttpResponse:
    principal = principal_of(request)
    version = AdapterVersion.objects.visible_to(principal).filter(pk=version_id).first()
    if version is None:
        raise Http404(f"no adapter version {version_id} that you can see")
    serving = snapshots.serving_version(version.adapter)
    other = _comparison(version, serving)
    own_tenant = version.adapter.tenant_id in principal.tenant_ids
    can_review = (
        principal.is_reviewer
        and version.state == VersionState.PENDING_REVIEW
        and not own_tenant
        and version.uploaded_by_id != request.user.pk
    )
    manifest = version.manifest() if version.manifest_digest else None
    return render(
        request,
        "registry/version_detail.html",
        {
            "tenant": version.adapter.tenant,
            "version": version,
            "other": other,
            "other_serving": other is not None and serving is not None and other.pk == serving.pk,
            "differences": _differences(version, other),
            "manifest": json.dumps(manifest, indent=2, sort_keys=True) if manifest else "",
            "can_review": can_review,
            "own_tenant_pending": principal.is_reviewer
            and own_tenant
            and version.state == VersionState.PENDING_REVIEW,
            "polling": version.state == VersionState.VALIDATING,
            "section": "review" if principal.is_reviewer and not own_tenant else "adapters",
        },
    )


@require(reviewers, "reviewers")
def review_queue(request: HttpRequest) -> HttpResponse:
    """Versions pending review, oldest first, without the reviewer's own tenants' uploads."""
    principal = principal_of(request)
    qs = (
        AdapterVersion.objects.filter(state=VersionState.PENDING_REVIEW)
        .exclude(adapter__tenant_id__in=principal.tenant_ids)
        .exclude(uploaded_by=request.user)
        .select_related("adapter__tenant", "uploaded_by", "uploaded_by_key")
    )
    if q := request.GET.get("q", "").strip():
        qs = qs.filter(Q(adapter__adapter_id__icontains=q) | Q(adapter__tenant__slug__icontains=q))
    listing = table(
        request,
        qs,
        sorts={"uploaded": "created_at", "tenant": "adapter__tenant__slug", "size": "size_bytes"},
        default="uploaded",
    )
    return render(
        request, "registry/review_queue.html", {"table": listing, "q": q, "section": "review"}
    )


@require_POST
@require(reviewers, "reviewers")
def review(request: HttpRequest, version_id: int, verdict: str) -> HttpResponse:
    principal = principal_of(request)
    if not AdapterVersion.objects.visible_to(principal).filter(pk=version_id).exists():
        raise Http404(f"no adapter version {version_id} that you can see")
    note = request.POST.get("note", "")
    if verdict == "approve":
        action = lambda: reviewing.approve_version(  # noqa: E731
            version_id=version_id, principal=principal, note=note
        )
        done = "Approved and signed."
    else:
        action = lambda: reviewing.reject_version(  # noqa: E731
            version_id=version_id, principal=principal, note=note
        )
        done = "Rejected; the tenant sees your note."
    return act(request, action, done, reverse("registry:version", args=[version_id]))


# --- aliases -----------------------------------------------------------------------------------


def _approved_versions(tenant):
    return (
        AdapterVersion.objects.filter(adapter__tenant=tenant, state=VersionState.APPROVED)
        .select_related("adapter")
        .order_by("adapter__adapter_id", "-created_at")
    )


@require(signed_in, "signed-in users")
def alias_list(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_or_404(principal_of(request), slug)
    qs = Alias.objects.filter(tenant=tenant).select_related("adapter", "version", "canary_version")
    listing = table(request, qs, sorts={"name": "name", "updated": "updated_at"}, default="name")
    return render(
        request,
        "registry/alias_list.html",
        {
            "tenant": tenant,
            "table": listing,
            "approved": _approved_versions(tenant),
            "section": "aliases",
        },
    )


def _alias_or_404(tenant, name: str) -> Alias:
    alias = (
        Alias.objects.filter(tenant=tenant, name=name)
        .select_related("adapter", "version__adapter", "canary_version__adapter")
        .first()
    )
    if alias is None:
        raise Http404(f"tenant '{tenant.slug}' has no alias '{name}'")
    return alias


@require(signed_in, "signed-in users")
def alias_detail(request: HttpRequest, slug: str, name: str) -> HttpResponse:
    tenant = tenant_or_404(principal_of(request), slug)
    alias = _alias_or_404(tenant, name)
    history = AliasEvent.objects.filter(alias=alias).select_related(
        "from_version", "to_version", "canary_version"
    )[:50]
    same_adapter = _approved_versions(tenant).filter(adapter=alias.adapter)
    return render(
        request,
        "registry/alias_detail.html",
        {
            "tenant": tenant,
            "alias": alias,
            "history": history,
            "approved": same_adapter,
            "rollback_to": aliases.previous_stable_version(alias),
            "actions": AliasAction,
            "section": "aliases",
        },
    )


def _int(raw: str, what: str) -> int:
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise Invalid(f"choose {what}") from None


@require_POST
@require(signed_in, "signed-in users")
def alias_action(request: HttpRequest, slug: str, name: str, action: str) -> HttpResponse:
    principal = principal_of(request)
    tenant = tenant_or_404(principal, slug)
    post = request.POST
    reason = post.get("reason", "").strip()
    creating = action == "set" and "name" in post  # the aliases page's "new alias" form
    name = post.get("name", "").strip() if creating else name
    aliases_page = reverse("registry:aliases", args=[tenant.slug])

    def run() -> None:
        if action == "set":
            aliases.set_alias(
                principal=principal,
                tenant=tenant,
                name=name,
                version_id=_int(post.get("version_id"), "a version to point at"),
                reason=reason,
            )
        elif action == "canary":
            clear = post.get("clear") == "1"
            aliases.set_canary(
                principal=principal,
                tenant=tenant,
                name=name,
                version_id=None if clear else _int(post.get("version_id"), "a canary version"),
                percent=0 if clear else _int(post.get("percent", "0"), "a percentage"),
                api_keys=[p.strip() for p in post.get("api_keys", "").split(",") if p.strip()],
                reason=reason,
            )
        elif action == "shadow":
            clear = post.get("clear") == "1"
            aliases.set_shadow(
                principal=principal,
                tenant=tenant,
                name=name,
                version_id=None if clear else _int(post.get("version_id"), "a shadow version"),
                percent=0 if clear else _int(post.get("percent", "0"), "a percentage"),
                keep_examples=post.get("keep_examples") == "1",
                reason=reason,
            )
        elif action == "promote":
            aliases.promote_alias(principal=principal, tenant=tenant, name=name, reason=reason)
        elif action == "rollback":
            aliases.rollback_alias(principal=principal, tenant=tenant, name=name, reason=reason)
        else:
            raise Http404(f"no alias action '{action}'")

    done = {
        "set": f"Alias '{name}' moved; nodes follow within a second.",
        "canary": f"Canary of '{name}' updated.",
        "shadow": f"Shadow of '{name}' updated; nodes follow within a second.",
        "promote": f"Canary of '{name}' promoted to stable.",
        "rollback": f"Alias '{name}' rolled back.",
    }.get(action, "Done.")
    try:
        back = reverse("registry:alias", args=[tenant.slug, name])
    except NoReverseMatch:  # a name no alias can have: the service refuses it below
        back = aliases_page
    return act(request, run, done, back, back_on_error=aliases_page if creating else back)
