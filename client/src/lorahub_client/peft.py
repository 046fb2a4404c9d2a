"""What a PEFT output folder holds that the registry takes, and an upload's file parts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import IO

from lorahub_client.errors import LorahubError

# Its config and safetensors weights. Pickled weights are sent too when they are all there
# is, so that the server's refusal says why.
CONFIG_NAME = "adapter_config.json"
WEIGHT_NAMES = ("adapter_model.safetensors",)
PICKLED_WEIGHT_NAMES = ("adapter_model.bin", "adapter_model.pt", "adapter_model.pth")
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar")


def adapter_files(folder: Path) -> tuple[list[Path], list[str]]:
    """The files of a PEFT output folder (as ``save_pretrained`` writes it) that make the
    upload, and the names left out (a model card, tokenizer files, training state)."""
    config = folder / CONFIG_NAME
    if not config.is_file():
        raise LorahubError(
            f"{folder} has no {CONFIG_NAME}: give the folder PEFT's save_pretrained wrote "
            "(adapter_config.json + adapter_model.safetensors), or a .zip/.tar.gz of them"
        )
    weights = [folder / n for n in WEIGHT_NAMES if (folder / n).is_file()]
    if not weights:
        weights = [folder / n for n in PICKLED_WEIGHT_NAMES if (folder / n).is_file()]
    if not weights:
        raise LorahubError(
            f"{folder} has no adapter_model.safetensors: save the adapter with "
            "save_pretrained(..., safe_serialization=True)"
        )
    chosen = [config, *weights]
    skipped = sorted(p.name for p in folder.iterdir() if p not in chosen)
    return chosen, skipped


class CountingFile:
    """A file that reports how much of it has been read (httpx streams multipart bodies in
    chunks; ``fileno`` lets it know the size, so the body has a Content-Length)."""

    def __init__(self, handle: IO[bytes], on_read: Callable[[int], None]) -> None:
        self._handle, self._on_read = handle, on_read

    def read(self, size: int = -1) -> bytes:
        chunk = self._handle.read(size)
        self._on_read(len(chunk))
        return chunk

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._handle.seek(offset, whence)

    def tell(self) -> int:
        return self._handle.tell()

    def fileno(self) -> int:
        return self._handle.fileno()
