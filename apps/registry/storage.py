"""The object store: the registry's source of truth for adapter bytes. The only boto3 user.

Two backends with one interface:

* ``S3Store`` — any S3-compatible endpoint through boto3 (AWS S3, MinIO, moto's server).
* ``LocalStore`` — a directory, the embedded default when no S3 endpoint is configured.

Invariant for both: **a key is written once.** ``put`` refuses a key that exists (S3 uses a
conditional ``If-None-Match: *`` write, so two racing writers cannot both win), which is what
makes published adapter versions immutable at the storage layer too. Keys are produced by the
registry's own code from validated identifiers; ``_check_key`` refuses anything that could
escape the store's namespace, so a caller-supplied string never becomes a path.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO, Protocol

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,1023}$")
CHUNK = 1024 * 1024


class StorageError(Exception):
    """The object store failed or refused an operation."""


class ObjectExists(StorageError):
    """A put to a key that already exists: keys are never overwritten."""


class ObjectMissing(StorageError):
    """No object under that key."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int


def _check_key(key: str) -> str:
    if not _KEY_RE.match(key) or ".." in key.split("/") or "//" in key or key.endswith("/"):
        raise StorageError(f"invalid object key {key!r}")
    return key


class ObjectStore(Protocol):
    def put(self, key: str, data: bytes | BinaryIO) -> ObjectInfo: ...
    def get(self, key: str) -> bytes: ...
    def download(self, key: str, dest: Path) -> int: ...
    def exists(self, key: str) -> bool: ...
    def size(self, key: str) -> int: ...
    def list(self, prefix: str) -> Iterator[ObjectInfo]: ...
    def delete_prefix(self, prefix: str) -> int: ...


