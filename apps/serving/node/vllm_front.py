"""vLLM's own OpenAI serving layer, bound to the choices the node made for each request.

vLLM's ``OpenAIServingCompletion`` and ``OpenAIServingChat`` do the protocol work: request
models and their sampling parameters, chat templates and content parts, logprobs, ``n``,
prompt lists, ``echo``, usage chunks, structured outputs, and the response shapes. The node
keeps everything before that (key, alias, canary, admission, placement) and hands over the
request with the adapter it chose. Three overrides make sure that choice is the only one:

- ``_check_model`` and ``_maybe_get_adapters`` do not look the model up: the adapter is the
  one the node placed (``None`` for the base model), whatever the body says;
- the engine client they get is ``_NodeEngine``, which passes every ``generate`` to vLLM
  with that adapter (so no code path in vLLM's layer can pick another), counts tokens and the
  time to the first one for the node's statistics, and turns vLLM's engine-died and
  request-refused errors into the node's ``EngineDied`` / ``EngineRefused``;
- the response's ``model`` is the alias the caller asked for.

Imports vLLM (and torch) at module level: only ``engine.py`` imports this module, once the
engine has started, so the console and the worker never load it.

The overrides and the module paths above are vLLM's internals, not its API: they hold for the
release line ``TESTED_VLLM`` (pinned in ``pyproject.toml`` for both the CPU and the GPU
build). ``contract_problems`` lists what a different vLLM changed; the engine refuses to start
on one (naming the version and what changed) rather than serve through a layer it does not
know, and ``tests/serving/node/test_vllm_contract.py`` fails on it.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from vllm.entrypoints.openai.completion.protocol import CompletionRequest, CompletionResponse
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
from vllm.entrypoints.openai.models.protocol import BaseModelPath
from vllm.entrypoints.openai.models.serving import OpenAIServingModels
from vllm.entrypoints.serve import create_error_response
from vllm.entrypoints.serve.engine.protocol import ErrorResponse, ModelCard, ModelPermission
from vllm.exceptions import VLLMError, VLLMValidationError
from vllm.lora.request import LoRARequest
from vllm.renderers.online_renderer import OnlineRenderer
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.exceptions import EngineDeadError

from apps.serving.node.generation import EngineDied, EngineRefused, Generation

TESTED_VLLM = "0.32"

# What this module calls or overrides on vLLM's classes, with the parameter names it passes
# (or, for an override, the ones vLLM calls it with): a rename or a removal shows up here
# instead of as a TypeError in the middle of a request.
CONTRACT: list[tuple[type, str, tuple[str, ...]]] = [
    (
        OpenAIServingCompletion,
        "__init__",
        ("engine_client", "models", "online_renderer", "request_logger"),
    ),
    (OpenAIServingCompletion, "_check_model", ("request",)),
    (OpenAIServingCompletion, "_maybe_get_adapters", ("request", "supports_default_mm_loras")),
    (OpenAIServingCompletion, "render_completion_request", ("request",)),
    (OpenAIServingCompletion, "create_completion", ("request", "raw_request")),
    (
        OpenAIServingChat,
        "__init__",
        (
            "engine_client",
            "models",
            "response_role",
            "online_renderer",
            "request_logger",
            "chat_template",
            "chat_template_content_format",
        ),
    ),
    (OpenAIServingChat, "_check_model", ("request",)),
    (OpenAIServingChat, "_maybe_get_adapters", ("request", "supports_default_mm_loras")),
    (OpenAIServingChat, "render_chat_request", ("request",)),
    (OpenAIServingChat, "create_chat_completion", ("request", "raw_request")),
    (OpenAIServingModels, "__init__", ("engine_client", "base_model_paths")),
    (OpenAIServingModels, "model_name", ("lora_request",)),
    (
        OnlineRenderer,
        "__init__",
        (
            "model_config",
            "renderer",
            "request_logger",
            "chat_template",
            "chat_template_content_format",
        ),
    ),
    (OnlineRenderer, "warmup", ()),
]


def contract_problems() -> list[str]:
    """What the installed vLLM changed of ``CONTRACT`` and of the release line; empty when
    it is the one this module was written against."""
    import inspect

    import vllm
    from vllm.v1.engine.async_llm import AsyncLLM

    problems = []
    version = str(vllm.__version__)
    if not version.startswith(TESTED_VLLM + "."):
        problems.append(f"vLLM {version} is installed; lorahub is tested with {TESTED_VLLM}.x")
    contract = [
        *CONTRACT,
        (
            AsyncLLM,
            "generate",
            ("prompt", "sampling_params", "request_id", "lora_request", "priority"),
        ),
    ]
    for cls, name, params in contract:
        method = cls.__dict__.get(name) or getattr(cls, name, None)
        if method is None:
            problems.append(f"vLLM {version}: {cls.__name__}.{name} is gone")
            continue
        missing = [p for p in params if p not in inspect.signature(method).parameters]
        if missing:
            problems.append(
                f"vLLM {version}: {cls.__name__}.{name} no longer takes {', '.join(missing)}"
            )
    if RequestOutputKind.FINAL_ONLY is None or RequestOutputKind.DELTA is None:
        problems.append(f"vLLM {version}: RequestOutputKind changed")
    return problems


# What the node chose for the request being handed over: (adapter or None, the model name
# the response shows). Set by ``Front.serve`` for the duration of vLLM's create_* call.
_CHOICE: contextvars.ContextVar[tuple[LoRARequest | None, str, Generation]] = (
    contextvars.ContextVar("lorahub_choice")
)


class _NodeEngine:
    """The engine client vLLM's serving classes see: the real ``AsyncLLM`` for everything,
    except that ``generate`` uses the node's adapter and reports to the request's
    ``Generation``."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    def generate(self, prompt: Any, sampling_params: Any, request_id: str, **kwargs: Any):
        lora, _, generation = _CHOICE.get()
        kwargs["lora_request"] = lora  # the node's choice, never one vLLM's layer found
        kwargs["priority"] = generation.priority  # the tenant's standing, never the body's
        if (
            getattr(sampling_params, "output_kind", None) == RequestOutputKind.FINAL_ONLY
            and getattr(sampling_params, "n", 1) == 1
        ):
            # A non-streamed answer of one choice: cumulative outputs end with the same final
            # one and show when the first token came (the TTFT the node records). With n > 1
            # vLLM's layer keeps only the last output, which then holds one choice: untouched.
            sampling_params.output_kind = RequestOutputKind.CUMULATIVE
        generation.started(request_id)
        return self._observed(
            self._llm.generate(prompt, sampling_params, request_id, **kwargs),
            sampling_params.output_kind == RequestOutputKind.DELTA,
            generation,
            request_id,
            # the count at which one token is left, for one choice with a token limit
            (sampling_params.max_tokens or 0) - 1 if getattr(sampling_params, "n", 1) == 1 else -1,
        )

    @staticmethod
    async def _observed(
        outputs: AsyncGenerator[Any, None],
        delta: bool,
        generation: Generation,
        request_id: str,
        one_left: int = -1,
    ):
        counts: dict[int, int] = {}
        try:
            async for out in outputs:
                if out.finished:
                    generation.finished(request_id)
                for piece in out.outputs:
                    generation.saw(
                        out.request_id, piece.index, piece.text, piece.finish_reason, delta=delta
                    )
                    n = len(piece.token_ids)
                    counts[piece.index] = counts.get(piece.index, 0) + n if delta else n
                    if n and generation.first_token_s is None:
                        generation.first_token_s = time.perf_counter()
                generation.count(
                    out.request_id,
                    prompt=None if out.prompt_token_ids is None else len(out.prompt_token_ids),
                    completion=sum(counts.values()),
                )
                if one_left > 0 and counts.get(0) == one_left and not out.finished:
                    generation.last_token(request_id)
                yield out
        except EngineDeadError as exc:
            generation.died = True
            raise EngineDied(str(exc) or "the engine core exited") from None
        except VLLMValidationError as exc:
            raise EngineRefused(str(exc)) from None
        finally:
            generation.finished(request_id)  # aborted or failed: out of the batch too


