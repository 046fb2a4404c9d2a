"""The vLLM engine, behind a small typed surface. With ``vllm_front.py`` (vLLM's OpenAI serving
layer, which this module loads once the engine has started), the only module that imports
vllm or torch.

Both imports are lazy, so the web console and the Celery worker start without them. Data that
crosses this boundary is frozen dataclasses: the rest of lorahub never sees a vLLM type, and the
engine never sees a caller's string as a path or adapter name (``AdapterHandle`` is built only
by the node's cache from a verified local directory).

Start-up spawns vLLM's engine-core process; callers must construct ``Engine`` under an
``if __name__ == "__main__":`` guard or from a process that already has one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from apps.serving.cache.device_budget import device_budget_problem
from apps.serving.cache.engine_slots import AdapterHandle
from apps.serving.node.generation import EngineDied, EngineNotReady, EngineRefused, Generation

if TYPE_CHECKING:
    from lorahub.cacheconfig import CacheConfig

__all__ = [
    "AdapterHandle",
    "Engine",
    "EngineDied",
    "EngineInfo",
    "EngineNotReady",
    "EngineRefused",
    "EngineSettings",
    "Generation",
]

logger = logging.getLogger(__name__)


LORA_FIX_PLUGIN = "lorahub_lora_fix"


def lora_fix_problem() -> str | None:
    """Why vLLM would start without the LoRA fix (``lora_fix.py``) in its processes, or None.

    vLLM loads general plugins from the installed package's entry points and only logs one
    that fails to load; without this one, base-model rows batched with adapter rows silently
    get an adapter applied. An entry point goes stale when the package moves the module and
    the virtualenv is not reinstalled."""
    from importlib.metadata import entry_points

    ours = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == LORA_FIX_PLUGIN]
    if not ours:
        return f"the vLLM plugin {LORA_FIX_PLUGIN} is not installed; run `make install`"
    try:
        ours[0].load()
    except (ImportError, AttributeError) as exc:
        return (
            f"the vLLM plugin {LORA_FIX_PLUGIN} names {ours[0].value}, which does not load "
            f"({exc}): the installed package is older than this checkout; run `make install`"
        )
    return None


@dataclass(frozen=True)
class EngineSettings:
    """Everything the engine is started with; LoRA limits come from the cache config."""

    model_dir: Path
    served_model_name: str
    base_model_revision: str
    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int
    dtype: str = "float32"
    max_model_len: int = 512
    kv_cache_bytes: int = 64 * 1024 * 1024
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 256
    seed: int = 0
    # The node gives each request a priority from its tenant's standing (serving/fairness.py);
    # with requests of one priority, vLLM's priority policy is first come, first served.
    scheduling_policy: str = "priority"
    prefix_caching: bool = False

    @classmethod
    def from_django_settings(cls, cache: CacheConfig | None = None) -> EngineSettings:
        """The engine for ``cache`` (default: the node's YAML file). The node passes the
        configuration in force, which an operator may have changed since (api/cache-config)."""
        from django.conf import settings

        from lorahub.cacheconfig import load_cache_config

        cache = cache or load_cache_config(settings.LORAHUB_CACHE_CONFIG)
        problem = device_budget_problem(
            cache, settings.LORAHUB_BASE_MODEL_DIR, settings.LORAHUB_ENGINE_DTYPE
        )
        if problem:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured(f"the engine cannot start: {problem}")
        return cls(
            model_dir=settings.LORAHUB_BASE_MODEL_DIR,
            served_model_name=cache.base_model,
            base_model_revision=cache.base_model_revision,
            max_loras=cache.adapter_cache.gpu_hot.max_adapters,
            max_cpu_loras=cache.adapter_cache.cpu_warm.max_adapters,
            max_lora_rank=cache.adapter_cache.gpu_hot.max_lora_rank,
            dtype=settings.LORAHUB_ENGINE_DTYPE,
            max_model_len=settings.LORAHUB_ENGINE_MAX_MODEL_LEN,
            kv_cache_bytes=settings.LORAHUB_ENGINE_KV_CACHE_MB * 1024 * 1024,
            # the admission's seats and its fair-share headroom (node/admission.py)
            max_num_seqs=settings.LORAHUB_NODE_MAX_CONCURRENT + settings.LORAHUB_NODE_FAIR_HEADROOM,
            max_num_batched_tokens=settings.LORAHUB_ENGINE_MAX_BATCHED_TOKENS,
            prefix_caching=settings.LORAHUB_ENGINE_PREFIX_CACHING,
        )

    def stock_server_argv(self, port: int, lora_modules: dict[str, Path]) -> list[str]:
        """The command line of stock vLLM's OpenAI server with this engine's model, limits
        and sampling seed, serving ``lora_modules`` (name -> folder) statically: the baseline
        the compatibility test and ``bench/load_mix.py`` compare the node with."""
        import sys

        argv = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--host=127.0.0.1",
            f"--port={port}",
            f"--model={self.model_dir}",
            f"--tokenizer={self.model_dir}",
            f"--served-model-name={self.served_model_name}",
            f"--dtype={self.dtype}",
            f"--max-model-len={self.max_model_len}",
            f"--kv-cache-memory-bytes={self.kv_cache_bytes}",
            f"--max-num-seqs={self.max_num_seqs}",
            f"--max-num-batched-tokens={self.max_num_batched_tokens}",
            f"--scheduling-policy={self.scheduling_policy}",
            f"--seed={self.seed}",
            "--enable-lora",
            f"--max-loras={self.max_loras}",
            f"--max-cpu-loras={self.max_cpu_loras}",
            f"--max-lora-rank={self.max_lora_rank}",
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching",
            "--disable-log-stats",
        ]
        if lora_modules:
            argv.append("--lora-modules")
            argv += [f"{name}={path}" for name, path in lora_modules.items()]
        return argv


@dataclass(frozen=True)
class EngineInfo:
    served_model_name: str
    base_model_revision: str
    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int
    dtype: str
    state: str
    started_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Engine:
    """An async vLLM engine with LoRA enabled. Use from one event loop."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self._llm: Any = None
        self._front: Any = None  # vllm_front.Front: vLLM's OpenAI serving classes
        self.state = "stopped"
        self.startup_seconds: float | None = None
        # Set when the node stops: an engine that comes up after that is shut down at once,
        # not left running for a node that is gone.
        self.closing = False

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start vLLM (blocking, tens of seconds on the CPU). Idempotent."""
        if self._llm is not None:
            return
        self.state = "starting"
        started = time.perf_counter()
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        s = self.settings
        # vLLM types dtype and max_lora_rank as Literals; the cache config validated them.
        dtype: Any = s.dtype
        max_lora_rank: Any = s.max_lora_rank
        args = AsyncEngineArgs(
            model=str(s.model_dir),
            tokenizer=str(s.model_dir),
            served_model_name=[s.served_model_name],
            dtype=dtype,
            max_model_len=s.max_model_len,
            kv_cache_memory_bytes=s.kv_cache_bytes,
            max_num_seqs=s.max_num_seqs,
            max_num_batched_tokens=s.max_num_batched_tokens,
            scheduling_policy=s.scheduling_policy,  # type: ignore[arg-type]
            seed=s.seed,
            enable_lora=True,
            max_loras=s.max_loras,
            max_cpu_loras=s.max_cpu_loras,
            max_lora_rank=max_lora_rank,
            enable_prefix_caching=s.prefix_caching,
            disable_log_stats=True,
        )
        try:
            try:
                from apps.serving.node import vllm_front
            except ImportError as exc:  # a module path vllm_front.py relies on moved
                import vllm

                raise EngineNotReady(
                    f"vLLM {vllm.__version__} is not the release apps/serving/node/vllm_front.py "
                    f"was written for: {exc}"
                ) from exc
            if problem := lora_fix_problem():
                raise EngineNotReady(problem)
            if problems := vllm_front.contract_problems():
                raise EngineNotReady("; ".join(problems))
            self._llm = AsyncLLM.from_engine_args(args)
            self._front = vllm_front.Front(
                self._llm, served_model_name=s.served_model_name, model_dir=s.model_dir
            )
            if self.closing:
                raise EngineNotReady("the node stopped while its engine started")
        except Exception:
            if self._llm is not None:
                self._llm.shutdown()
                self._llm = None
            self.state = "failed"
            raise
        self.startup_seconds = time.perf_counter() - started
        self.state = "ready"
        logger.info("vLLM engine ready in %.1fs (%s)", self.startup_seconds, s.served_model_name)

    def shutdown(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
            self._front = None
        self.state = "stopped"

    @property
    def is_ready(self) -> bool:
        return self._llm is not None and not self._llm.errored and self.state == "ready"

    def info(self) -> EngineInfo:
        s = self.settings
        state = self.state
        if self._llm is not None and self._llm.errored:
            state = "dead"
        return EngineInfo(
            served_model_name=s.served_model_name,
            base_model_revision=s.base_model_revision,
            max_loras=s.max_loras,
            max_cpu_loras=s.max_cpu_loras,
            max_lora_rank=s.max_lora_rank,
            dtype=s.dtype,
            state=state,
            started_s=self.startup_seconds,
        )

    def _require(self) -> Any:
        if not self.is_ready:
            raise EngineNotReady(f"engine is {self.info().state}")
        return self._llm

    def requests_in_flight(self) -> int:
        """Requests vLLM is still working on (0 when the engine is not running)."""
        if self._llm is None or self._llm.errored:
            return 0
        return int(self._llm.get_num_unfinished_requests())

    # --- adapters -----------------------------------------------------------------------

    @staticmethod
    def _lora_request(adapter: AdapterHandle) -> Any:
        from vllm.lora.request import LoRARequest

        return LoRARequest(
            lora_name=adapter.name, lora_int_id=adapter.lora_id, lora_path=str(adapter.path)
        )

    async def add_adapter(self, adapter: AdapterHandle) -> bool:
        return await self._require().add_lora(self._lora_request(adapter))

    async def remove_adapter(self, lora_id: int) -> bool:
        return await self._require().remove_lora(lora_id)

    async def pin_adapter(self, lora_id: int) -> bool:
        return await self._require().pin_lora(lora_id)

    async def list_adapters(self) -> set[int]:
        return set(await self._require().list_loras())

    async def adapter_counts(self) -> dict[str, Any]:
        """What the engine did with adapters, counted in its worker (``engine_probe.py``):
        loads in and between steps, the boundaries each cost its request, activations."""
        answers = await self._require().collective_rpc("lorahub_adapter_counts")
        return answers[0] if answers else {}

    # --- the OpenAI API, through vLLM's serving layer ----------------------------------------

    async def openai_request(self, *, chat: bool, body: dict[str, Any]) -> Any:
        """An allow-listed body, validated and rendered by vLLM; ``EngineRefused`` says what
        is wrong with it. Opaque to the caller: it only goes back into ``openai``."""
        self._require()
        return await self._front.prepare(chat, body)

    async def openai(
        self,
        request: Any,
        *,
        adapter: AdapterHandle | None,
        model_name: str,
        generation: Generation,
    ) -> dict[str, Any] | AsyncGenerator[str, None]:
        """Run ``request`` with ``adapter`` (None: the base model), answering as
        ``model_name``: the response body, or its server-sent events as strings."""
        self._require()
        lora = self._lora_request(adapter) if adapter is not None else None
        return await self._front.serve(
            request, lora=lora, model_name=model_name, generation=generation
        )

    def model_cards(self, names: list[str], owner: str) -> list[dict[str, Any]]:
        """``/v1/models`` entries in vLLM's shape: the tenant's aliases, then the base model."""
        self._require()
        return self._front.model_cards(names, owner)

    def tokenizer(self) -> Any:
        return self._require().get_tokenizer()

    @property
    def llm(self) -> Any:
        """vLLM's ``AsyncLLM`` itself, for benchmarks that measure it without the node's front
        (``bench/direct.py``); the node never generates through it directly."""
        return self._require()
