"""The seed-scale profile of the demo assets (``build_demo_assets --profile seed``): adapters of
the seeds' size in PEFT's layout, every projection of every layer, the same bytes every build.
The full profile builds in the bench (``bench/many_adapters.py --profile seed``); here a
narrow shape of it."""

from __future__ import annotations

import json

import pytest

from apps.demo.seed_profile import PROJECTIONS, RANKS, SEED_SHAPE, projection_shapes

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 64,
}


def test_every_rank_of_the_profile_makes_an_adapter_of_the_seeds_size():
    per_rank = sum(i + o for i, o in projection_shapes(SEED_SHAPE).values())
    for rank in RANKS:
        mb = rank * per_rank * SEED_SHAPE["num_hidden_layers"] * 4 / (1 << 20)  # float32
        assert 20 <= mb <= 80, (rank, mb)


@pytest.mark.engine  # torch and safetensors: the engine's environment
def test_the_profile_writes_peft_adapters_on_every_projection_and_rebuilds_only_what_changed(
    demo_dir, tmp_path
):
    from safetensors import safe_open

    from apps.demo.seed_profile import build_seed_profile

    out = tmp_path / "seed"
    first = build_seed_profile(demo_dir=demo_dir, out_dir=out, shape=TINY, ranks=[8, 16, 8])
    assert first.ranks == {"seed-000": 8, "seed-001": 16, "seed-002": 8}
    features = projection_shapes(TINY)
    for name, rank in first.ranks.items():
        folder = out / "adapters" / name
        config = json.loads((folder / "adapter_config.json").read_text())
        assert (config["peft_type"], config["r"]) == ("LORA", rank)
        assert sorted(config["target_modules"]) == sorted(PROJECTIONS)
        with safe_open(str(folder / "adapter_model.safetensors"), "pt") as weights:
            keys = set(weights.keys())
            assert len(keys) == 2 * len(PROJECTIONS) * TINY["num_hidden_layers"]
            down = "base_model.model.model.layers.1.mlp.down_proj"
            assert tuple(weights.get_tensor(f"{down}.lora_A.weight").shape) == (
                rank,
                features["down_proj"][0],
            )
        assert first.sizes[name] == sum(p.stat().st_size for p in folder.iterdir())
    assert (out / "base-model" / "tokenizer.json").exists()

    kept = (out / "adapters" / "seed-000" / "adapter_model.safetensors").stat().st_mtime_ns
    again = build_seed_profile(demo_dir=demo_dir, out_dir=out, shape=TINY, ranks=[8, 16, 16])
    assert (out / "adapters" / "seed-000" / "adapter_model.safetensors").stat().st_mtime_ns == kept
    assert again.ranks["seed-002"] == 16 and again.sizes["seed-002"] > first.sizes["seed-002"]

    elsewhere = build_seed_profile(
        demo_dir=demo_dir, out_dir=tmp_path / "other", shape=TINY, ranks=[8, 16, 16]
    )
    for name in again.ranks:  # the same bytes every build
        a = (out / "adapters" / name / "adapter_model.safetensors").read_bytes()
        b = (tmp_path / "other" / "adapters" / name / "adapter_model.safetensors").read_bytes()
        assert a == b, name
    assert elsewhere.sizes == again.sizes
