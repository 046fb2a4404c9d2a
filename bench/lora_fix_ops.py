"""What the negative-index fix (``apps/serving/node/lora_fix.py``) costs vLLM's CPU LoRA ops.

The fix's first version zeroed a base-model row by multiplying the *gathered weights* (one
rank-by-width copy per token) by a mask; it now zeroes the *result* rows. Both against vLLM's
own op (which gives base-model rows the last adapter: the bug), on seed-scale shapes (rank
128, width 2816: the seed profile's ``down_proj``), one thread, a third of the rows base-model.
Each repetition times the three in a rotated order; the median of the repetitions is printed,
with an A/A column (the current op against a second timing of itself).

Usage: .venv/bin/python bench/lora_fix_ops.py [--reps 5] [--calls 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def weights_masked(inputs, weights, output, indices, scaling=1.0):
    """The fix as it was: the gathered per-token weights multiplied by the mask."""
    import torch

    selected = weights[indices.clamp(min=0)].to(dtype=output.dtype)
    if selected.dim() == 4:
        selected = selected.squeeze(dim=1)
    keep = (indices >= 0).to(dtype=output.dtype).view(-1, *([1] * (selected.dim() - 1)))
    selected = selected * keep
    outputs = torch.einsum("bi, boi -> bo", inputs.to(dtype=output.dtype), selected)
    output[:, : outputs.shape[1]] = scaling * outputs[:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    import torch
    from vllm.lora.ops.torch_ops import lora_ops

    from apps.serving.node import lora_fix

    torch.set_num_threads(1)
    vllm_op = lora_ops.__dict__.get("_lorahub_original_bgmv_shrink", lora_ops.bgmv_shrink)
    ops = {
        "vLLM's (wrong rows)": vllm_op,
        "weights masked": weights_masked,
        "results masked": lora_fix.bgmv_shrink,
        "results masked (A/A)": lora_fix.bgmv_shrink,
    }
    print(f"{'tokens':>6}" + "".join(f"{name:>24}" for name in ops) + f"{'before / now':>16}")
    for tokens in (4, 16, 64):
        gen = torch.Generator().manual_seed(tokens)
        weights = torch.randn(4, 1, 128, 2816, generator=gen)
        inputs = torch.randn(tokens, 2816, generator=gen)
        output = torch.zeros(tokens, 128)
        indices = torch.tensor([-1 if i % 3 == 0 else i % 4 for i in range(tokens)])
        times: dict[str, list[float]] = {name: [] for name in ops}
        names = list(ops)
        for rep in range(args.reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                op = ops[name]
                op(inputs, weights, output, indices, 1.0)
                started = time.perf_counter()
                for _ in range(args.calls):
                    op(inputs, weights, output, indices, 1.0)
                times[name].append((time.perf_counter() - started) / args.calls * 1000)
        med = {name: statistics.median(ms) for name, ms in times.items()}
        print(
            f"{tokens:>6}"
            + "".join(f"{med[name]:>21.2f} ms" for name in ops)
            + f"{med['weights masked'] / med['results masked']:>15.1f}x"
        )


if __name__ == "__main__":
    main()
