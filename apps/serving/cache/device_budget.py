"""What the device slots cost: the memory vLLM reserves for each LoRA slot, and whether a
cache configuration's ``gpu_hot`` fits its ``max_memory_gb``. Pure arithmetic on the base
model's config.json: the console checks an operator's configuration with it, the engine its
start-up one; neither needs vLLM for it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lorahub.cacheconfig import CacheConfig

# Architectures laid out as Llama (q/k/v/o attention, gate/up/down MLP), whose device-slot
# reservation ``device_slot_bytes`` computes; for others the budget is not checked.
LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3"}
DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


def device_slot_bytes(model_config: dict, rank: int, dtype: str) -> int | None:
    """Device memory vLLM reserves for one LoRA slot: at start it allocates, for every
    attention and MLP projection and for the token embedding and LM head, an A buffer
    (rank x input) and a B buffer (output x rank) per slot at ``max_lora_rank``, whatever the
    adapters loaded later target (``vllm/lora/layers/``). On the demo model this equals the
    sum of the engine's ``lora_a_stacked`` / ``lora_b_stacked`` buffers exactly (385,024 bytes
    a slot, measured in an engine with 4 slots of rank 16). ``model_config``: the base model's
    config.json. None for an architecture this does not know the layout of."""
    if model_config.get("model_type") not in LLAMA_LIKE:
        return None
    try:
        hidden = int(model_config["hidden_size"])
        inner = int(model_config["intermediate_size"])
        layers = int(model_config["num_hidden_layers"])
        heads = int(model_config["num_attention_heads"])
        kv_heads = int(model_config.get("num_key_value_heads") or heads)
        head_dim = int(model_config.get("head_dim") or hidden // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    if dtype == "auto":
        dtype = str(model_config.get("torch_dtype") or model_config.get("dtype") or "bfloat16")
    q, kv = heads * head_dim, kv_heads * head_dim
    projections = [  # (input, output): q k v o, gate up down
        (hidden, q),
        (hidden, kv),
        (hidden, kv),
        (q, hidden),
        (hidden, inner),
        (hidden, inner),
        (inner, hidden),
    ]
    per_layer = sum(rank * (inputs + outputs) for inputs, outputs in projections)
    vocab = int(model_config.get("vocab_size") or 0)
    ends = 2 * rank * (vocab + hidden)  # the token embedding and the LM head, once each
    return (per_layer * layers + ends) * DTYPE_BYTES.get(dtype, 4)


def device_budget_problem(cache: CacheConfig, model_dir: Path, dtype: str) -> str | None:
    """Why ``gpu_hot.max_memory_gb`` cannot hold the device slots ``gpu_hot`` asks for, or
    None (also when the base model's config cannot be read: nothing to check against)."""
    import json

    hot = cache.adapter_cache.gpu_hot
    try:
        model_config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    per_slot = device_slot_bytes(model_config, hot.max_lora_rank, dtype)
    if per_slot is None:
        return None
    needed, budget = per_slot * hot.max_adapters, hot.max_memory_gb * 1024**3
    if needed <= budget:
        return None
    fits = int(budget // per_slot)
    return (
        f"adapter_cache.gpu_hot.max_memory_gb: {hot.max_adapters} device slots of rank "
        f"{hot.max_lora_rank} for {cache.base_model} reserve {needed / 1048576:.1f} MB "
        f"({per_slot / 1048576:.2f} MB each), over the {hot.max_memory_gb:g} GB budget; "
        f"raise max_memory_gb to at least {needed / 1024**3:.3g} or lower max_adapters "
        f"(at most {fits} fit) or max_lora_rank"
    )
