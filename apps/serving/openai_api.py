"""OpenAI's request and response shapes for completions, chat and model listing.

Pure data and formatting: no engine, no database. Field limits live in the request models, so
a malformed request is refused before it reaches anything else, with OpenAI's error shape.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=200)
    max_tokens: int | None = Field(None, ge=1, le=4096)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=1, description="one choice per request")
    stream: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = Field(None, max_length=256)

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop[:4])


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and value and isinstance(value[0], str):
            if len(value) != 1:
                raise ValueError("send one prompt per request")
            return value[0]
        if isinstance(value, list) and not value:
            raise ValueError("prompt is empty")
        return value


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1, max_length=256)
    max_completion_tokens: int | None = Field(None, ge=1, le=4096)


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
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": self.message, "type": self.type, "code": self.code, "param": None}
        }


def parse(model: type[_Request], raw: bytes) -> Any:
    try:
        data = json.loads(raw or b"null")
    except json.JSONDecodeError:
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        message = first["msg"].removeprefix("Value error, ")
        raise ApiError(400, f"{where}: {message}", code="invalid_request") from None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(rid: str, model: str, text: str, finish: str | None, use: dict) -> dict:
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
        "usage": use,
    }


def completion_chunk(rid: str, model: str, text: str, finish: str | None) -> dict:
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
    }


def chat_body(rid: str, model: str, text: str, finish: str | None, use: dict) -> dict:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": None,
            }
        ],
        "usage": use,
    }


def chat_chunk(rid: str, model: str, delta: dict, finish: str | None) -> dict:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }


def sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def models_body(aliases: list[str], tenant: str, base_model: str) -> dict:
    created = int(time.time())
    data = [{"id": a, "object": "model", "created": created, "owned_by": tenant} for a in aliases]
    data.append({"id": base_model, "object": "model", "created": created, "owned_by": "lorahub"})
    return {"object": "list", "data": data}
