"""Aliases and versions as a serving node sees them: loaded from the database into the
frozen values of ``contracts.py``."""

from __future__ import annotations

from apps.registry.contracts import AliasSnapshot, ResolvedVersion
from apps.registry.models import AdapterVersion, Alias
from apps.tenants.errors import Forbidden, NotFound
from apps.tenants.models import Tenant


def _resolved(alias: Alias, version: AdapterVersion, *, is_canary: bool) -> ResolvedVersion:
    return _resolved_version(version, alias=alias.name, is_canary=is_canary)


def _resolved_version(version: AdapterVersion, *, alias: str, is_canary: bool) -> ResolvedVersion:
    return ResolvedVersion(
        tenant_id=version.adapter.tenant_id,
        tenant_slug=version.adapter.tenant.slug,
        alias=alias,
        adapter_id=version.adapter.adapter_id,
        version_id=version.pk,
        version=version.version,
        base_model=version.base_model,
        base_model_revision=version.base_model_revision,
        rank=version.rank or 0,
        storage_prefix=version.storage_prefix,
        files=tuple(
            (name, meta["sha256"], meta["size"]) for name, meta in sorted(version.files.items())
        ),
        manifest=version.manifest(),
        signature=version.signature,
        signing_key_id=version.signing_key_id,
        is_canary=is_canary,
        servable=version.is_servable,
    )


def _snapshot_of(alias: Alias) -> AliasSnapshot:
    return AliasSnapshot(
        alias_id=alias.pk,
        tenant_id=alias.tenant_id,
        name=alias.name,
        stable=_resolved(alias, alias.version, is_canary=False),
        canary=(
            _resolved(alias, alias.canary_version, is_canary=True)
            if alias.canary_version is not None
            else None
        ),
        canary_percent=alias.canary_percent,
        canary_api_keys=frozenset(alias.canary_api_keys),
        shadow=(
            _resolved(alias, alias.shadow_version, is_canary=False)
            if alias.shadow_version is not None
            else None
        ),
        shadow_percent=alias.shadow_percent,
        shadow_keep_examples=alias.shadow_keep_examples,
    )


def _snapshot_queryset():
    return Alias.objects.select_related(
        "tenant",
        "version__adapter__tenant",
        "canary_version__adapter__tenant",
        "shadow_version__adapter__tenant",
    )


def load_alias_snapshot(*, tenant_id: int, name: str) -> AliasSnapshot | None:
    alias = _snapshot_queryset().filter(tenant_id=tenant_id, name=name).first()
    return _snapshot_of(alias) if alias else None


def load_all_alias_snapshots() -> list[AliasSnapshot]:
    return [_snapshot_of(alias) for alias in _snapshot_queryset()]


def load_version(version_id: int) -> ResolvedVersion | None:
    """A version by id, as the node would serve it (for prewarming by version)."""
    version = AdapterVersion.objects.select_related("adapter__tenant").filter(pk=version_id).first()
    return _resolved_version(version, alias="", is_canary=False) if version else None


def resolve_alias(
    *, tenant: Tenant, name: str, request_key: str, api_key_prefix: str | None = None
) -> ResolvedVersion:
    """The immutable version that serves this request, honouring the canary split.

    The same request key always gets the same answer while the alias is unchanged.
    """
    snapshot = load_alias_snapshot(tenant_id=tenant.id, name=name)
    if snapshot is None:
        raise NotFound(f"tenant '{tenant.slug}' has no alias '{name}'")
    chosen = snapshot.choose(request_key, api_key_prefix)
    if not chosen.servable:
        raise Forbidden(
            f"version {chosen.adapter_id}@{chosen.version} is not approved and signed; "
            "it cannot be served"
        )
    return chosen


def serving_version(adapter, alias: str | None = None) -> AdapterVersion | None:
    """The version an alias of ``adapter`` serves now (its stable version): the named alias,
    else the adapter's only alias, else the one named like the adapter; None without one."""
    found = Alias.objects.filter(adapter=adapter).select_related("version__adapter")
    if alias:
        named = found.filter(name=alias).first()
        if named is None:
            raise NotFound(f"adapter '{adapter.adapter_id}' has no alias '{alias}'")
        return named.version
    listed = list(found)
    if len(listed) == 1:
        return listed[0].version
    same_name = [a for a in listed if a.name == adapter.adapter_id]
    return same_name[0].version if same_name else None