class _NodeModels(OpenAIServingModels):
    def model_name(self, lora_request: LoRARequest | None = None) -> str:
        return _CHOICE.get()[1]


# A request rendered (templated, tokenized) before it queued for its adapter: (request,
# vLLM's render result). Set by ``Front.serve`` so that vLLM's create_* call reuses it.
_RENDERED: contextvars.ContextVar[tuple[Any, Any] | None] = contextvars.ContextVar(
    "lorahub_rendered", default=None
)


def _rendered(request: Any) -> Any:
    """The render result ``Front.prepare`` made for ``request``, or None."""
    done = _RENDERED.get()
    return done[1] if done is not None and done[0] is request else None


class _Chosen:
    """The overrides both serving classes share."""

    async def _check_model(self, request: Any) -> ErrorResponse | None:
        return None  # the node resolved the caller's alias itself

    def _maybe_get_adapters(self, request: Any, supports_default_mm_loras: bool = False):
        return _CHOICE.get()[0]


class _Completions(_Chosen, OpenAIServingCompletion):
    async def render_completion_request(self, request: Any) -> Any:
        done = _rendered(request)
        return done if done is not None else await super().render_completion_request(request)


class _Chat(_Chosen, OpenAIServingChat):
    async def render_chat_request(self, request: Any) -> Any:
        done = _rendered(request)
        return done if done is not None else await super().render_chat_request(request)


