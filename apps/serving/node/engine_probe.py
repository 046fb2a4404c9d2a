"""What the engine did with adapters, counted inside vLLM's worker: loads, the step boundaries
each cost its request, device-slot activations nobody scheduled, steps that carried a load.

The node cannot see vLLM's steps from its own process; this probe counts them where they
happen and answers the node through vLLM's ``collective_rpc`` (``Engine.adapter_counts``, a
utility call between two steps; the node asks only when ``/internal/cache`` is read).

- **Steps**: every ``execute_model`` that scheduled tokens; the requests scheduled for the
  first time in it (``scheduled_new_reqs``) with their LoRA ids.
- **Loads** (``WorkerLoRAManager._load_adapter``: reading an adapter from disk into the host
  cache), each inside a step (the step that schedules its request, as stock vLLM and the
  node's boarding load) or between steps (an ``add_lora``). A load's **boundaries**: the
  step boundaries from the one its load began at to the first step of a request for it,
  counting that one: 1 when a step loads the adapter of a request it schedules; 2 when an
  ``add_lora`` ran first and the request arrived after it had answered.
- **Activations** (``LoRAModelManager.activate_adapter`` copying an adapter into a device
  slot): in a step (its batch needs it) or outside one (``add_lora``, which vLLM makes
  activate and ``quiet_adds.py`` stops).

Loaded by ``lora_fix.register`` in every vLLM process; it patches only where vLLM's worker
classes import (the engine core's process on the CPU) and once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

_PATCHED_FLAG = "_lorahub_probe"
_lock = threading.Lock()
_state = {"in_step": False, "step": 0, "step_loaded": False}
_counts: dict[str, float] = {
    "steps": 0,
    "loads_in_step": 0,
    "loads_between_steps": 0,
    "load_ms": 0.0,
    "activations_in_step": 0,
    "activations_outside_steps": 0,
    "steps_with_a_load": 0,
    "longest_step_with_a_load_ms": 0.0,
    "step_ms": 0.0,
}
# LoRA id -> the step its latest load began at (a load between steps: the next step)
_loaded_at: dict[int, int] = {}
_boundaries: dict[int, int] = {}  # boundaries per load, counted when its request first runs


def counts() -> dict[str, Any]:
    """The totals so far and how many loads cost each number of boundaries."""
    with _lock:
        return {**_counts, "boundaries": dict(_boundaries)}


def _step(inner):
    def execute_model(self, *args, **kwargs):
        output = args[0] if args else kwargs.get("scheduler_output")
        scheduled = bool(output is not None and output.num_scheduled_tokens)
        if not scheduled:
            return inner(self, *args, **kwargs)
        _state.update(in_step=True, step_loaded=False)
        _state["step"] += 1
        started = time.perf_counter()
        try:
            return inner(self, *args, **kwargs)
        finally:
            ms = (time.perf_counter() - started) * 1000
            _state["in_step"] = False
            with _lock:
                _counts["steps"] += 1
                _counts["step_ms"] += ms
                if _state["step_loaded"]:
                    _counts["steps_with_a_load"] += 1
                    longest = _counts["longest_step_with_a_load_ms"]
                    _counts["longest_step_with_a_load_ms"] = max(longest, ms)
                for new in getattr(output, "scheduled_new_reqs", ()):
                    lora = getattr(new, "lora_request", None)
                    began = _loaded_at.pop(lora.lora_int_id, None) if lora else None
                    if began is not None:
                        n = _state["step"] - began + 1
                        _boundaries[n] = _boundaries.get(n, 0) + 1

    return execute_model


def _load(inner):
    def _load_adapter(self, lora_request):
        started = time.perf_counter()
        try:
            return inner(self, lora_request)
        finally:
            ms = (time.perf_counter() - started) * 1000
            in_step = _state["in_step"]
            with _lock:
                _counts["loads_in_step" if in_step else "loads_between_steps"] += 1
                _counts["load_ms"] += ms
                _loaded_at[lora_request.lora_int_id] = _state["step"] + (0 if in_step else 1)
            if in_step:
                _state["step_loaded"] = True

    return _load_adapter


def _activate(inner):
    def activate_adapter(self, lora_id):
        copied = inner(self, lora_id)
        if copied:
            key = "activations_in_step" if _state["in_step"] else "activations_outside_steps"
            with _lock:
                _counts[key] += 1
        return copied

    return activate_adapter


def lorahub_adapter_counts(worker) -> dict[str, Any]:
    """The worker method ``collective_rpc`` calls."""
    return counts()


def register() -> None:
    try:
        from vllm.lora.model_manager import LoRAModelManager
        from vllm.lora.worker_manager import WorkerLoRAManager
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        from vllm.v1.worker.worker_base import WorkerBase
    except ImportError:  # a vLLM without these modules: nothing to count
        return
    if getattr(WorkerBase, _PATCHED_FLAG, False):
        return
    GPUModelRunner.execute_model = _step(GPUModelRunner.execute_model)
    WorkerLoRAManager._load_adapter = _load(WorkerLoRAManager._load_adapter)
    LoRAModelManager.activate_adapter = _activate(LoRAModelManager.activate_adapter)
    WorkerBase.lorahub_adapter_counts = lorahub_adapter_counts
    setattr(WorkerBase, _PATCHED_FLAG, True)
