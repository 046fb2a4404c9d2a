"""Checks that an uploaded adapter is a LoRA the platform can serve, before anyone reviews it.

Pure functions over a directory of files and a description of the base model; no ORM, no
storage. Each failure raises ``Rejected`` with a message that names the problem and the fix.
Weights are never unpickled: only safetensors are accepted, and they are parsed from their
JSON header and scanned as raw arrays (numpy memory maps), never executed.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from apps.registry.errors import Rejected
from apps.registry.signing import sha256_file

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
OPTIONAL_NAMES = frozenset({"README.md"})
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy", ".npz")
MAX_HEADER_BYTES = 16 * 1024 * 1024
TENSOR_RE = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.([a-z_]+)\.lora_([AB])\.weight$"
)
FLOAT_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16}
DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


@dataclass(frozen=True)
class BaseModelSpec:
    """What an adapter must fit: name, revision, layer count and each linear module's shape."""

    name: str
    revision: str
    num_layers: int
    modules: dict[str, dict[str, Any]]  # "q_proj" -> {"path": "self_attn", "in": 128, "out": 128}
    max_lora_rank: int


@dataclass(frozen=True)
class ValidatedAdapter:
    base_model: str
    base_model_revision: str
    rank: int
    lora_alpha: float
    target_modules: tuple[str, ...]
    files: dict[str, dict[str, Any]]  # name -> {"sha256", "size"}
    # what a reviewer reads: tensor count, dtypes, and per target module the layers and the
    # Frobenius norms of its lora_A and lora_B weights (summed over layers)
    report: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        return sum(meta["size"] for meta in self.files.values())


