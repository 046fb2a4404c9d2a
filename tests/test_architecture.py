"""The edges of the architecture (``../shared/DESIGN.md``), read from every import statement
(module level, in functions, under ``TYPE_CHECKING``), so that a reader can rely on them:

- dependencies point one way: serving -> registry -> tenants;
- nothing outside the node runtime imports it (the console talks to nodes over HTTP, the
  cache manager drives an engine protocol), except the command that runs a node;
- the node runtime's parts are given what they need by ``node/assembly.py``; none imports it;
- only the engine and its vLLM front (with the vLLM plugin, which vLLM loads in its own
  processes) import vLLM, so the console and the worker start without it.
"""

from __future__ import annotations

from tests.test_import_cycles import ROOT, import_graph, imported_names, module_names

PACKAGES = ("apps", "lorahub")


def edges(graph: dict[str, set[str]], source: str, target: str) -> list[str]:
    """``a -> b`` for every module under ``source`` importing one under ``target``."""

    def under(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    return sorted(
        f"{a} -> {b}"
        for a, imports in graph.items()
        if under(a, source)
        for b in imports
        if under(b, target)
    )


def test_dependencies_point_from_serving_to_registry_to_tenants():
    graph = import_graph(ROOT, PACKAGES)
    assert edges(graph, "apps.registry", "apps.serving") == []
    assert edges(graph, "apps.tenants", "apps.serving") == []
    assert edges(graph, "apps.tenants", "apps.registry") == []
    # evaluations build on the registry and talk to nodes over HTTP; nothing builds on them
    for lower in ("apps.tenants", "apps.registry", "apps.serving"):
        assert edges(graph, lower, "apps.evaluations") == []


def test_the_tier_rules_and_the_replay_read_the_registry_through_its_contracts_only():
    """The cache and the replay run without Django: from the registry they import the node's
    data types, the signature check and the object store, which import no Django either."""
    graph = import_graph(ROOT, PACKAGES)
    pure = {
        "apps.registry",  # its __init__, empty
        "apps.registry.contracts",
        "apps.registry.signing",
        "apps.registry.storage",
    }
    for package in ("apps.serving.cache", "apps.serving.replay"):
        found = {edge.split(" -> ")[1] for edge in edges(graph, package, "apps.registry")}
        assert found <= pure, f"{package} imports {sorted(found - pure)}"
    for module in pure:
        assert not [name for name in graph[module] if name.startswith(("django", "apps."))]


def test_only_the_node_runtime_and_its_command_import_the_node_runtime():
    """The console talks to nodes over HTTP; the cache manager drives any engine with the
    ``EngineSlots`` protocol; the replay, the statistics and the services need no node."""
    graph = import_graph(ROOT, PACKAGES)
    outside = [
        edge
        for edge in edges(graph, "apps", "apps.serving.node")
        if not edge.startswith(("apps.serving.node.", "apps.serving.management.commands.runnode"))
    ]
    assert outside == []


def test_no_part_of_the_node_imports_the_assembly():
    graph = import_graph(ROOT, PACKAGES)
    importers = sorted(a for a, imports in graph.items() if "apps.serving.node.assembly" in imports)
    # only the command that runs a node builds one
    assert importers == ["apps.serving.management.commands.runnode"]


def test_only_the_engine_and_its_vllm_front_import_vllm():
    allowed = {
        "apps.serving.node.engine",
        "apps.serving.node.vllm_front",
        "apps.serving.node.lora_fix",  # the plugin vLLM loads in each of its processes
        "apps.serving.node.quiet_adds",  # ... and its parts: adds that take no device slot
        "apps.serving.node.engine_probe",  # ... and what the engine did with adapters
    }
    found = set()
    for name, path in module_names(ROOT, PACKAGES).items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        if any(n == "vllm" or n.startswith("vllm.") for n in imported_names(path, package)):
            found.add(name)
    assert found == allowed


def test_a_forbidden_edge_is_named(tmp_path):
    """The check itself: a function-level import from registry into serving is an edge."""
    for package in ("apps", "apps/registry", "apps/serving"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "apps/serving/charts.py").write_text("")
    (tmp_path / "apps/registry/views.py").write_text(
        "def page():\n    from apps.serving.charts import figure\n"
    )
    graph = import_graph(tmp_path, ("apps",))
    assert edges(graph, "apps.registry", "apps.serving") == [
        "apps.registry.views -> apps.serving.charts"
    ]


def test_no_two_classes_of_the_serving_app_share_a_name():
    """A name found in two modules makes a reader open both (there were two ``Node`` and two
    ``Trace`` classes); Django's management commands are all ``Command`` by convention."""
    import ast

    found: dict[str, list[str]] = {}
    for name, path in module_names(ROOT, ("apps",)).items():
        if not name.startswith("apps.serving") or ".management.commands." in name:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(name)
    assert {cls: where for cls, where in found.items() if len(where) > 1} == {}
