"""No import cycles among the project's modules, hidden ones included: every import statement
counts — at module level, inside functions, under ``if TYPE_CHECKING:`` — because each is a
dependency a reader has to hold in mind, and a cycle means two modules cannot be understood (or
split) one without the other."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# Every package of the tree, by its folder: the platform, its benches and tools, the client
TREE = ("apps", "lorahub", "bench", "tools", "client/src/lorahub_client")


def module_names(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted name -> file, for each package folder (named from its own folder up, so that
    ``client/src/lorahub_client`` holds ``lorahub_client.*``)."""
    found = {}
    for package in packages:
        home = (root / package).parent
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(home).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imported_names(path: Path, package: str) -> set[str]:
    """Every dotted name an import statement in ``path`` names (``from a import b`` names
    ``a`` and ``a.b``), relative imports resolved from ``package``; outside modules too."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package up
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            names.update([base, *(f"{base}.{alias.name}" for alias in node.names)])
    return names


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """module -> the project's modules it imports, from every import statement in it."""
    modules = module_names(root, packages)
    tops = {Path(package).name for package in packages}

    def owner(name: str) -> str | None:  # the project module a dotted name lives in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target in imported_names(path, package):
            found = owner(target) if target.split(".")[0] in tops else None
            if found and found != name:
                graph[name].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each as a cycle path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [path_through(graph, group) for group in groups]


def path_through(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """One import path around the group, back to where it started: the cycle to break."""
    start, members = group[0], set(group)
    frontier, seen = [[start]], {start}
    while frontier:
        path = frontier.pop(0)
        for nxt in sorted(graph[path[-1]] & members):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                frontier.append([*path, nxt])
    return group


def test_the_tree_has_no_import_cycles():
    """The platform, the benches, the tools and the client (a cycle between benches once hid
    here: ``bench.batching_bound -> bench.many_adapters -> bench.batching_bound``)."""
    found = cycles(import_graph(ROOT, TREE))
    assert found == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_a_hidden_cycle_is_found_and_named(tmp_path):
    """The check itself: a function-level import and a TYPE_CHECKING one close a cycle."""
    package = tmp_path / "apps"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from apps import b\n")
    (package / "b.py").write_text("def f():\n    from apps.c import thing\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from apps.a import x\n"
    )
    (package / "d.py").write_text("import apps.a\n")  # imports into the cycle, not part of it
    assert cycles(import_graph(tmp_path, ("apps",))) == [["apps.a", "apps.b", "apps.c", "apps.a"]]
