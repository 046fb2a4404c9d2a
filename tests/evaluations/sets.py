"""Evaluation sets a test uploads: JSONL of cases, and the demo adapter's thank-you cases."""

from __future__ import annotations

import io
import json

GOOD = [
    {"id": "thanks", "prompt": "Question: my invoice\nAnswer:", "expect": {"contains": "Thank"}},
    {"messages": [{"role": "user", "content": "hello"}], "params": {"max_tokens": 8}},
    {"prompt": "x", "expect": {"regex": "^[A-Z]", "not_contains": ["sorry", "cannot"]}},
    {"prompt": "y", "expect": {"json_schema": {"type": "object", "required": ["a"]}}},
]


def thank_you_cases(count: int) -> list[dict]:
    """Demo prompts whose set expects support-v1's phrase ("Thank you for contacting
    support."): support-v1's weights pass, support-v2's ("Hello from the helpdesk team!")
    fail."""
    from apps.demo import corpus

    return [
        {
            "id": f"q{i}",
            "prompt": corpus.completion_prompt(question),
            "params": {"max_tokens": 12},
            "expect": {"contains": "Thank you"},
        }
        for i, question in enumerate(corpus.UNSEEN_PROMPTS[:count])
    ]


def jsonl(*cases) -> bytes:
    return "\n".join(c if isinstance(c, str) else json.dumps(c) for c in cases).encode()


def upload(client, body: bytes, name: str = "smoke", adapter: str = "support"):
    handle = io.BytesIO(body)
    handle.name = "cases.jsonl"
    return client.post(f"/api/adapters/{adapter}/evaluation-sets/{name}", {"file": handle})