class LocalStore:
    """A directory laid out like a bucket. Writes are atomic (temp file + link)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def put(self, key: str, data: bytes | BinaryIO) -> ObjectInfo:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".put-", dir=path.parent)
        size = 0
        try:
            with os.fdopen(fd, "wb") as out:
                if isinstance(data, bytes):
                    out.write(data)
                    size = len(data)
                else:
                    while chunk := data.read(CHUNK):
                        out.write(chunk)
                        size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(tmp, path)  # fails if the key exists: never overwrite
            except FileExistsError:
                raise ObjectExists(
                    f"object {key!r} already exists; keys are never overwritten"
                ) from None
        finally:
            Path(tmp).unlink(missing_ok=True)
        return ObjectInfo(key, size)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectMissing(f"no object {key!r}") from None

    def download(self, key: str, dest: Path) -> int:
        data = self.get(key)
        dest.write_bytes(data)
        return len(data)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            raise ObjectMissing(f"no object {key!r}") from None

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        base = self.root / _check_key(prefix.rstrip("/")) if prefix else self.root
        if not base.exists():
            return
        for path in sorted(base.rglob("*")):
            if path.is_file() and not path.name.startswith(".put-"):
                yield ObjectInfo(path.relative_to(self.root).as_posix(), path.stat().st_size)

    def delete_prefix(self, prefix: str) -> int:
        """Remove every object under ``prefix`` (a failed upload, a cleared staging area) and
        the folders that held them, as a bucket has no folders to leave behind. Folders above
        ``prefix`` stay: another upload may be writing into them."""
        removed = 0
        for info in list(self.list(prefix)):
            self._path(info.key).unlink(missing_ok=True)
            removed += 1
        base = self.root / _check_key(prefix.rstrip("/")) if prefix.strip("/") else None
        if base is not None and base.is_dir():
            for folder in sorted(base.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if folder.is_dir():
                    with contextlib.suppress(OSError):  # not empty: a write under way
                        folder.rmdir()
            with contextlib.suppress(OSError):
                base.rmdir()
        return removed


class S3Store:
    """An S3 bucket through boto3. Creates the bucket on first use if it is missing."""

    def __init__(
        self,
        *,
        endpoint: str,
        bucket: str,
        region: str,
        access_key: str = "",
        secret_key: str = "",
    ) -> None:
        import boto3
        from botocore.config import Config

        self._settings = {
            "endpoint": endpoint,
            "bucket": bucket,
            "region": region,
            "access_key": access_key,
            "secret_key": secret_key,
        }
        self.bucket = bucket
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=region,
            aws_access_key_id=access_key or None,
            aws_secret_access_key=secret_key or None,
            config=Config(
                retries={"max_attempts": 4, "mode": "standard"},
                s3={"addressing_style": "path"},
                connect_timeout=5,
                read_timeout=60,
            ),
        )

    def __reduce__(self):
        """A boto3 client cannot be pickled: another process (the node's download worker)
        gets the settings and makes its own."""
        return (_make_s3_store, (self._settings,))

    def _errors(self):
        from botocore.exceptions import BotoCoreError, ClientError

        return ClientError, BotoCoreError

    def ensure_bucket(self) -> None:
        client_error, _ = self._errors()
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except client_error:
            self.client.create_bucket(Bucket=self.bucket)

    def put(self, key: str, data: bytes | BinaryIO) -> ObjectInfo:
        client_error, core_error = self._errors()
        _check_key(key)
        if isinstance(data, bytes):
            size = len(data)
        else:  # a file: boto3 streams it in chunks, never whole into memory
            start = data.tell()
            size = data.seek(0, os.SEEK_END) - start
            data.seek(start)
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
        except client_error as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in {"PreconditionFailed", "412", "ConditionalRequestConflict"}:
                raise ObjectExists(
                    f"object {key!r} already exists; keys are never overwritten"
                ) from None
            raise StorageError(f"S3 put {key!r} failed: {code or exc}") from exc
        except core_error as exc:
            raise StorageError(f"S3 put {key!r} failed: {exc}") from exc
        return ObjectInfo(key, size)

    def _get_object(self, key: str):
        client_error, core_error = self._errors()
        try:
            return self.client.get_object(Bucket=self.bucket, Key=_check_key(key))
        except client_error as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in {"NoSuchKey", "404"}:
                raise ObjectMissing(f"no object {key!r}") from None
            raise StorageError(f"S3 get {key!r} failed: {code or exc}") from exc
        except core_error as exc:
            raise StorageError(f"S3 get {key!r} failed: {exc}") from exc

    def get(self, key: str) -> bytes:
        return self._get_object(key)["Body"].read()

    def download(self, key: str, dest: Path) -> int:
        body = self._get_object(key)["Body"]
        size = 0
        with dest.open("wb") as out:
            for chunk in body.iter_chunks(CHUNK):
                out.write(chunk)
                size += len(chunk)
        return size

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except ObjectMissing:
            return False
        return True

    def size(self, key: str) -> int:
        client_error, core_error = self._errors()
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=_check_key(key))
        except client_error as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in {"NoSuchKey", "404", "NotFound"}:
                raise ObjectMissing(f"no object {key!r}") from None
            raise StorageError(f"S3 head {key!r} failed: {code or exc}") from exc
        except core_error as exc:
            raise StorageError(f"S3 head {key!r} failed: {exc}") from exc
        return int(head["ContentLength"])

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                yield ObjectInfo(item["Key"], int(item["Size"]))

    def delete_prefix(self, prefix: str) -> int:
        keys = [info.key for info in self.list(_check_key(prefix.rstrip("/")) + "/")]
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch})
        return len(keys)


def _make_s3_store(settings: dict) -> S3Store:
    return S3Store(**settings)


@lru_cache(maxsize=1)
def get_store() -> ObjectStore:
    """The configured store: S3 when LORAHUB_S3_ENDPOINT is set, else the local directory."""
    from django.conf import settings

    if settings.LORAHUB_S3_ENDPOINT:
        store = S3Store(
            endpoint=settings.LORAHUB_S3_ENDPOINT,
            bucket=settings.LORAHUB_S3_BUCKET,
            region=settings.LORAHUB_S3_REGION,
            access_key=settings.LORAHUB_S3_ACCESS_KEY,
            secret_key=settings.LORAHUB_S3_SECRET_KEY,
        )
        store.ensure_bucket()
        return store
    return LocalStore(settings.LORAHUB_LOCAL_STORE_DIR)
