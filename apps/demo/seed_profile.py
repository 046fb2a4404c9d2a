"""The seed-scale profile of the demo assets: a wider base model and 200 adapters of the size
the seeds serve (tens of MB each), built locally, never downloaded. For timing only: the
weights are random (seeded, so every build is the same), the vocabulary is the demo's.

``build_demo_assets --profile seed`` writes it to ``var/seed/`` (``base-model/``,
``adapters/seed-000`` …, ``BUILD.json`` with each adapter's rank and bytes). Ranks are drawn
like a fleet's (most at 64, a tail to 128); every adapter targets every projection of every
layer, in PEFT's layout, as float32 like the engine. With the default shape that is 37-74 MB
an adapter, about 10 GB for 200, and a 0.4 GB base.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apps.demo.assets import peft_config

SEED_SHAPE: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "max_position_embeddings": 512,
}
# rank -> share of the fleet: most adapters at 64, a tail to 128
RANKS = {64: 0.50, 80: 0.15, 96: 0.15, 112: 0.05, 128: 0.15}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SEED = 20261206


@dataclass
class SeedBuild:
    out_dir: Path
    seconds: float
    ranks: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # adapter -> bytes on disk
    base_bytes: int = 0

    def describe(self) -> str:
        sizes = sorted(self.sizes.values())
        mb = 1 << 20
        return (
            f"{len(sizes)} adapters, {sizes[0] / mb:.0f}-{sizes[-1] / mb:.0f} MB each (median "
            f"{sizes[len(sizes) // 2] / mb:.0f} MB), {sum(sizes) / (1 << 30):.1f} GB in all; base "
            f"{self.base_bytes / mb:.0f} MB; built in {self.seconds:.0f} s: {self.out_dir}"
        )


def projection_shapes(shape: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Each projection's (in, out) features."""
    hidden, inner = shape["hidden_size"], shape["intermediate_size"]
    kv = shape["num_key_value_heads"] * (hidden // shape["num_attention_heads"])
    return {
        "q_proj": (hidden, hidden),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (hidden, hidden),
        "gate_proj": (hidden, inner),
        "up_proj": (hidden, inner),
        "down_proj": (inner, hidden),
    }


def draw_ranks(count: int, seed: int = SEED) -> list[int]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [int(r) for r in rng.choice(list(RANKS), size=count, p=list(RANKS.values()))]


def build_seed_profile(
    *,
    demo_dir: Path,
    out_dir: Path,
    adapters: int = 200,
    shape: dict[str, Any] | None = None,
    ranks: list[int] | None = None,
    force: bool = False,
) -> SeedBuild:
    """Write the profile to ``out_dir`` (the demo's tokenizer from ``demo_dir``); adapters
    already there with the same rank are kept, so a second build costs seconds."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    started = time.perf_counter()
    shape = shape or SEED_SHAPE
    ranks = ranks or draw_ranks(adapters)
    marker = out_dir / "BUILD.json"
    wanted = {"shape": shape, "ranks": ranks, "seed": SEED}
    if force and out_dir.exists():
        shutil.rmtree(out_dir)
    built = json.loads(marker.read_text()) if marker.exists() else {}
    base = out_dir / "base-model"
    if built.get("shape") != shape:
        shutil.rmtree(out_dir, ignore_errors=True)
        tokenizer_dir = demo_dir / "base-model"
        demo = json.loads((tokenizer_dir / "config.json").read_text())
        config = LlamaConfig(
            vocab_size=demo["vocab_size"],
            bos_token_id=demo["bos_token_id"],
            eos_token_id=demo["eos_token_id"],
            pad_token_id=demo.get("pad_token_id"),
            tie_word_embeddings=False,
            rms_norm_eps=1e-5,
            **shape,
        )
        config.torch_dtype = "float32"
        torch.manual_seed(SEED)
        LlamaForCausalLM(config).to(torch.float32).save_pretrained(base, safe_serialization=True)
        for name in tokenizer_dir.iterdir():
            if name.name.startswith(("tokenizer", "special_tokens", "generation_config")):
                shutil.copy2(name, base / name.name)
    result = SeedBuild(out_dir, 0.0)
    old_ranks = built.get("ranks", [])
    features = projection_shapes(shape)
    for i, rank in enumerate(ranks):
        name = f"seed-{i:03d}"
        folder = out_dir / "adapters" / name
        weights = folder / "adapter_model.safetensors"
        if not (i < len(old_ranks) and old_ranks[i] == rank and weights.exists()):
            gen = torch.Generator().manual_seed(SEED * 1_000 + i)
            tensors = {}
            for layer in range(shape["num_hidden_layers"]):
                for module, (fan_in, fan_out) in features.items():
                    group = "self_attn" if module in PROJECTIONS[:4] else "mlp"
                    prefix = f"base_model.model.model.layers.{layer}.{group}.{module}"
                    tensors[f"{prefix}.lora_A.weight"] = (
                        torch.randn(rank, fan_in, generator=gen) * 0.01
                    )
                    tensors[f"{prefix}.lora_B.weight"] = (
                        torch.randn(fan_out, rank, generator=gen) * 0.01
                    )
            tmp = folder.with_name(name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(folder, ignore_errors=True)
            tmp.mkdir(parents=True)
            save_file(tensors, tmp / "adapter_model.safetensors")
            (tmp / "adapter_config.json").write_text(peft_config(rank, PROJECTIONS))
            tmp.rename(folder)
        result.ranks[name] = rank
        result.sizes[name] = sum(p.stat().st_size for p in folder.iterdir())
    result.base_bytes = sum(p.stat().st_size for p in base.iterdir())
    result.seconds = time.perf_counter() - started
    marker.write_text(json.dumps({**wanted, "sizes": result.sizes}, indent=1))
    return result
