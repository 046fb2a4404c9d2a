"""Where the CLI finds the server and the key: flags, then ``LORAHUB_URL`` /
``LORAHUB_API_KEY`` / ``LORAHUB_INFERENCE_URL``, then what ``lorahub login`` stored in the
user's config directory (``LORAHUB_CONFIG`` names another file), readable by the user only."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import typer


@dataclass
class Settings:
    url: str = ""
    api_key: str = ""
    inference_url: str = ""


def config_path() -> Path:
    override = os.environ.get("LORAHUB_CONFIG")
    if override:
        return Path(override)
    return Path(typer.get_app_dir("lorahub")) / "config.json"


def stored() -> Settings:
    path = config_path()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return Settings()
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"cannot read {path} ({exc}); run `lorahub login` again") from None
    return Settings(**{k: str(raw.get(k) or "") for k in ("url", "api_key", "inference_url")})


def resolve(url: str | None = None, api_key: str | None = None) -> Settings:
    saved = stored()
    return Settings(
        url=url or os.environ.get("LORAHUB_URL") or saved.url,
        api_key=api_key or os.environ.get("LORAHUB_API_KEY") or saved.api_key,
        inference_url=os.environ.get("LORAHUB_INFERENCE_URL") or saved.inference_url,
    )


def save(settings: Settings) -> Path:
    """Write the settings with mode 0600 (created so, never widened first), atomically."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(asdict(settings), handle, indent=2)
    os.chmod(partial, 0o600)
    os.replace(partial, path)
    return path
