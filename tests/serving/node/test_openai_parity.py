"""The node answers OpenAI requests exactly as stock vLLM's OpenAI server does.

Stock vLLM (``vllm.entrypoints.openai.api_server``) runs beside the node on the same demo
model, the same LoRA limits and seed, with support-v1's weights as a static LoRA module named
``support``; the node serves tenant A's alias ``support`` → v1 (the same weights). Every
request goes to both, one at a time, greedy or seeded, and the answers are compared field by
field: ids, timestamps and the system fingerprint aside, floats to 1e-4. Streams are compared
event by event. Then each class of parameter the node refuses gets its 400, naming it.
"""

from __future__ import annotations

import json
import math
import subprocess

import httpx
import pytest
from django.test import Client

from apps.demo import corpus
from apps.serving.node.engine import EngineSettings
from apps.tenants import services as tenant_services
from tests.harness.processes import stop
from tests.harness.waiting import free_port, wait_until

pytestmark = pytest.mark.engine

PROMPT = corpus.completion_prompt(corpus.UNSEEN_PROMPTS[1])
QUESTION = corpus.UNSEEN_PROMPTS[1]
VOLATILE = {"id", "created", "system_fingerprint"}
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}},
    "required": ["answer", "score"],
}


@pytest.fixture(scope="module")
def stock(demo_dir, tmp_path_factory):
    """Stock vLLM's OpenAI server on the node's model and limits (tests/conftest.py's
    NODE_CACHE_CONFIG: 2 device slots, 4 host slots, rank 16)."""
    port = free_port()
    engine = EngineSettings(
        model_dir=demo_dir / "base-model",
        served_model_name=corpus.BASE_MODEL_NAME,
        base_model_revision="r1",
        max_loras=2,
        max_cpu_loras=4,
        max_lora_rank=16,
    )
    log = tmp_path_factory.mktemp("stock-vllm") / "server.log"
    argv = engine.stock_server_argv(port, {"support": demo_dir / "adapters" / "support-v1"})
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, f"stock vLLM exited; see {log}"
        return httpx.get(f"{url}/health", timeout=2).status_code == 200

    try:
        wait_until(
            healthy, f"stock vLLM to start (see {log})", 240, 0.5, ignore=(httpx.TransportError,)
        )
        yield url
    finally:
        stop(proc)


@pytest.fixture
def node(node_url, published, tenant_a):
    _, key = tenant_services.issue_api_key(tenant=tenant_a, name="parity", actor=None)
    control = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    answer = control.put(
        "/api/aliases/support", {"version_id": published["v1"]}, content_type="application/json"
    )
    assert answer.status_code == 200, answer.content
    return node_url, key


