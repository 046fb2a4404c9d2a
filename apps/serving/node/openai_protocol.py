"""What the node accepts of OpenAI's request bodies, and its error shape. Pure: no vLLM.

The protocol work itself (request models, sampling, chat templates, logprobs, response
shapes) is vLLM's (``vllm_front.py``). This module decides which of the fields vLLM would
accept a tenant may send: an explicit allow-list per endpoint. vLLM's request models also
take fields that reach into the engine or other tenants' requests (``prompt_embeds``,
``kv_transfer_params``, ``vllm_xargs``, ``cache_salt``, ``request_id``, ``priority``, a
caller's ``chat_template``…); those, features this node cannot offer (tool calling, beam
search, fill-in-the-middle) and misspelt fields all get a 400 that names them — a caller
never has a parameter silently do nothing.
"""

from __future__ import annotations

import json
from typing import Any

# Fields both endpoints take, passed to vLLM's request models unchanged.
SAMPLING = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "n",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_token_ids",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "logit_bias",
        "allowed_token_ids",
        "bad_words",
        "ignore_eos",
        "min_tokens",
        "include_stop_str_in_output",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "prompt_logprobs",
        "response_format",
        "structured_outputs",
        "return_token_ids",
        "add_special_tokens",
        "echo",
        "user",
    }
)
COMPLETION_FIELDS = SAMPLING | {"prompt", "logprobs"}
CHAT_FIELDS = SAMPLING | {
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "add_generation_prompt",
    "continue_final_message",
    "tool_choice",  # only "none"; see below
}

# Known OpenAI/vLLM features this node does not offer, and why (the 400 says so).
_NO_TOOLS = "tool calling is not enabled on this node (no tool-call parser is configured)"
_NO_REASONING = "no reasoning parser is configured on this node"
UNSUPPORTED = {
    "tools": _NO_TOOLS,
    "functions": _NO_TOOLS,
    "function_call": _NO_TOOLS,
    "parallel_tool_calls": _NO_TOOLS,
    "reasoning_effort": _NO_REASONING,
    "include_reasoning": _NO_REASONING,
    "thinking_token_budget": _NO_REASONING,
    "use_beam_search": "beam search is not offered by this node",
    "length_penalty": "length_penalty applies to beam search, which this node does not offer",
    "suffix": "the base model has no fill-in-the-middle support",
}
MESSAGE_FIELDS = frozenset({"role", "content", "name"})
ROLES = ("system", "developer", "user", "assistant")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
MAX_CHOICES = 8
MAX_PROMPTS = 16
MAX_MESSAGES = 256


class ApiError(Exception):
    """An error for the caller, in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        code: str | None = None,
        retry_after: int | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.retry_after = retry_after
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "code": self.code,
                "param": self.param,
            }
        }


def _refuse(message: str, param: str, code: str = "invalid_request") -> ApiError:
    return ApiError(400, message, code=code, param=param)


def parse(raw: bytes, *, chat: bool) -> dict[str, Any]:
    """The request body as a dict, once every field in it is one this node honours."""
    try:
        data = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    allowed = CHAT_FIELDS if chat else COMPLETION_FIELDS
    unsupported = [name for name in data if name in UNSUPPORTED]
    if unsupported:
        name = unsupported[0]
        raise _refuse(f"{name}: {UNSUPPORTED[name]}", name, "unsupported_parameter")
    unknown = sorted(str(name) for name in data if name not in allowed)
    if unknown:
        raise _refuse(
            f"this node does not accept {', '.join(unknown)}: remove "
            + ("it" if len(unknown) == 1 else "them")
            + f"; accepted here: {', '.join(sorted(allowed))}",
            unknown[0],
            "unsupported_parameter",
        )
    model = data.get("model")
    if not isinstance(model, str) or not model.strip() or len(model) > 200:
        raise _refuse(
            "model: name the alias (or base model) to call, up to 200 characters", "model"
        )
    n = data.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n > MAX_CHOICES):
        raise _refuse(f"n: this node returns at most {MAX_CHOICES} choices per request", "n")
    user = data.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > 256):
        raise _refuse("user: a string of at most 256 characters", "user")
    fmt = data.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in RESPONSE_FORMATS:
        raise _refuse(
            f"response_format.type: one of {', '.join(RESPONSE_FORMATS)}",
            "response_format",
            "unsupported_parameter",
        )
    if chat:
        _check_messages(data.get("messages"))
        choice = data.get("tool_choice")
        if choice not in (None, "none"):
            raise _refuse(f"tool_choice: {_NO_TOOLS}", "tool_choice", "unsupported_parameter")
    else:
        prompt = data.get("prompt")
        if not isinstance(prompt, (str, list)) or not prompt:
            raise _refuse("prompt: a string, a list of strings, or a list of token ids", "prompt")
        if (
            isinstance(prompt, list)
            and prompt
            and isinstance(prompt[0], (str, list))
            and len(prompt) > MAX_PROMPTS
        ):
            raise _refuse(f"prompt: at most {MAX_PROMPTS} prompts per request", "prompt")
    return data


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise _refuse("messages: a non-empty list of {role, content} objects", "messages")
    if len(messages) > MAX_MESSAGES:
        raise _refuse(f"messages: at most {MAX_MESSAGES} messages per request", "messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _refuse(f"{where}: an object with role and content", "messages")
        extra = sorted(str(k) for k in message if k not in MESSAGE_FIELDS)
        if extra:
            why = _NO_TOOLS if {"tool_calls", "tool_call_id"} & set(extra) else "not accepted"
            raise _refuse(f"{where}.{extra[0]}: {why}", "messages", "unsupported_parameter")
        role = message.get("role")
        if role not in ROLES:
            why = _NO_TOOLS if role in ("tool", "function") else f"one of {', '.join(ROLES)}"
            raise _refuse(f"{where}.role: {why}", "messages")
        content = message.get("content")
        if isinstance(content, str) or (content is None and role == "assistant"):
            continue
        if not isinstance(content, list):
            raise _refuse(f"{where}.content: a string or a list of text parts", "messages")
        for j, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
                or set(part) - {"type", "text"}
            ):
                raise _refuse(
                    f"{where}.content[{j}]: this node serves a text model; send parts of the "
                    'form {"type": "text", "text": "..."}',
                    "messages",
                    "unsupported_parameter",
                )


def sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def output_budget(body: dict[str, Any]) -> int:
    """The most output tokens a checked body may make the engine generate (its token limit
    times its choices and prompts); 0 when it sets no limit."""
    limit = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    choices = body.get("n") or 1
    prompt = body.get("prompt")
    prompts = (
        len(prompt)
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list))
        else 1
    )
    if not isinstance(limit, int) or not isinstance(choices, int):
        return 0
    return max(limit, 0) * max(choices, 1) * prompts