class Prepared:
    """A request vLLM has validated and rendered: what ``Front.serve`` runs."""

    __slots__ = ("rendered", "request")

    def __init__(self, request: Any, rendered: Any) -> None:
        self.request, self.rendered = request, rendered


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """vLLM's exceptions that its own server answers with a 4xx, as ``EngineRefused``."""
    try:
        yield
    except EngineRefused:
        raise
    except (VLLMError, ValueError, TypeError, OverflowError, NotImplementedError) as exc:
        error = create_error_response(exc).error
        if error.code >= 500:
            raise
        raise EngineRefused(error.message, status=error.code) from None


class Front:
    """The serving classes for one running engine (rebuilt when the engine restarts)."""

    def __init__(self, llm: Any, *, served_model_name: str, model_dir: Path) -> None:
        client: Any = _NodeEngine(llm)  # an EngineClient by delegation
        self.models = _NodeModels(
            client, [BaseModelPath(name=served_model_name, model_path=str(model_dir))]
        )
        renderer = OnlineRenderer(
            model_config=llm.model_config,
            renderer=llm.renderer,
            request_logger=None,
            chat_template=None,
            chat_template_content_format="auto",
        )
        renderer.warmup()
        self.completions = _Completions(
            client, self.models, online_renderer=renderer, request_logger=None
        )
        self.chat = _Chat(
            client,
            self.models,
            "assistant",
            online_renderer=renderer,
            request_logger=None,
            chat_template=None,
            chat_template_content_format="auto",
        )
        self.max_model_len = llm.model_config.max_model_len

    async def prepare(self, chat: bool, body: dict[str, Any]) -> Prepared:
        """vLLM's request model for ``body`` (already through the node's allow-list), with its
        prompt rendered and tokenized: done before the request waits for its adapter, so that
        once admitted it goes straight to the engine."""
        try:
            request = (ChatCompletionRequest if chat else CompletionRequest).model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            message = first["msg"].removeprefix("Value error, ")
            raise EngineRefused(f"{where}: {message}") from None
        with _refusals():
            rendered = await (
                self.chat.render_chat_request(request)
                if chat
                else self.completions.render_completion_request(request)
            )
        if isinstance(rendered, ErrorResponse):
            raise EngineRefused(rendered.error.message, status=rendered.error.code)
        return Prepared(request, rendered)

    async def serve(
        self,
        prepared: Prepared,
        *,
        lora: LoRARequest | None,
        model_name: str,
        generation: Generation,
    ) -> dict[str, Any] | AsyncGenerator[str, None]:
        """The response body, or the stream of server-sent events (``data: …\\n\\n``)."""
        token = _CHOICE.set((lora, model_name, generation))
        rendered = _RENDERED.set((prepared.request, prepared.rendered))
        request = prepared.request
        result: Any
        try:
            with _refusals():
                if isinstance(request, ChatCompletionRequest):
                    result = await self.chat.create_chat_completion(request, None)
                else:
                    result = await self.completions.create_completion(request, None)
        finally:
            _RENDERED.reset(rendered)
            _CHOICE.reset(token)
        if isinstance(result, ErrorResponse):
            raise EngineRefused(result.error.message, status=result.error.code)
        if isinstance(result, (CompletionResponse, ChatCompletionResponse)):
            return result.model_dump(exclude_none=False)
        return result

    def model_cards(self, names: list[str], owner: str) -> list[dict[str, Any]]:
        base = self.models.base_model_paths[0]
        cards = [
            ModelCard(
                id=name,
                owned_by=owner,
                root=name,
                parent=base.name,
                max_model_len=self.max_model_len,
                permission=[ModelPermission()],
            )
            for name in names
        ]
        cards.append(
            ModelCard(
                id=base.name,
                root=base.name,
                max_model_len=self.max_model_len,
                permission=[ModelPermission()],
            )
        )
        return [card.model_dump() for card in cards]
