"""Safe unpacking of uploaded adapter archives (.zip, .tar.gz/.tgz, .tar).

Every entry is checked before a byte is written: no absolute paths, no ``..``, no links, no
device files or FIFOs, no duplicate names, and a cap on the total unpacked size that is counted
while streaming (a small archive that inflates to gigabytes stops at the cap). Only regular
files are written, under names this module builds; an archive's own names never become paths
outside the destination.
"""

from __future__ import annotations

import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from apps.registry.errors import Rejected

CHUNK = 1024 * 1024
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar")


def is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def _entry_name(raw: str, archive: str) -> str:
    """The entry's path inside the archive, checked; raise Rejected if it could escape."""
    if raw.startswith(("/", "\\")) or (len(raw) > 1 and raw[1] == ":"):
        raise Rejected(
            f"archive '{archive}' has an entry with an absolute path ('{raw}'); "
            "pack the adapter folder with relative paths"
        )
    parts = PurePosixPath(raw.replace("\\", "/")).parts
    if ".." in parts:
        raise Rejected(
            f"archive '{archive}' has an entry that climbs out of the archive ('{raw}'); "
            "remove '..' from its paths"
        )
    return "/".join(p for p in parts if p not in ("", "."))


class _Budget:
    def __init__(self, limit: int, archive: str) -> None:
        self.left = limit
        self.limit = limit
        self.archive = archive

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise Rejected(
                f"archive '{self.archive}' unpacks to more than {self.limit // (1024 * 1024)} MB, "
                "the upload limit; upload only the adapter's files"
            )


def _copy(src, dest: Path, budget: _Budget) -> None:
    with dest.open("xb") as out:
        while chunk := src.read(CHUNK):
            budget.take(len(chunk))
            out.write(chunk)


def _target(dest_dir: Path, name: str, seen: set[str], archive: str) -> Path:
    if name in seen:
        raise Rejected(f"archive '{archive}' holds '{name}' twice; keep one copy")
    seen.add(name)
    target = dest_dir / name
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def unpack(archive_path: Path, archive_name: str, dest_dir: Path, *, max_bytes: int) -> list[str]:
    """Unpack into ``dest_dir``; return the relative names of the files written."""
    lowered = archive_name.lower()
    budget = _Budget(max_bytes, archive_name)
    seen: set[str] = set()
    if lowered.endswith(".zip"):
        try:
            with zipfile.ZipFile(archive_path) as zf:
                for info in zf.infolist():
                    name = _entry_name(info.filename, archive_name)
                    mode = info.external_attr >> 16
                    if stat.S_ISLNK(mode):
                        raise Rejected(
                            f"archive '{archive_name}' has a symbolic link ('{info.filename}'); "
                            "links are not allowed, include the file itself"
                        )
                    if info.is_dir() or not name:
                        continue
                    # Many zip tools record no file type at all; only a recorded non-regular
                    # type (device, FIFO, socket) is refused.
                    if stat.S_IFMT(mode) and not stat.S_ISREG(mode):
                        raise Rejected(
                            f"archive '{archive_name}' has a special file ('{info.filename}'); "
                            "only regular files are allowed"
                        )
                    with zf.open(info) as src:
                        _copy(src, _target(dest_dir, name, seen, archive_name), budget)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
            raise Rejected(f"'{archive_name}' is not a readable zip archive ({exc})") from None
        return sorted(seen)
    try:
        with tarfile.open(archive_path, mode="r:*") as tf:
            for member in tf:
                name = _entry_name(member.name, archive_name)
                if member.issym() or member.islnk():
                    raise Rejected(
                        f"archive '{archive_name}' has a link ('{member.name}'); "
                        "links are not allowed, include the file itself"
                    )
                if member.isdev() or member.isfifo() or not (member.isfile() or member.isdir()):
                    raise Rejected(
                        f"archive '{archive_name}' has a device or special file "
                        f"('{member.name}'); only regular files are allowed"
                    )
                if member.isdir() or not name:
                    continue
                src = tf.extractfile(member)
                if src is None:
                    raise Rejected(f"archive '{archive_name}': cannot read '{member.name}'")
                with src:
                    _copy(src, _target(dest_dir, name, seen, archive_name), budget)
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, FileExistsError):
            raise Rejected(f"archive '{archive_name}' holds a file twice") from None
        raise Rejected(f"'{archive_name}' is not a readable tar archive ({exc})") from None
    return sorted(seen)
