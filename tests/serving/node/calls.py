"""Calls a test makes to a serving node: a completion of the demo prompt, and the internal API."""

from __future__ import annotations

import httpx
import openai

from apps.demo import corpus
from tests.harness.processes import NODE_INTERNAL_TOKEN

QUESTION = corpus.UNSEEN_PROMPTS[1]
PROMPT = corpus.completion_prompt(QUESTION)
V1, V2 = corpus.PHRASES["support-v1"], corpus.PHRASES["support-v2"]


def complete(client, model="support", user=None, prompt=PROMPT):
    raw = client.completions.with_raw_response.create(
        model=model, prompt=prompt, max_tokens=12, temperature=0, user=user or openai.NOT_GIVEN
    )
    return raw.parse().choices[0].text.strip(), raw.headers


def internal(world, path, body=None, token=NODE_INTERNAL_TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if body is None:
        return httpx.get(f"{world['url']}/internal/{path}", headers=headers, timeout=60)
    return httpx.post(f"{world['url']}/internal/{path}", json=body, headers=headers, timeout=60)