def post(url: str, path: str, body: dict, key: str = "unused") -> httpx.Response:
    return httpx.post(
        f"{url}{path}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )


def normalized(value):
    """The answer without what differs between any two calls (ids, clocks)."""
    if isinstance(value, dict):
        return {k: normalized(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [normalized(v) for v in value]
    return value


def differences(node, stock, where="") -> list[str]:
    if isinstance(node, dict) and isinstance(stock, dict):
        found = [
            f"{where}.{k}: only in {'node' if k in node else 'stock'}"
            for k in node.keys() ^ stock.keys()
        ]
        for k in node.keys() & stock.keys():
            found += differences(node[k], stock[k], f"{where}.{k}")
        return found
    if isinstance(node, list) and isinstance(stock, list):
        if len(node) != len(stock):
            return [f"{where}: {len(node)} items on the node, {len(stock)} on stock vLLM"]
        return [
            d
            for i, (a, b) in enumerate(zip(node, stock, strict=True))
            for d in differences(a, b, f"{where}[{i}]")
        ]
    if isinstance(node, float) and isinstance(stock, float):
        same = math.isclose(node, stock, rel_tol=1e-4, abs_tol=1e-4)
        return [] if same else [f"{where}: node {node!r}, stock {stock!r}"]
    return [] if node == stock else [f"{where}: node {node!r}, stock {stock!r}"]


def answer_of(response: httpx.Response):
    """The whole answer; a stream folded into one (see ``folded``)."""
    assert response.status_code == 200, response.text
    if not response.headers["content-type"].startswith("text/event-stream"):
        return normalized(response.json())
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", response.text
    return folded([normalized(json.loads(event)) for event in events[:-1]])


def folded(events: list[dict]) -> dict:
    """A stream as what a client assembles from it: per choice the concatenated text (or
    delta content), the role, the finish reason and the tokens' logprobs, plus the usage
    chunk and the fields every event repeats. vLLM sends the tokens that arrived while the
    reader was busy as one event, so how many events carry them depends on timing."""
    choices: dict[int, dict] = {}
    whole: dict = {"events_with_usage": 0}
    for event in events:
        for key in ("object", "model"):
            whole.setdefault(key, set()).add(event[key])
        if event.get("usage"):
            whole["usage"] = event["usage"]
            whole["events_with_usage"] += 1
        for choice in event["choices"]:
            mine = choices.setdefault(choice["index"], {"text": "", "logprobs": []})
            delta = choice.get("delta", {"content": choice.get("text")})
            mine["text"] += delta.get("content") or ""
            if delta.get("role"):
                mine["role"] = delta["role"]
            if choice.get("finish_reason"):
                mine["finish_reason"] = choice["finish_reason"]
            logprobs = choice.get("logprobs") or {}
            mine["logprobs"] += logprobs.get("content") or logprobs.get("token_logprobs") or []
    whole["choices"] = choices
    return {k: sorted(v) if isinstance(v, set) else v for k, v in whole.items()}


chat = "/v1/chat/completions"
completions = "/v1/completions"
user = [{"role": "user", "content": QUESTION}]
CASES = {
    "completion greedy": (completions, {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}),
    "completion stream": (
        completions,
        {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stream": True},
    ),
    "completion stream include_usage": (
        completions,
        {
            "prompt": PROMPT,
            "max_tokens": 8,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    "completion logprobs": (
        completions,
        {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 3},
    ),
    "completion n=2 seeded": (
        completions,
        {"prompt": PROMPT, "max_tokens": 10, "temperature": 0.9, "seed": 7, "n": 2},
    ),
    "completion prompt list": (
        completions,
        {
            "prompt": [PROMPT, corpus.completion_prompt(corpus.UNSEEN_PROMPTS[0])],
            "max_tokens": 8,
            "temperature": 0,
        },
    ),
    "completion token-id prompt": (
        completions,
        {"prompt": [1, 2, 3, 4], "max_tokens": 6, "temperature": 0},
    ),
    "completion echo": (
        completions,
        {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "echo": True},
    ),
    "completion stop": (
        completions,
        {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stop": [" the", "."]},
    ),
    "completion seed": (
        completions,
        {"prompt": PROMPT, "max_tokens": 16, "temperature": 1.0, "seed": 1234},
    ),
    "completion ignore_eos min_tokens": (
        completions,
        {
            "prompt": PROMPT,
            "max_tokens": 24,
            "temperature": 0,
            "ignore_eos": True,
            "min_tokens": 24,
        },
    ),
    "completion penalties": (
        completions,
        {
            "prompt": PROMPT,
            "max_tokens": 24,
            "temperature": 0,
            "frequency_penalty": 1.2,
            "presence_penalty": 0.6,
            "repetition_penalty": 1.3,
        },
    ),
    "completion json_object": (
        completions,
        {
            "prompt": PROMPT,
            "max_tokens": 24,
            "temperature": 0,
            "response_format": {"type": "json_object"},
        },
    ),
    "chat greedy": (chat, {"messages": user, "max_tokens": 12, "temperature": 0}),
    "chat stream": (chat, {"messages": user, "max_tokens": 12, "temperature": 0, "stream": True}),
    "chat stream logprobs n=2": (
        chat,
        {
            "messages": user,
            "max_tokens": 8,
            "temperature": 0.7,
            "seed": 5,
            "n": 2,
            "stream": True,
            "logprobs": True,
            "top_logprobs": 2,
        },
    ),
    "chat stream include_usage": (
        chat,
        {
            "messages": user,
            "max_tokens": 8,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    "chat content parts": (
        chat,
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
            "max_tokens": 12,
            "temperature": 0,
        },
    ),
    "chat developer role": (
        chat,
        {
            "messages": [{"role": "developer", "content": "Answer briefly."}, *user],
            "max_tokens": 12,
            "temperature": 0,
        },
    ),
    "chat logprobs top_logprobs": (
        chat,
        {"messages": user, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 3},
    ),
    "chat n=2 seeded": (
        chat,
        {"messages": user, "max_tokens": 8, "temperature": 0.9, "seed": 3, "n": 2},
    ),
    "chat echo": (
        chat,
        {
            "messages": [*user, {"role": "assistant", "content": "Thank"}],
            "max_tokens": 6,
            "temperature": 0,
            "echo": True,
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    ),
    "chat stop and seed": (
        chat,
        {"messages": user, "max_tokens": 20, "temperature": 0.8, "seed": 11, "stop": ["."]},
    ),
    "chat ignore_eos min_tokens": (
        chat,
        {
            "messages": user,
            "max_tokens": 20,
            "temperature": 0,
            "ignore_eos": True,
            "min_tokens": 20,
        },
    ),
    "chat max_completion_tokens": (
        chat,
        {"messages": user, "max_completion_tokens": 5, "temperature": 0},
    ),
    "chat penalties": (
        chat,
        {
            "messages": user,
            "max_tokens": 20,
            "temperature": 0,
            "frequency_penalty": 1.0,
            "presence_penalty": 1.0,
            "repetition_penalty": 1.2,
        },
    ),
    "chat json_object": (
        chat,
        {
            "messages": user,
            "max_tokens": 24,
            "temperature": 0,
            "response_format": {"type": "json_object"},
        },
    ),
    "chat json_schema": (
        chat,
        {
            "messages": user,
            "max_tokens": 40,
            "temperature": 0,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": SCHEMA},
            },
        },
    ),
    "chat json_schema stream": (
        chat,
        {
            "messages": user,
            "max_tokens": 30,
            "temperature": 0,
            "stream": True,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": SCHEMA},
            },
        },
    ),
}


def test_every_request_gets_the_answer_stock_vllm_gives(stock, node):
    node_url, key = node
    rows, mismatched = [], {}
    for name, (path, body) in CASES.items():
        for model in ("support", corpus.BASE_MODEL_NAME):
            request = {"model": model, **body}
            ours = answer_of(post(node_url, path, request, key))
            theirs = answer_of(post(stock, path, request))
            found = differences(ours, theirs)
            rows.append((name, model, "match" if not found else f"{len(found)} differ"))
            if found:
                mismatched[f"{name} ({model})"] = found[:5]
    print("\n".join(f"{name:<36} {model:<20} {verdict}" for name, model, verdict in rows))
    assert not mismatched, json.dumps(mismatched, indent=1)


def test_the_adapter_changes_the_answer(stock, node):
    """The comparison above is between adapters, not base models that ignore them."""
    node_url, key = node
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    with_adapter = post(node_url, completions, {"model": "support", **body}, key).json()
    base = post(node_url, completions, {"model": corpus.BASE_MODEL_NAME, **body}, key).json()
    assert with_adapter["choices"][0]["text"] != base["choices"][0]["text"]
    assert with_adapter["choices"][0]["text"].strip().startswith(corpus.PHRASES["support-v1"])


def test_json_schema_answers_parse_and_follow_the_schema(node):
    node_url, key = node
    body = {"model": "support", **CASES["chat json_schema"][1], "max_tokens": 120}
    answer = post(node_url, chat, body, key).json()
    choice = answer["choices"][0]
    if choice["finish_reason"] == "stop":  # a tiny model may run out of tokens first
        parsed = json.loads(choice["message"]["content"])
        assert set(parsed) >= {"answer", "score"} and isinstance(parsed["score"], int)
    else:
        assert choice["message"]["content"].lstrip().startswith("{")


REFUSED = {
    # engine internals and other tenants' business: never reachable from a request body
    "prompt_embeds": {"prompt_embeds": "AAAA"},
    "kv_transfer_params": {"kv_transfer_params": {"do_remote_prefill": True}},
    "vllm_xargs": {"vllm_xargs": {"x": 1}},
    "cache_salt": {"cache_salt": "other-tenant"},
    "request_id": {"request_id": "someone-elses-id"},
    "priority": {"priority": -100},
    "chat_template": {"chat_template": "{{ secrets }}"},
    "lora_request": {"lora_request": {"lora_name": "x", "lora_int_id": 1, "lora_path": "/"}},
    # features this node does not offer
    "tools": {"tools": [{"type": "function", "function": {"name": "f"}}]},
    "tool_choice": {"tool_choice": "auto"},
    "use_beam_search": {"use_beam_search": True},
    "reasoning_effort": {"reasoning_effort": "high"},
    # a typo: silently dropping it would hide the mistake
    "max_token": {"max_token": 5},
}


@pytest.mark.parametrize("name", REFUSED)
def test_parameters_the_node_does_not_honour_get_a_400_naming_them(node, name):
    node_url, key = node
    answer = post(node_url, chat, {"model": "support", "messages": user, **REFUSED[name]}, key)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == name and name in error["message"], error
    assert error["code"] == "unsupported_parameter"


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        (completions, {"prompt": PROMPT, "suffix": "end"}, "suffix"),
        (
            chat,
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "http://169.254.169.254/"}}
                        ],
                    }
                ]
            },
            "messages[0].content[0]",
        ),
        (
            chat,
            {"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]},
            "messages[0].tool_call_id",
        ),
        (
            chat,
            {"messages": user, "response_format": {"type": "structural_tag"}},
            "response_format",
        ),
    ],
    ids=[
        "fill-in-the-middle",
        "image part (a URL the node would fetch)",
        "tool message",
        "structural tag",
    ],
)
def test_unsupported_features_in_a_body_are_refused_by_name(node, path, body, where):
    node_url, key = node
    answer = post(node_url, path, {"model": "support", **body}, key)
    assert answer.status_code == 400, answer.text
    assert where in answer.json()["error"]["message"]
