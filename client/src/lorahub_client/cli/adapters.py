"""Adapters' versions: push one, list and show them, pull one's files."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from lorahub_client.cli.output import Json, emit, err, handles_errors, out, say, table
from lorahub_client.cli.session import client
from lorahub_client.client import Client
from lorahub_client.downloads import check_file_name
from lorahub_client.errors import LorahubError, NotFound
from lorahub_client.models import Version
from lorahub_client.peft import adapter_files

versions_app = typer.Typer(help="An adapter's versions.", no_args_is_help=True)


@handles_errors
def push(
    ctx: typer.Context,
    path: Annotated[
        Path,
        typer.Argument(
            exists=True, help="A PEFT output folder (save_pretrained) or a .zip/.tar.gz."
        ),
    ],
    adapter: Annotated[str, typer.Option("--adapter", "-a", help="The adapter's id.")],
    version: Annotated[
        str | None, typer.Option(help="The version string (default: the server picks one).")
    ] = None,
    base_model_revision: Annotated[str, typer.Option(help="The base model's revision.")] = "",
    summary: Annotated[str, typer.Option(help="What it was trained on, for reviewers.")] = "",
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow validation to pending review (or rejection).")
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds --wait waits at most.")] = 600.0,
    as_json: Json = False,
) -> None:
    """Upload an adapter as a new immutable version."""
    if path.is_dir():
        chosen, skipped = adapter_files(path)
        if skipped:
            say(f"leaving out {', '.join(skipped)} (not part of an adapter upload)")
        total = sum(p.stat().st_size for p in chosen)
    else:
        total = path.stat().st_size
    api = client(ctx)
    with Progress(
        TextColumn("uploading"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        transient=True,
        disable=as_json or not err.is_terminal,
    ) as bar:
        task = bar.add_task("upload", total=total)
        found = api.upload(
            adapter,
            path,
            version=version,
            base_model_revision=base_model_revision,
            training_data_summary=summary,
            progress=lambda done, _: bar.update(task, completed=done),
        )
    if not as_json:
        say(f"uploaded {found.label} (id {found.id}); validating")
    if wait:
        with err.status("validating", spinner="dots") if not as_json else nullcontext():
            found = api.wait_for_verdict(found.id, timeout=timeout)
        if not as_json:
            say(f"{found.label} (id {found.id}) is {found.state.replace('_', ' ')}")
    emit(as_json, found)
    if not as_json and not wait:
        out.print(f"{found.id}")


# --- versions --------------------------------------------------------------------------------


def version_rows(found: list[Version]) -> list[list[Any]]:
    return [
        [v.id, v.label, v.state, v.rank, v.uploaded_by, v.created_at.strftime("%Y-%m-%d %H:%M")]
        for v in found
    ]


@versions_app.command("list")
@handles_errors
def versions_list(
    ctx: typer.Context,
    adapter: Annotated[str | None, typer.Option("--adapter", "-a")] = None,
    state: Annotated[
        str | None, typer.Option(help="validating, pending_review, approved, rejected…")
    ] = None,
    as_json: Json = False,
) -> None:
    """Versions you can see (of one adapter with --adapter)."""
    found = client(ctx).versions(adapter, state=state)
    emit(as_json, found)
    if not as_json:
        table("versions", ["id", "version", "state", "rank", "by", "uploaded"], version_rows(found))


@versions_app.command("show")
@handles_errors
def versions_show(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="An id, adapter@version, or a version with -a.")],
    adapter: Annotated[str | None, typer.Option("--adapter", "-a")] = None,
    as_json: Json = False,
) -> None:
    """One version: state, review, signature, files."""
    found = client(ctx).find_version(ref, adapter_id=adapter)
    emit(as_json, found)
    if not as_json:
        table(
            "version", ["id", "version", "state", "rank", "by", "uploaded"], version_rows([found])
        )
        if found.rejection_reason:
            out.print(f"rejected: {found.rejection_reason}", markup=False)
        if found.review_note:
            out.print(f"review note ({found.reviewer}): {found.review_note}", markup=False)
        out.print(f"signed: {found.signed} {found.signing_key_id}", markup=False)


# --- pull ------------------------------------------------------------------------------------


def version_to_pull(api: Client, ref: str) -> Version:
    """``tenant/name@version`` (the tenant optional; ``name`` an alias or an adapter; without
    ``@version``, what the alias serves) as a version."""
    tenant, _, rest = ref.rpartition("/")
    if tenant and tenant != api.tenant:
        raise NotFound(404, "not_found", f"this key acts for tenant '{api.tenant}', not '{tenant}'")
    name, _, version = rest.partition("@")
    if not name:
        raise LorahubError(f"'{ref}' names nothing: give tenant/alias@version, e.g. acme/support@3")
    try:
        alias = api.alias(name)
    except NotFound:
        if not version:
            raise
        return api.find_version(f"{name}@{version}")  # an adapter's own name
    if not version:
        return api.version(alias.version.id)
    return api.find_version(f"{alias.adapter_id}@{version}")


@handles_errors
def pull(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="tenant/alias@version, e.g. acme/support@3.")],
    to: Annotated[
        Path | None, typer.Option("--to", help="A new folder (default: ./adapter@version).")
    ] = None,
    as_json: Json = False,
) -> None:
    """Download an approved version's files and its OpenSSF model-signing bundle (model.sig),
    each file checked against the registry's SHA-256; check the bundle with
    `model_signing verify key --signature <folder>/model.sig --public_key lorahub.pub <folder>`."""
    api = client(ctx)
    version = version_to_pull(api, ref)
    folder = to or Path(check_file_name(version.label, version.label))
    names = api.pull(version, folder)
    emit(
        as_json, {"version": version.model_dump(mode="json"), "folder": str(folder), "files": names}
    )
    if not as_json:
        say(f"pulled {version.label} into {folder}: {', '.join(names)}")
        say(
            "check it: model_signing verify key --signature "
            f"{folder / 'model.sig'} --public_key lorahub.pub {folder}"
        )
