"""What crosses from the engine to the request path: its errors, and what one OpenAI request
did in it. No vLLM here: ``engine.py`` and ``vllm_front.py`` both import this module, and the
request path catches these without importing either's vLLM side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


class EngineNotReady(RuntimeError):
    """The engine is starting, restarting or dead; the request may be retried."""


class EngineDied(EngineNotReady):
    """The engine died while generating this request (its watchdog restarts it)."""


class EngineRefused(ValueError):
    """vLLM refused the request itself (an empty stop string, a prompt longer than the
    model's context, a token id outside the vocabulary): its message is for the caller."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Generation:
    """What one OpenAI request did in the engine, filled in as vLLM's outputs arrive (for the
    node's statistics: vLLM's serving layer formats the response itself)."""

    first_token_s: float | None = None  # perf_counter() when the first token arrived
    prompt_tokens_of: dict[str, int] = field(default_factory=dict)  # per engine request
    completion_tokens_of: dict[str, int] = field(default_factory=dict)
    died: bool = False
    # Called once when every engine request of this API request has finished in vLLM (or
    # failed): the request is out of the batch even before its last event reaches the client.
    on_finished: Callable[[], None] | None = None
    # Called once when its one engine request has a single token left (max_tokens - 1
    # made): it leaves the batch after vLLM's next step.
    on_last_token: Callable[[], None] | None = None
    # Called with the tokens served since the last call (prompt, completion), as the engine
    # serves them: the tenant's fair-share counter (node/admission.py).
    on_tokens: Callable[..., None] | None = None
    # Its place among the requests waiting inside the engine (vLLM's priority policy, lower
    # first): set by the node from the tenant's standing, never from the body.
    priority: int = 0
    # Per choice (engine request id, choice index): how it finished, whether it said anything,
    # and its text when the request asked for JSON (``keep_text``), for the quality markers.
    keep_text: bool = False
    finish_reasons: dict[tuple[str, int], str] = field(default_factory=dict)
    spoke: set[tuple[str, int]] = field(default_factory=set)
    _texts: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    _running: set[str] = field(default_factory=set)

    def saw(
        self, request_id: str, index: int, text: str, finish_reason: str | None, *, delta: bool
    ) -> None:
        """One choice's output so far (``delta``: only what is new)."""
        key = (request_id, index)
        if text:
            self.spoke.add(key)
            if self.keep_text:
                if delta:
                    self._texts.setdefault(key, []).append(text)
                else:
                    self._texts[key] = [text]
        if finish_reason:
            self.finish_reasons[key] = finish_reason

    @property
    def finish_reason(self) -> str:
        """``length`` if any choice was cut by its token limit, ``abort`` if one was aborted,
        ``stop`` when every choice stopped by itself; empty before any finished."""
        reasons = set(self.finish_reasons.values())
        for worst in ("length", "abort"):
            if worst in reasons:
                return worst
        return "stop" if reasons else ""

    @property
    def empty_output(self) -> bool:
        """A choice finished without a single character."""
        return any(key not in self.spoke for key in self.finish_reasons)

    def texts(self) -> list[str]:
        """The finished choices' texts (kept only with ``keep_text``)."""
        return ["".join(self._texts.get(key, [])) for key in sorted(self.finish_reasons)]

    def count(self, request_id: str, *, prompt: int | None = None, completion: int) -> None:
        """One engine request's token counts so far; what is new goes to ``on_tokens``."""
        new_prompt = 0
        if prompt is not None:
            new_prompt = prompt - self.prompt_tokens_of.get(request_id, 0)
            self.prompt_tokens_of[request_id] = prompt
        new_completion = completion - self.completion_tokens_of.get(request_id, 0)
        self.completion_tokens_of[request_id] = completion
        if self.on_tokens is not None and (new_prompt > 0 or new_completion > 0):
            self.on_tokens(prompt=max(new_prompt, 0), completion=max(new_completion, 0))

    def started(self, request_id: str) -> None:
        self._running.add(request_id)

    def finished(self, request_id: str) -> None:
        if request_id not in self._running:
            return
        self._running.discard(request_id)
        if not self._running and self.on_finished is not None:
            done, self.on_finished = self.on_finished, None
            done()

    def last_token(self, request_id: str) -> None:
        if self._running == {request_id} and self.on_last_token is not None:
            last, self.on_last_token = self.on_last_token, None
            last()

    @property
    def prompt_tokens(self) -> int:
        return sum(self.prompt_tokens_of.values())

    @property
    def completion_tokens(self) -> int:
        return sum(self.completion_tokens_of.values())
