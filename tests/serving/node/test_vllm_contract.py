"""The vLLM internals ``apps/serving/node/vllm_front.py`` relies on are those of the installed vLLM.

vllm_front.py overrides private methods of vLLM's serving classes and imports deep module
paths; a vLLM release that renames one would break every request in the middle of serving.
These tests fail first, naming the vLLM version and what changed."""

from __future__ import annotations

import importlib

import pytest

pytestmark = pytest.mark.engine


def test_the_installed_vllm_is_the_release_the_node_s_front_is_written_for():
    import vllm

    try:
        vllm_front = importlib.import_module("apps.serving.node.vllm_front")
    except ImportError as exc:
        pytest.fail(f"vLLM {vllm.__version__}: a module path vllm_front.py imports moved: {exc}")
    assert vllm_front.contract_problems() == []


def test_a_changed_vllm_method_is_reported_with_the_vllm_version(monkeypatch):
    import vllm

    from apps.serving.node import vllm_front

    class Renamed:  # what a release that renamed _maybe_get_adapters would look like
        def __init__(self, engine_client, models, online_renderer, request_logger): ...

        async def _check_model(self, request): ...

        def _maybe_get_lora(self, request): ...

        async def render_completion_request(self, request): ...

        async def create_completion(self, request, raw_request): ...

    contract = [
        (Renamed if cls is vllm_front.OpenAIServingCompletion else cls, name, params)
        for cls, name, params in vllm_front.CONTRACT
    ]
    monkeypatch.setattr(vllm_front, "CONTRACT", contract)
    monkeypatch.setattr(vllm_front, "TESTED_VLLM", "0.1")
    problems = vllm_front.contract_problems()
    assert problems == [
        f"vLLM {vllm.__version__} is installed; lorahub is tested with 0.1.x",
        f"vLLM {vllm.__version__}: Renamed._maybe_get_adapters is gone",
    ]


def test_every_override_in_the_node_s_front_replaces_a_method_vllm_has():
    """An override of a method vLLM no longer calls would silently stop choosing the node's
    adapter: each method the front's classes define must exist on the vLLM class below."""
    from apps.serving.node import vllm_front

    for ours, theirs in (
        (vllm_front._Completions, vllm_front.OpenAIServingCompletion),
        (vllm_front._Chat, vllm_front.OpenAIServingChat),
        (vllm_front._NodeModels, vllm_front.OpenAIServingModels),
    ):
        defined = {
            name
            for klass in ours.__mro__
            if klass.__module__ == vllm_front.__name__
            for name, value in vars(klass).items()
            if callable(value) and not name.startswith("__")
        }
        assert defined, ours
        assert not [name for name in defined if not hasattr(theirs, name)], ours


def test_the_engine_refuses_to_start_without_the_lora_fix_plugin_vllm_would_load(monkeypatch):
    """vLLM only logs a plugin that fails to load; a stale entry point (the package moved the
    module, the virtualenv was not reinstalled) would serve wrong tokens for mixed batches."""
    import importlib.metadata

    from apps.serving.node import engine

    assert engine.lora_fix_problem() is None  # as installed by `make install`
    stale = importlib.metadata.EntryPoint(
        name=engine.LORA_FIX_PLUGIN,
        value="apps.serving.lora_fix:register",
        group="vllm.general_plugins",
    )
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [stale])
    problem = engine.lora_fix_problem()
    assert problem is not None
    assert "apps.serving.lora_fix:register, which does not load" in problem
    assert "run `make install`" in problem
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
    assert "is not installed" in (engine.lora_fix_problem() or "")
