"""Every test here is marked ``security``: ``pytest -m security`` runs the trust boundary's
tests alone (docs/security.md, "Threat model")."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/security/" in str(item.fspath):
            item.add_marker(pytest.mark.security)
