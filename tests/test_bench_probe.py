"""The benches' load probe is Python source written into vLLM's worker at run time: it must
compile, or a bench records no loads at all (it did, once, from one unescaped newline)."""

from __future__ import annotations

import ast

from bench.many_adapters import PROBE_MODULE


def test_the_load_probe_compiles_with_its_entry_point():
    tree = ast.parse(PROBE_MODULE, "bench_load_probe.py")
    assert "register" in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
