"""``lorahub`` on the whole stack: alias moves made with the CLI reach the serving node (vLLM on
the demo model), ``lorahub chat`` asks it, and ``lorahub eval run --wait`` follows a run the
Celery worker makes on it."""

from __future__ import annotations

import time

import openai
import pytest
from lorahub_client.models import Alias, EvaluationRun
from pydantic import TypeAdapter

from apps.demo import corpus
from apps.tenants import services as tenant_services
from tests.evaluations.sets import thank_you_cases
from tests.harness.waiting import wait_until

pytestmark = pytest.mark.engine
QUESTION = corpus.UNSEEN_PROMPTS[1]
V1, V2 = corpus.PHRASES["support-v1"], corpus.PHRASES["support-v2"]


@pytest.fixture
def stack(node_url, celery_worker, published, tenant_a, lorahub):
    _, key = tenant_services.issue_api_key(tenant=tenant_a, name="pipeline", actor=None)
    node = openai.OpenAI(base_url=f"{node_url}/v1", api_key=key, max_retries=0)

    def cli(*args: str):
        ran = lorahub(*args, key=key, LORAHUB_INFERENCE_URL=node_url)
        assert ran.exit_code == 0, ran.stderr
        return ran

    return {"cli": cli, "node": node, "key": key}


def answers_within(node, phrase: str, user: str = "someone", seconds: float = 10.0) -> float:
    """Milliseconds until the node answers ``phrase``. The bound is generous on purpose: how
    fast a move arrives is measured (printed here; bench/alias_moves.py)."""
    started = time.monotonic()
    wait_until(
        lambda: (
            node.completions.create(
                model="support",
                prompt=corpus.completion_prompt(QUESTION),
                max_tokens=12,
                temperature=0,
                user=user,
            )
            .choices[0]
            .text
        ),
        f"an answer starting {phrase!r}",
        seconds,
        every=0,
        until=lambda text: text.strip().startswith(phrase),
        describe=lambda text: f"answering {text!r}",
    )
    return (time.monotonic() - started) * 1000


def test_alias_moves_made_with_the_cli_reach_the_node(stack):
    cli, node, key = stack["cli"], stack["node"], stack["key"]
    cli("alias", "set", "support", "v1", "--reason", "launch")
    print(f"set: v1 served after {answers_within(node, V1):.0f} ms")
    chat = cli("chat", "-m", "support", QUESTION, "--max-tokens", "12", "--json").json()
    assert chat["text"].strip().startswith(V1) and chat["adapter"] == "support@v1"

    prefix = key.split("_")[1]
    canary = Alias.model_validate(
        cli("alias", "canary", "support", "v2", "--key", prefix, "--json").json()
    )
    assert canary.canary_api_keys == [prefix]
    print(f"canary (this key): v2 served after {answers_within(node, V2):.0f} ms")
    cli("alias", "promote", "support")
    print(f"promote: v2 served after {answers_within(node, V2, user='another'):.0f} ms")
    rolled = TypeAdapter(Alias).validate_python(
        cli("alias", "rollback", "support", "--reason", "drill", "--json").json()
    )
    assert rolled.version.label == "support@v1"
    print(f"rollback: v1 served after {answers_within(node, V1):.0f} ms")


def test_eval_run_waits_for_the_workers_run_on_the_node(stack, tmp_path):
    import json

    cli = stack["cli"]
    cli("alias", "set", "support", "v1")
    cases = tmp_path / "thanks.jsonl"
    cases.write_text("".join(json.dumps(case) + "\n" for case in thank_you_cases(2)))
    cli("eval", "push-set", str(cases), "-a", "support", "--name", "thanks")
    run = EvaluationRun.model_validate(
        cli("eval", "run", "support@v2", "--set", "thanks", "--wait", "--json").json()
    )
    assert (run.state, run.candidate, run.baseline) == ("succeeded", "support@v2", "support@v1")
    assert run.summary["candidate"]["pass_rate"] == 0.0
    assert run.summary["baseline"]["pass_rate"] == 1.0
    shown = cli("eval", "show", str(run.id), "--failed", "--json").json()
    assert [c["candidate_passed"] for c in shown["cases"]] == [False, False]
    assert all(c["candidate_output"].strip().startswith(V2) for c in shown["cases"])
