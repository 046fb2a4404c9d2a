"""No JSON Schema a tenant or a caller writes makes the worker or a node fetch a URL.

jsonschema's default resolver fetches any ``$ref`` it does not hold: an evaluation set's
``json_schema`` (judged on the worker) or a request's ``response_format`` (judged on the node
for its quality markers) pointing at ``http://169.254.169.254/...`` would be a request from
inside the platform, and pass/fail would leak the answer. Here the URL is a server on this
machine that counts what reaches it.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from unittest import mock

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from apps.evaluations import cases as evaluation
from apps.telemetry import quality
from tests.evaluations.sets import jsonl


class Listener:
    """An HTTP server that answers any GET with ``{"type": "string"}`` and counts them."""

    def __init__(self) -> None:
        hits: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                body = json.dumps({"type": "string"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.hits = hits
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/latest/meta-data"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


@pytest.mark.parametrize(
    "where",
    [
        lambda url: {"$ref": url},
        lambda url: {"type": "object", "properties": {"a": {"$ref": url}}},
        lambda url: {"anyOf": [{"type": "null"}, {"$dynamicRef": url}]},
        lambda url: {"$ref": "file:///etc/passwd"},
    ],
)
def test_a_set_whose_schema_refers_outside_itself_is_refused_naming_the_case(listener, where):
    schema = where(listener.url)
    body = jsonl(
        {"id": "fine", "prompt": "a", "expect": {"contains": "x"}},
        {"id": "probe", "prompt": "b", "expect": {"json_schema": schema}},
    )
    with pytest.raises(evaluation.InvalidEvaluationSet) as refused:
        evaluation.parse_cases(body)
    message = refused.value.message
    assert "line 2" in message and "expect.json_schema" in message
    assert "not fetched" in message and "#/$defs/" in message  # what to do instead
    assert listener.hits == []


def test_local_references_still_work():
    schema = {
        "$defs": {"name": {"type": "string", "minLength": 1}},
        "type": "object",
        "properties": {"name": {"$ref": "#/$defs/name"}},
        "required": ["name"],
    }
    (case,) = evaluation.parse_cases(jsonl({"prompt": "a", "expect": {"json_schema": schema}}))
    assert evaluation.judge(case, '{"name": "Ada"}') == {"json_schema": True}
    assert evaluation.judge(case, '{"name": ""}') == {"json_schema": False}


@pytest.mark.parametrize(
    ("schema", "answer"),
    [
        (lambda url: {"$ref": url}, '"an answer"'),
        # a relative reference under a remote base: local-looking, resolved against the URL
        (lambda url: {"$id": url, "properties": {"a": {"$ref": "other.json"}}}, '{"a": "x"}'),
    ],
)
def test_judging_never_fetches_a_reference(listener, schema, answer):
    """A case stored before the rule (or slipping past it) is judged with a registry that holds
    nothing: the reference does not resolve, the answer does not match, nothing is fetched.
    (Fetched, the listener's ``{"type": "string"}`` would have made it match.)"""
    case = evaluation.Case(id="old", prompt="x", expect={"json_schema": schema(listener.url)})
    assert evaluation.judge(case, answer) == {"json_schema": False}
    assert listener.hits == []


def test_the_nodes_quality_markers_never_fetch_a_callers_reference(listener):
    body = {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"$ref": listener.url}},
        }
    }
    wanted = quality.json_wanted(body)
    verdict = quality.judge_json(['"a string"'], wanted)
    assert verdict.valid is True
    assert verdict.matches is None  # judged on parsing only, as for a schema vLLM refuses
    assert listener.hits == []


def test_every_worker_task_has_a_time_limit():
    """A task waiting on something silent gives its slot back: the slots that validate uploads
    and judge releases are the same ones."""
    from lorahub.celery import app

    app.loader.import_default_modules()
    ours = {
        name: task for name, task in app.tasks.items() if name.startswith(("apps.", "lorahub."))
    }
    assert len(ours) >= 10
    unbounded = [
        name
        for name, task in ours.items()
        if (task.time_limit or app.conf.task_time_limit) is None
        or (task.soft_time_limit or app.conf.task_soft_time_limit) is None
    ]
    assert unbounded == []
    run = ours["apps.evaluations.tasks.run_evaluation"]
    assert run.soft_time_limit < run.time_limit


@pytest.mark.django_db
def test_an_evaluation_run_past_its_time_limit_fails_with_the_reason(tenant_a, support_versions):
    from apps.evaluations import services
    from apps.evaluations.models import EvaluationRun, EvaluationSet
    from apps.registry.models import AdapterVersion

    candidate = AdapterVersion.objects.get(pk=support_versions["v2"])
    baseline = AdapterVersion.objects.get(pk=support_versions["v1"])
    cases = [c.as_json() for c in evaluation.parse_cases(jsonl({"prompt": "a"}))]
    revision = EvaluationSet.objects.create(
        tenant=tenant_a, adapter=candidate.adapter, name="slow"
    ).revisions.create(revision=1, cases=cases, case_count=1, size_bytes=1, sha256="0" * 64)
    run = EvaluationRun.objects.create(
        tenant=tenant_a, set_revision=revision, candidate=candidate, baseline=baseline
    )
    with mock.patch.object(services, "_node", side_effect=SoftTimeLimitExceeded()):
        services.execute_run(run.pk)
    run.refresh_from_db()
    assert run.state == EvaluationRun.State.FAILED
    assert "time limit of an evaluation run" in run.error
    assert "LORAHUB_EVALUATION_TIME_LIMIT_S" in run.error
