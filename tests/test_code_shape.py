"""How the code reads: short modules with one job each, functions that fit on a screen
(``../shared/STYLE.md``). The offenders are listed, and none is allowed."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 80


# Where the limits hold so far: the platform's apps, the client and the tools. Still to come
# under them (issue 63): bench/ (many_adapters.py, seed_scale.py, soak.py and eight functions
# over 80 lines) and lorahub/settings.py.
CHECKED = ("apps", "client/src", "tools")


def modules() -> list[Path]:
    return sorted(
        p
        for folder in CHECKED
        for p in (ROOT / folder).rglob("*.py")
        if "migrations" not in p.parts
    )


def test_no_module_in_apps_is_over_450_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in modules()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert long == {}, f"split these along a seam you can name: {long}"


def test_no_function_in_apps_is_over_80_lines():
    long = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = length
    assert long == {}, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_checks_see_an_offender(tmp_path, monkeypatch):
    """The checks themselves: a long file and a long function are named."""
    apps = tmp_path / "apps"
    apps.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (apps / "long.py").write_text(f"def f():\n{body}\n" + "\n" * MAX_FILE_LINES)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    for check in (
        test_no_module_in_apps_is_over_450_lines,
        test_no_function_in_apps_is_over_80_lines,
    ):
        try:
            check()
        except AssertionError as exc:
            assert "apps/long.py" in str(exc)
        else:
            raise AssertionError(f"{check.__name__} passed on an offender")
