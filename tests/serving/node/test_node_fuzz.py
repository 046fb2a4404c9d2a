"""Random OpenAI request bodies against a real node (hypothesis): whatever arrives — wrong
types, unknown fields, absurd numbers, broken JSON — the answer is a 2xx or a 4xx in
OpenAI's error shape, never a 500, and the node keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from apps.demo import corpus
from apps.tenants import services as tenant_services

pytestmark = pytest.mark.engine

FIELDS = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stop",
    "seed",
    "user",
    "logprobs",
    "echo",
    "response_format",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=40),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
models = st.sampled_from([corpus.BASE_MODEL_NAME, "no-such-alias", ""]) | st.text(max_size=20)
small = {"max_tokens": st.integers(min_value=-5, max_value=4)}  # keep generations short
valid_completion = st.fixed_dictionaries(
    {
        "model": st.just(corpus.BASE_MODEL_NAME),
        "prompt": st.text(min_size=1, max_size=60),
        "max_tokens": st.integers(min_value=1, max_value=4),
    },
    optional={f: values for f in ("temperature", "top_p", "stop", "seed", "user", "stream")},
)
bodies = (
    valid_completion
    | st.fixed_dictionaries(
        {"model": models}, optional={f: small.get(f, values) for f in FIELDS if f != "model"}
    )
    | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=10), values, max_size=6)
)


def matches_openai_schema(path: str, answer: httpx.Response) -> None:
    """A 200 parses as OpenAI's own response type (the `openai` package's models): a whole
    body, or every event of a stream."""
    chat = path.endswith("chat/completions")
    if answer.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", answer.text
        for event in events[:-1]:
            parsed = json.loads(event)
            if "error" in parsed:  # a stream that failed after it began says so
                assert parsed["error"]["message"]
                continue
            (ChatCompletionChunk if chat else Completion).model_validate(parsed, strict=False)
    else:
        (ChatCompletion if chat else Completion).model_validate(answer.json())


@pytest.mark.django_db(transaction=True)
def test_random_request_bodies_never_get_a_500(node_url, tenant_a):
    _, key = tenant_services.issue_api_key(tenant=tenant_a, name="fuzz", actor=None)
    headers = {"Authorization": f"Bearer {key}"}
    seen: dict[int, int] = {}

    @given(
        body=bodies,
        path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
        raw=st.booleans(),
    )
    @settings(
        max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def send(body, path, raw):
        content = json.dumps(body)
        if raw:  # and sometimes not even JSON
            content = content[: len(content) // 2]
        answer = httpx.post(
            f"{node_url}{path}", headers=headers, content=content.encode(), timeout=60
        )
        seen[answer.status_code] = seen.get(answer.status_code, 0) + 1
        assert answer.status_code < 500 or answer.status_code == 503, (body, answer.text)
        if answer.status_code >= 400:
            error = answer.json()["error"]
            assert error["message"] and error["type"], answer.text  # says what was wrong
        else:
            matches_openai_schema(path, answer)

    send()
    print(f"node fuzz: {sum(seen.values())} requests, statuses {dict(sorted(seen.items()))}")
    assert httpx.get(f"{node_url}/healthz", timeout=5).status_code == 200
