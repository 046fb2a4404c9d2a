"""Unit test of the CPU LoRA op fix on plain tensors: a row with LoRA index -1 gets no adapter."""

from __future__ import annotations

import pytest

from apps.serving.node import lora_fix

# vLLM's own ops (not the engine on the demo model); torch and vLLM are imported by fixtures,
# so that this module is collected (and deselected) where they are not installed
pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def torch():
    import torch as module

    return module


@pytest.fixture(scope="module")
def lora_ops():
    from vllm.lora.ops.torch_ops import lora_ops as module

    return module


def stacked(torch, num_loras: int, out: int, inp: int):
    gen = torch.Generator().manual_seed(0)
    return torch.randn(num_loras, 1, out, inp, generator=gen)


def test_unfixed_vllm_op_applies_the_last_slot_to_base_rows(torch, lora_ops):
    """Documents the bug: if vLLM fixes it upstream this test fails and the plugin can go."""
    weights = stacked(torch, 3, 4, 8)
    x = torch.ones(2, 8)
    out = torch.zeros(2, 4)
    original = lora_ops.__dict__.get("_lorahub_original_bgmv_shrink", lora_ops.bgmv_shrink)
    if original is lora_fix.bgmv_shrink:
        pytest.fail("cannot reach vLLM's original op to document the bug")
    original(x, weights, out, torch.tensor([-1, 0]), 1.0)
    assert out[0].abs().sum() > 0


def test_fixed_shrink_gives_zero_for_base_rows_and_the_adapter_for_others(torch):
    weights = stacked(torch, 3, 4, 8)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    out = torch.full((3, 4), 7.0)
    lora_fix.bgmv_shrink(x, weights, out, torch.tensor([-1, 2, 0]), 0.5)
    assert torch.equal(out[0], torch.zeros(4))
    assert torch.allclose(out[1], 0.5 * weights[2, 0] @ x[1])
    assert torch.allclose(out[2], 0.5 * weights[0, 0] @ x[2])


def test_fixed_expand_adds_nothing_to_base_rows(torch):
    weights = stacked(torch, 2, 6, 4)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(2))
    out = torch.ones(2, 6)
    lora_fix.bgmv_expand(x, weights, out, torch.tensor([-1, 1]), add_inputs=True)
    assert torch.equal(out[0], torch.ones(6))
    assert torch.allclose(out[1], 1 + weights[1, 0] @ x[1])


def test_fixed_expand_slice_touches_only_adapter_rows_in_the_slice(torch):
    weights = stacked(torch, 2, 3, 4)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(3))
    out = torch.zeros(2, 8)
    lora_fix.bgmv_expand_slice(x, weights, out, torch.tensor([0, -1]), 2, 3, add_inputs=True)
    assert torch.equal(out[1], torch.zeros(8))
    assert torch.allclose(out[0, 2:5], weights[0, 0] @ x[0])
    assert torch.equal(out[0, :2], torch.zeros(2))


def original_ops(lora_ops):
    return tuple(
        lora_ops.__dict__.get(f"_lorahub_original_{name}", getattr(lora_ops, name))
        for name in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
    )


def test_the_probe_tells_vllms_unfixed_ops_from_fixed_ones(lora_ops):
    assert not lora_fix.base_rows_stay_clean(*original_ops(lora_ops))
    fixed = (lora_fix.bgmv_shrink, lora_fix.bgmv_expand, lora_fix.bgmv_expand_slice)
    assert lora_fix.base_rows_stay_clean(*fixed)


def test_the_plugin_patches_nothing_once_vllm_has_the_fix(lora_ops, monkeypatch, caplog):
    """As if the upstream fix (vLLM PR #48421) were installed: vLLM's ops are already right."""
    from vllm.lora.punica_wrapper import punica_cpu

    upstream = {name: getattr(lora_fix, name) for name in lora_fix._FIXED}
    monkeypatch.delattr(lora_ops, lora_fix._PATCHED_FLAG, raising=False)
    for name, op in upstream.items():
        monkeypatch.setattr(lora_ops, name, op)
    before = {name: getattr(punica_cpu, name, None) for name in upstream}
    lora_fix.register()
    assert not getattr(lora_ops, lora_fix._PATCHED_FLAG, False)
    assert {name: getattr(punica_cpu, name, None) for name in upstream} == before
    assert "PR #48421" in caplog.text
