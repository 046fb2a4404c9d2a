"""Unit test of the CPU LoRA op fix on plain tensors: a row with LoRA index -1 gets no adapter."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vllm.lora.ops.torch_ops import lora_ops  # noqa: E402

from apps.serving import lora_fix  # noqa: E402


def stacked(num_loras: int, out: int, inp: int):
    gen = torch.Generator().manual_seed(0)
    return torch.randn(num_loras, 1, out, inp, generator=gen)


def test_unfixed_vllm_op_applies_the_last_slot_to_base_rows():
    """Documents the bug: if vLLM fixes it upstream this test fails and the plugin can go."""
    weights = stacked(3, 4, 8)
    x = torch.ones(2, 8)
    out = torch.zeros(2, 4)
    original = lora_ops.__dict__.get("_lorahub_original_bgmv_shrink", lora_ops.bgmv_shrink)
    if original is lora_fix.bgmv_shrink:
        pytest.fail("cannot reach vLLM's original op to document the bug")
    original(x, weights, out, torch.tensor([-1, 0]), 1.0)
    assert out[0].abs().sum() > 0


def test_fixed_shrink_gives_zero_for_base_rows_and_the_adapter_for_others():
    weights = stacked(3, 4, 8)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    out = torch.full((3, 4), 7.0)
    lora_fix.bgmv_shrink(x, weights, out, torch.tensor([-1, 2, 0]), 0.5)
    assert torch.equal(out[0], torch.zeros(4))
    assert torch.allclose(out[1], 0.5 * weights[2, 0] @ x[1])
    assert torch.allclose(out[2], 0.5 * weights[0, 0] @ x[2])


def test_fixed_expand_adds_nothing_to_base_rows():
    weights = stacked(2, 6, 4)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(2))
    out = torch.ones(2, 6)
    lora_fix.bgmv_expand(x, weights, out, torch.tensor([-1, 1]), add_inputs=True)
    assert torch.equal(out[0], torch.ones(6))
    assert torch.allclose(out[1], 1 + weights[1, 0] @ x[1])


def test_fixed_expand_slice_touches_only_adapter_rows_in_the_slice():
    weights = stacked(2, 3, 4)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(3))
    out = torch.zeros(2, 8)
    lora_fix.bgmv_expand_slice(x, weights, out, torch.tensor([0, -1]), 2, 3, add_inputs=True)
    assert torch.equal(out[1], torch.zeros(8))
    assert torch.allclose(out[0, 2:5], weights[0, 0] @ x[0])
    assert torch.equal(out[0, :2], torch.zeros(2))
