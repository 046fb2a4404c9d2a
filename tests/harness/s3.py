"""The session's S3 server, as settings and as an empty bucket."""

from __future__ import annotations

from tests.harness.processes import S3_ENV


def s3_overrides(s3_server: str) -> dict[str, str]:
    """The settings that point the object store at the session's S3 server."""
    return {
        "LORAHUB_S3_ENDPOINT": s3_server,
        "LORAHUB_S3_BUCKET": S3_ENV["LORAHUB_S3_BUCKET"],
        "LORAHUB_S3_ACCESS_KEY": S3_ENV["LORAHUB_S3_ACCESS_KEY"],
        "LORAHUB_S3_SECRET_KEY": S3_ENV["LORAHUB_S3_SECRET_KEY"],
    }


def empty_the_bucket() -> None:
    """Forget the cached store (settings may have changed) and empty the test bucket."""
    from apps.registry import storage

    storage.get_store.cache_clear()
    store = storage.get_store()
    for top in {info.key.split("/")[0] for info in store.list("")}:
        store.delete_prefix(top)
