"""Generation for the engine tests through the path production requests take: vLLM's OpenAI
serving classes behind the node's front (``Engine.openai_request`` then ``Engine.openai``,
as ``apps/serving/node/requests.py`` calls them), with the adapter the node chose."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from apps.serving.node.engine import AdapterHandle, Engine
from apps.serving.node.generation import Generation


@dataclass(frozen=True)
class Answer:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    model: str


def body_for(prompt: str, *, max_tokens: int, temperature: float, seed: int | None) -> dict:
    body: dict[str, Any] = {
        "model": "alias-under-test",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "return_token_ids": True,
    }
    if seed is not None:
        body["seed"] = seed
    return body


async def complete(
    engine: Engine,
    prompt: str,
    *,
    adapter: AdapterHandle | None = None,
    max_tokens: int = 16,
    temperature: float = 0.0,
    seed: int | None = None,
) -> Answer:
    body = body_for(prompt, max_tokens=max_tokens, temperature=temperature, seed=seed)
    request = await engine.openai_request(chat=False, body=body)
    result = await engine.openai(
        request, adapter=adapter, model_name=body["model"], generation=Generation()
    )
    assert isinstance(result, dict), "a request without 'stream' is answered whole"
    choice = result["choices"][0]
    return Answer(
        choice["text"], tuple(choice["token_ids"]), choice["finish_reason"], result["model"]
    )


async def stream(
    engine: Engine,
    prompt: str,
    *,
    adapter: AdapterHandle | None = None,
    max_tokens: int = 16,
) -> tuple[Answer, int]:
    """The streamed answer put together from its server-sent events, and how many events
    carried text."""
    body = body_for(prompt, max_tokens=max_tokens, temperature=0.0, seed=None)
    body["stream"] = True
    request = await engine.openai_request(chat=False, body=body)
    events = await engine.openai(
        request, adapter=adapter, model_name=body["model"], generation=Generation()
    )
    assert not isinstance(events, dict), "a streamed request is answered as events"
    texts: list[str] = []
    ids: list[int] = []
    finish_reason, model, pieces = None, "", 0
    async for event in events:
        assert event.startswith("data: "), event
        data = event[len("data: ") :].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        model = chunk["model"]
        for choice in chunk["choices"]:
            if choice.get("text"):
                pieces += 1
            texts.append(choice.get("text") or "")
            ids.extend(choice.get("token_ids") or ())
            finish_reason = choice.get("finish_reason") or finish_reason
    return Answer("".join(texts), tuple(ids), finish_reason, model), pieces


async def complete_together(
    engine: Engine, jobs: list[tuple[str, AdapterHandle | None]], *, max_tokens: int = 16
) -> list[Answer]:
    """Every job submitted at once, so that vLLM schedules them in the same batches."""
    return list(
        await asyncio.gather(
            *(
                complete(engine, prompt, adapter=adapter, max_tokens=max_tokens)
                for prompt, adapter in jobs
            )
        )
    )
