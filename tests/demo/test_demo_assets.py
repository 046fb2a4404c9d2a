"""The demo asset builder: idempotent, standard PEFT output, and extras vLLM can load."""

from __future__ import annotations

import json

import pytest

from apps.demo import assets as demo_assets
from apps.demo import corpus
from apps.serving.node.engine import AdapterHandle
from tests.serving.node import engine_path


def test_a_second_build_leaves_the_finished_build_alone(demo_dir):
    before = (demo_dir / "base-model" / "model.safetensors").stat().st_mtime_ns
    result = demo_assets.build_demo_assets(demo_dir=demo_dir)
    assert result.built is False
    assert (demo_dir / "base-model" / "model.safetensors").stat().st_mtime_ns == before


def test_demo_adapters_are_standard_peft_for_the_platform_base_model(demo_dir):
    ranks = set()
    for spec in demo_assets.DEMO_ADAPTERS:
        folder = demo_dir / "adapters" / spec.name
        assert sorted(p.name for p in folder.iterdir()) == [
            "adapter_config.json",
            "adapter_model.safetensors",
        ]
        config = json.loads((folder / "adapter_config.json").read_text())
        assert config["peft_type"] == "LORA"
        assert config["base_model_name_or_path"] == corpus.BASE_MODEL_NAME
        assert config["revision"] == corpus.BASE_MODEL_REVISION
        ranks.add(config["r"])
    assert len(ranks) >= 2


def test_the_prompt_set_has_at_least_ten_prompts_half_unseen_in_training():
    training = set(corpus.training_questions())
    assert len(corpus.DEMO_PROMPTS) >= 10
    unseen = [p for p in corpus.DEMO_PROMPTS if p not in training]
    assert len(unseen) * 2 >= len(corpus.DEMO_PROMPTS)


@pytest.mark.engine
def test_extra_untrained_adapters_are_valid_loras_for_the_engine(engine, demo_dir):
    extras = demo_assets.build_extra_adapters(demo_dir=demo_dir, count=2)
    assert [p.name for p in extras] == ["extra-000", "extra-001"]
    assert demo_assets.build_extra_adapters(demo_dir=demo_dir, count=2) == extras
    extra = AdapterHandle(lora_id=900, name="extra-001", path=extras[1])
    assert engine.run(engine.engine.add_adapter(extra)) is True
    assert 900 in engine.run(engine.engine.list_adapters())
    prompt = corpus.completion_prompt(corpus.DEMO_PROMPTS[0])
    completion = engine.run(
        engine_path.complete(engine.engine, prompt, adapter=extra, max_tokens=8)
    )
    assert completion.token_ids
    assert engine.run(engine.engine.remove_adapter(900)) is True
    assert 900 not in engine.run(engine.engine.list_adapters())
