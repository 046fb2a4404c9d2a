"""vLLM's Python API without the node's front: ``AsyncLLM.generate`` on an ``Engine``'s vLLM.

The node never generates this way (its requests go through vLLM's OpenAI serving classes,
``apps/serving/node/vllm_front.py``); benchmarks use it as the floor the node is measured against
(``node_overhead.py``) and to time loads without HTTP (``load_tiers.py``,
``engine_baseline.py``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from apps.serving.node.engine import AdapterHandle, Engine


@dataclass(frozen=True)
class Sampling:
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    prompt_tokens: int
    ttft_ms: float
    total_ms: float


async def stream(
    engine: Engine,
    prompt: str | list[int],
    sampling: Sampling,
    *,
    adapter: AdapterHandle | None = None,
) -> AsyncGenerator[Any, None]:
    """vLLM's outputs (deltas) as it produces them; closing the iterator aborts the request."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import RequestOutputKind

    llm = engine.llm
    params = SamplingParams(
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed,
        output_kind=RequestOutputKind.DELTA,
    )
    engine_prompt: Any = {"prompt_token_ids": prompt} if isinstance(prompt, list) else prompt
    rid = uuid.uuid4().hex
    lora = (
        LoRARequest(
            lora_name=adapter.name, lora_int_id=adapter.lora_id, lora_path=str(adapter.path)
        )
        if adapter is not None
        else None
    )
    finished = False
    try:
        async for out in llm.generate(engine_prompt, params, rid, lora_request=lora):
            finished = out.finished
            yield out
    finally:
        if not finished and not llm.errored:
            await llm.abort(rid)


async def complete(
    engine: Engine,
    prompt: str | list[int],
    sampling: Sampling,
    *,
    adapter: AdapterHandle | None = None,
) -> Completion:
    started = time.perf_counter()
    ttft: float | None = None
    texts: list[str] = []
    ids: list[int] = []
    finish_reason = None
    prompt_tokens = 0
    async for out in stream(engine, prompt, sampling, adapter=adapter):
        piece = out.outputs[0]
        if ttft is None and piece.token_ids:
            ttft = (time.perf_counter() - started) * 1000
        texts.append(piece.text)
        ids.extend(piece.token_ids)
        finish_reason = piece.finish_reason
        prompt_tokens = len(out.prompt_token_ids or ()) or prompt_tokens
    total = (time.perf_counter() - started) * 1000
    return Completion(
        text="".join(texts),
        token_ids=tuple(ids),
        finish_reason=finish_reason,
        prompt_tokens=prompt_tokens,
        ttft_ms=ttft if ttft is not None else total,
        total_ms=total,
    )


async def complete_many(
    engine: Engine,
    jobs: list[tuple[str | list[int], AdapterHandle | None]],
    sampling: Sampling,
) -> list[Completion]:
    """All jobs submitted at once, so that vLLM schedules them in the same batches."""
    return list(
        await asyncio.gather(
            *(complete(engine, prompt, sampling, adapter=adapter) for prompt, adapter in jobs)
        )
    )