def llama_modules(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Linear-module shapes of a Llama-architecture model from its config.json."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config.get("num_key_value_heads", heads) * head_dim
    inter = config["intermediate_size"]
    return {
        "q_proj": {"path": "self_attn", "in": hidden, "out": heads * head_dim},
        "k_proj": {"path": "self_attn", "in": hidden, "out": kv},
        "v_proj": {"path": "self_attn", "in": hidden, "out": kv},
        "o_proj": {"path": "self_attn", "in": heads * head_dim, "out": hidden},
        "gate_proj": {"path": "mlp", "in": hidden, "out": inter},
        "up_proj": {"path": "mlp", "in": hidden, "out": inter},
        "down_proj": {"path": "mlp", "in": inter, "out": hidden},
    }


def check_file_names(names: list[str]) -> None:
    """The set of files must be exactly one config + one safetensors file (+ README.md)."""
    base_names = [Path(n).name for n in names]
    for name in base_names:
        if name.lower().endswith(PICKLE_SUFFIXES):
            raise Rejected(
                f"'{name}' is a pickle-based weights file, which can run code when loaded; "
                "lorahub accepts only safetensors. Save with "
                "model.save_pretrained(dir, safe_serialization=True) and upload "
                f"{WEIGHTS_NAME}"
            )
    for name in set(base_names):
        if base_names.count(name) > 1:
            raise Rejected(f"the upload holds '{name}' more than once; keep one copy")
    for required in (CONFIG_NAME, WEIGHTS_NAME):
        if required not in base_names:
            raise Rejected(
                f"the upload has no {required}; a PEFT adapter needs {CONFIG_NAME} and "
                f"{WEIGHTS_NAME}"
            )
    extra = sorted(set(base_names) - {CONFIG_NAME, WEIGHTS_NAME} - OPTIONAL_NAMES)
    if extra:
        raise Rejected(
            f"unexpected file(s) {', '.join(extra)}; an adapter upload holds {CONFIG_NAME} "
            f"and {WEIGHTS_NAME} (and optionally README.md)"
        )


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Rejected(
            f"{CONFIG_NAME} is not valid JSON ({exc}); fix the file and upload again"
        ) from None
    if not isinstance(config, dict):
        raise Rejected(f"{CONFIG_NAME} must be a JSON object")
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise Rejected(
            f"{CONFIG_NAME} has peft_type {config.get('peft_type')!r}; "
            "only LORA adapters are served"
        )
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise Rejected(
            f"{CONFIG_NAME}: 'r' (the LoRA rank) must be a positive integer, got {rank!r}"
        )
    alpha = config.get("lora_alpha", rank)
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or alpha <= 0:
        raise Rejected(f"{CONFIG_NAME}: 'lora_alpha' must be a positive number, got {alpha!r}")
    targets = config.get("target_modules")
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise Rejected(
            f"{CONFIG_NAME}: 'target_modules' must be a non-empty list of module names "
            'such as ["q_proj", "v_proj"]'
        )
    for key in ("rank_pattern", "alpha_pattern"):
        if config.get(key):
            raise Rejected(f"{CONFIG_NAME}: '{key}' is not supported; use one rank for all modules")
    if config.get("use_dora"):
        raise Rejected(f"{CONFIG_NAME}: DoRA adapters (use_dora) are not supported")
    if config.get("modules_to_save"):
        raise Rejected(
            f"{CONFIG_NAME}: 'modules_to_save' would replace base-model weights; "
            "only LoRA deltas are served"
        )
    return config


def _read_header(path: Path) -> tuple[dict[str, Any], int]:
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise Rejected(f"{WEIGHTS_NAME} is too short to be a safetensors file")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(MAX_HEADER_BYTES, size - 8):
            raise Rejected(f"{WEIGHTS_NAME} is not a valid safetensors file (bad header length)")
        try:
            header = json.loads(fh.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise Rejected(f"{WEIGHTS_NAME} is not a valid safetensors file (bad header)") from None
    if not isinstance(header, dict):
        raise Rejected(f"{WEIGHTS_NAME} is not a valid safetensors file (bad header)")
    header.pop("__metadata__", None)
    data_len = size - 8 - header_len
    spans = []
    for name, info in header.items():
        try:
            dtype, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise Rejected(
                f"{WEIGHTS_NAME}: tensor '{name}' has a malformed header entry"
            ) from None
        if dtype not in DTYPE_SIZES:
            raise Rejected(
                f"{WEIGHTS_NAME}: tensor '{name}' has dtype {dtype}; LoRA weights must be "
                "F32, F16, BF16 or F64"
            )
        count = int(np.prod(shape)) if shape else 1
        if not (0 <= start <= end <= data_len) or end - start != count * DTYPE_SIZES[dtype]:
            raise Rejected(
                f"{WEIGHTS_NAME}: tensor '{name}' points outside the file or has the wrong size"
            )
        spans.append((start, end))
    spans.sort()
    for (_, prev_end), (start, _) in itertools.pairwise(spans):
        if start < prev_end:
            raise Rejected(f"{WEIGHTS_NAME}: tensors overlap; the file is corrupt")
    return header, 8 + header_len


def _check_tensors(header: dict[str, Any], config: dict[str, Any], base: BaseModelSpec) -> None:
    rank = config["r"]
    targets = set(config["target_modules"])
    seen: dict[tuple[int, str], set[str]] = {}
    if not header:
        raise Rejected(f"{WEIGHTS_NAME} holds no tensors")
    for name, info in header.items():
        match = TENSOR_RE.match(name)
        if not match:
            raise Rejected(
                f"{WEIGHTS_NAME}: unexpected tensor '{name}'; expected PEFT LoRA names like "
                "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
            )
        layer, path, module, ab = int(match[1]), match[2], match[3], match[4]
        spec = base.modules.get(module)
        if spec is None or spec["path"] != path:
            raise Rejected(f"{WEIGHTS_NAME}: tensor '{name}' targets a module the base model lacks")
        if module not in targets:
            raise Rejected(
                f"{WEIGHTS_NAME}: tensor '{name}' is for {module}, which target_modules "
                "in adapter_config.json does not list"
            )
        if layer >= base.num_layers:
            raise Rejected(
                f"{WEIGHTS_NAME}: tensor '{name}' is for layer {layer}, but {base.name} has "
                f"{base.num_layers} layers"
            )
        expected = [rank, spec["in"]] if ab == "A" else [spec["out"], rank]
        if list(info["shape"]) != expected:
            raise Rejected(
                f"{WEIGHTS_NAME}: tensor '{name}' has shape {list(info['shape'])}, expected "
                f"{expected} for rank {rank} on {base.name}"
            )
        seen.setdefault((layer, module), set()).add(ab)
    for (layer, module), parts in sorted(seen.items()):
        if parts != {"A", "B"}:
            missing = ({"A", "B"} - parts).pop()
            raise Rejected(f"{WEIGHTS_NAME}: layer {layer} {module} has no lora_{missing} weight")


def _check_finite(path: Path, header: dict[str, Any], data_start: int) -> dict[str, Any]:
    """Refuse NaN or infinite weights; return the reviewer's report, read in the same pass."""
    squares: dict[str, dict[str, float]] = {}
    layers: dict[str, set[int]] = {}
    dtypes: set[str] = set()
    for name, info in header.items():
        dtypes.add(info["dtype"])
        start, end = info["data_offsets"]
        if end == start:
            continue
        raw = np.memmap(
            path,
            dtype=FLOAT_DTYPES[info["dtype"]],
            mode="r",
            offset=data_start + start,
            shape=((end - start) // DTYPE_SIZES[info["dtype"]],),
        )
        values = (raw.astype(np.uint32) << 16).view(np.float32) if info["dtype"] == "BF16" else raw
        if not np.isfinite(values).all():
            raise Rejected(
                f"{WEIGHTS_NAME}: tensor '{name}' contains NaN or infinite values; the training "
                "run probably diverged"
            )
        match = TENSOR_RE.match(name)
        if match:
            module, ab = match[3], match[4]
            sums = squares.setdefault(module, {"A": 0.0, "B": 0.0})
            sums[ab] += float(np.square(values, dtype=np.float64).sum())
            layers.setdefault(module, set()).add(int(match[1]))
    return {
        "tensors": len(header),
        "dtypes": sorted(dtypes),
        "modules": {
            module: {
                "layers": len(layers[module]),
                "norm_a": round(sums["A"] ** 0.5, 6),
                "norm_b": round(sums["B"] ** 0.5, 6),
            }
            for module, sums in sorted(squares.items())
        },
    }


def validate_adapter(
    folder: Path, *, base_models: list[BaseModelSpec], revision_hint: str | None = None
) -> ValidatedAdapter:
    """Validate the adapter files in ``folder`` against the platform's base models."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    check_file_names(names)
    config = _read_config(folder / CONFIG_NAME)
    base_name = config.get("base_model_name_or_path")
    revision = config.get("revision") or revision_hint
    served = sorted({b.name for b in base_models})
    candidates = [b for b in base_models if b.name == base_name]
    if not candidates:
        raise Rejected(
            f"{CONFIG_NAME}: base_model_name_or_path is {base_name!r}, which this platform does "
            f"not serve; it serves {', '.join(served) or 'no base model yet'}"
        )
    if not revision:
        raise Rejected(
            f'{CONFIG_NAME} names no base model revision; add "revision": '
            f'"{candidates[0].revision}" (or send it as base_model_revision with the upload)'
        )
    base = next((b for b in candidates if b.revision == revision), None)
    if base is None:
        raise Rejected(
            f"the adapter was trained on {base_name}@{revision}, but the platform serves "
            f"{', '.join(f'{b.name}@{b.revision}' for b in candidates)}; retrain on a served "
            "revision"
        )
    if config["r"] > base.max_lora_rank:
        raise Rejected(
            f"the adapter's rank is {config['r']}, above the platform's maximum of "
            f"{base.max_lora_rank}; retrain with r <= {base.max_lora_rank}"
        )
    unknown = sorted(set(config["target_modules"]) - set(base.modules))
    if unknown:
        raise Rejected(
            f"target_modules {', '.join(unknown)} do not exist in {base.name}; it has "
            f"{', '.join(sorted(base.modules))}"
        )
    weights = folder / WEIGHTS_NAME
    header, data_start = _read_header(weights)
    _check_tensors(header, config, base)
    report = _check_finite(weights, header, data_start)
    files = {
        name: {"sha256": sha256_file(folder / name), "size": (folder / name).stat().st_size}
        for name in names
    }
    return ValidatedAdapter(
        base_model=base.name,
        base_model_revision=base.revision,
        rank=config["r"],
        lora_alpha=float(config.get("lora_alpha", config["r"])),
        target_modules=tuple(sorted(config["target_modules"])),
        files=files,
        report=report,
    )
