"""Install packages into a virtualenv with uv, from the sources pip is configured with.

Usage: ``python tools/uv_install.py VENV_PYTHON REQUIREMENT...`` (what ``make install`` runs).
pip's configuration is read, and uv run, by the Python that runs this script, so a bare
virtualenv (no pip, no uv: ``tests/client/test_install.py``'s) can be the target.

Why: uv resolves and installs this project's ~230 packages in ~20 s on two cores, where pip
takes 60-110 s, most of it reading every file link on PyPI's pages one by one. But uv does not
read pip's configuration, and a machine may point pip at a mirror, at local wheels or at a
constraints file (this one does all three). So this reads what ``pip config list`` reports
(pip.conf files and ``PIP_*`` variables, with pip's precedence) and says the same to uv.

It translates only the settings that say where packages come from, and the ones that only
change how pip itself behaves are ignored. For any other setting it installs nothing and exits
with status 3, naming the setting: the Makefile then installs with pip, so a configuration
that uv cannot be told is never silently dropped.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

UNTRANSLATABLE = 3

# pip's setting -> uv's option; each value is a whitespace-separated list, as in pip.conf
LIST_OPTIONS = {
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}
SINGLE_OPTIONS = {"index-url": "--index-url"}
FLAG_OPTIONS = {"no-index": "--no-index"}
# pip's setting -> the environment variable uv reads for it
ENV_OPTIONS = {
    "cert": "SSL_CERT_FILE",
    "default-timeout": "UV_HTTP_TIMEOUT",
    "timeout": "UV_HTTP_TIMEOUT",
}
# settings about pip itself (its cache, its output, its version check, byte-compiling, which
# uv does not do unless asked), not about where packages come from
PIP_ONLY = {
    "cache-dir",
    "disable-pip-version-check",
    "no-cache-dir",
    "no-color",
    "no-compile",
    "no-input",
    "no-python-version-warning",
    "progress-bar",
    "quiet",
    "require-virtualenv",
    "root-user-action",
    "verbose",
}
# pip reads `install` settings over `global` ones, and PIP_* variables over both
PRECEDENCE = ("global", "install", ":env:")
TRUE = {"1", "true", "yes", "on"}


class Untranslatable(Exception):
    """A pip setting that uv cannot be told."""


@dataclass
class UvSources:
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def parse_pip_config(listing: str) -> dict[str, str]:
    """``pip config list`` output (``section.key='value'`` lines) as key -> value, where a
    key set in several sections takes the value pip would use. Sections for other pip
    commands (``download``, ``wheel``, ...) do not apply to an install."""
    found: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        if not line.strip():
            continue
        name, _, raw = line.partition("=")
        section, _, key = name.rpartition(".")
        if section not in PRECEDENCE:
            continue
        rank = PRECEDENCE.index(section)
        if key not in found or rank >= found[key][0]:
            found[key] = (rank, str(ast.literal_eval(raw)))
    return {key: value for key, (_, value) in found.items()}


def uv_sources(config: Mapping[str, str]) -> UvSources:
    """uv's options and environment for pip's settings; raises ``Untranslatable``."""
    sources = UvSources()
    for key, value in sorted(config.items()):
        if key in PIP_ONLY:
            continue
        if key in LIST_OPTIONS:
            for item in value.split():
                sources.args += [LIST_OPTIONS[key], item]
        elif key in SINGLE_OPTIONS:
            sources.args += [SINGLE_OPTIONS[key], value]
        elif key in FLAG_OPTIONS:
            if value.strip().lower() in TRUE:
                sources.args.append(FLAG_OPTIONS[key])
        elif key in ENV_OPTIONS:
            sources.env[ENV_OPTIONS[key]] = value
        else:
            raise Untranslatable(f"pip is configured with {key}={value!r}, which uv cannot be told")
    return sources


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    python, requirements = argv[0], argv[1:]
    tool = sys.executable  # has pip and uv (the Makefile runs this with the target itself)
    listing = subprocess.run(
        [tool, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    try:
        sources = uv_sources(parse_pip_config(listing))
    except Untranslatable as exc:
        print(f"{exc}; installing with pip", file=sys.stderr)
        return UNTRANSLATABLE
    command = [
        *(tool, "-m", "uv", "pip", "install", "--quiet", "--python", python),
        # pip's rule: the best version across every index, not the first index that has any
        *("--index-strategy", "unsafe-best-match"),
        *sources.args,
        *requirements,
    ]
    return subprocess.run(command, env={**os.environ, **sources.env}, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
