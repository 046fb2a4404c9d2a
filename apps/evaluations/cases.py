"""Evaluation sets: JSONL cases a tenant attaches to an adapter, parsed and checked whole before
anything is stored, and the expectations an answer is judged by.

One case per line, a JSON object::

    {"id": "greeting",                                  # optional; "line-N" otherwise
     "prompt": "..."  |  "messages": [{"role": "user", "content": "..."}],
     "params": {"max_tokens": 64, "temperature": 0},    # optional; greedy by default
     "expect": {"contains": "Thank you", "regex": "^[A-Z]", "json_schema": {...}}}

Expectations: ``equals``, ``contains``, ``not_contains`` (a string or a list of strings),
``regex`` (searched, with the ``regex`` module and a time limit: a tenant's pattern never
hangs the worker; one that backtracks catastrophically on probe inputs is refused at upload)
and ``json_schema`` (the answer parses as JSON and matches; the schema is checked against its
metaschema at upload, and a ``$ref`` that leaves the schema is refused: nothing is ever fetched,
``lorahub/json_schema.py``). A set that breaks any rule is refused whole, with the line and field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import regex

from apps.tenants.errors import DomainError
from lorahub import json_schema

MAX_BYTES = 1 << 20  # 1 MiB of JSONL
MAX_CASES = 500
MAX_PROMPT_CHARS = 16_000  # a prompt, or all of a case's messages together
MAX_PATTERN_CHARS = 500
MAX_EXPECTED_CHARS = 4_000  # each equals/contains/not_contains string
MAX_TOKENS = 512
REGEX_TIMEOUT_S = 0.05  # per search, at upload (probes) and when judging an answer
ROLES = ("system", "user", "assistant")
EXPECTATIONS = ("equals", "contains", "not_contains", "regex", "json_schema")
# sampling parameters a case may set, with their allowed range; the rest are the engine's
PARAMS: dict[str, tuple[type, float, float]] = {
    "max_tokens": (int, 1, MAX_TOKENS),
    "temperature": (float, 0, 2),
    "top_p": (float, 0.01, 1),
    "seed": (int, 0, 2**31 - 1),
}
DEFAULT_PARAMS: dict[str, Any] = {"max_tokens": 64, "temperature": 0.0}


class InvalidEvaluationSet(DomainError):
    """400: the message names the line and the field, and says what to change."""

    status = 400
    code = "invalid_evaluation_set"


@dataclass(frozen=True)
class Case:
    id: str
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    expect: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "params": self.params, "expect": self.expect}
        if self.messages is not None:
            out["messages"] = self.messages
        else:
            out["prompt"] = self.prompt
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Case:
        return cls(
            id=data["id"],
            prompt=data.get("prompt"),
            messages=data.get("messages"),
            params=data.get("params") or {},
            expect=data.get("expect") or {},
        )


def parse_cases(raw: bytes) -> list[Case]:
    """Every case of a JSONL file, or ``InvalidEvaluationSet`` for the first problem."""
    if len(raw) > MAX_BYTES:
        raise InvalidEvaluationSet(
            f"the set is {len(raw):,} bytes; the limit is {MAX_BYTES:,} bytes "
            f"({MAX_CASES} cases): split it into several sets"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidEvaluationSet(
            f"the set is not UTF-8 text (byte {exc.start}); save it as UTF-8 JSONL"
        ) from None
    cases: list[Case] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if len(cases) == MAX_CASES:
            raise InvalidEvaluationSet(
                f"line {number}: more than {MAX_CASES} cases; split the set into several"
            )
        case = _case(number, line)
        if case.id in seen:
            raise InvalidEvaluationSet(
                f"line {number}: field 'id': '{case.id}' is also the id of line "
                f"{seen[case.id]}; every case needs its own id"
            )
        seen[case.id] = number
        cases.append(case)
    if not cases:
        raise InvalidEvaluationSet(
            "the set has no cases: write one JSON object per line, each with a 'prompt' or "
            "'messages'"
        )
    return cases


def _case(number: int, line: str) -> Case:
    def bad(where: str, what: str) -> InvalidEvaluationSet:
        prefix = f"line {number}: field '{where}': " if where else f"line {number}: "
        return InvalidEvaluationSet(prefix + what)

    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise bad("", f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise bad("", "the JSON is nested too deeply") from None
    if not isinstance(data, dict):
        raise bad("", 'a case is a JSON object, e.g. {"prompt": "..."}')
    unknown = sorted(set(data) - {"id", "prompt", "messages", "params", "expect"})
    if unknown:
        raise bad(
            unknown[0], "unknown field; a case has 'id', 'prompt' or 'messages', 'params', 'expect'"
        )
    case_id = data.get("id", f"line-{number}")
    if not isinstance(case_id, str) or not 1 <= len(case_id) <= 100:
        raise bad("id", "must be a string of 1-100 characters")
    prompt, messages = data.get("prompt"), data.get("messages")
    if (prompt is None) == (messages is None):
        raise bad("prompt", "give either 'prompt' (a string) or 'messages' (a chat), not both")
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt:
            raise bad("prompt", "must be a non-empty string")
        size = len(prompt)
    else:
        messages = _messages(messages, bad)
        size = sum(len(m["content"]) for m in messages)
    if size > MAX_PROMPT_CHARS:
        raise bad(
            "messages" if messages is not None else "prompt",
            f"{size:,} characters; the limit is {MAX_PROMPT_CHARS:,}",
        )
    return Case(
        id=case_id,
        prompt=prompt,
        messages=messages,
        params=_params(data.get("params"), bad),
        expect=_expect(data.get("expect"), bad),
    )


def _messages(value: Any, bad) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise bad("messages", 'must be a non-empty list of {"role", "content"} objects')
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise bad(f"messages[{i}]", "must be an object with exactly 'role' and 'content'")
        if message["role"] not in ROLES:
            raise bad(f"messages[{i}].role", f"must be one of {', '.join(ROLES)}")
        if not isinstance(message["content"], str):
            raise bad(f"messages[{i}].content", "must be a string")
        out.append({"role": message["role"], "content": message["content"]})
    return out


def _params(value: Any, bad) -> dict[str, Any]:
    if value is None:
        return dict(DEFAULT_PARAMS)
    if not isinstance(value, dict):
        raise bad("params", 'must be an object, e.g. {"max_tokens": 64}')
    params: dict[str, Any] = dict(DEFAULT_PARAMS)
    for name, given in value.items():
        if name == "stop":
            if not (
                isinstance(given, list)
                and len(given) <= 4
                and all(isinstance(s, str) and 0 < len(s) <= 100 for s in given)
            ):
                raise bad("params.stop", "must be a list of at most 4 non-empty strings")
            params[name] = given
            continue
        if name not in PARAMS:
            allowed = ", ".join([*PARAMS, "stop"])
            raise bad(f"params.{name}", f"unknown sampling parameter; allowed: {allowed}")
        kind, low, high = PARAMS[name]
        number_ok = isinstance(given, int | float) and not isinstance(given, bool)
        if not number_ok or (kind is int and not isinstance(given, int)):
            raise bad(f"params.{name}", f"must be {'an integer' if kind is int else 'a number'}")
        if not low <= given <= high:
            raise bad(f"params.{name}", f"must be between {low:g} and {high:g}, got {given}")
        params[name] = kind(given)
    return params


def _expect(value: Any, bad) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad("expect", 'must be an object, e.g. {"contains": "Thank you"}')
    out: dict[str, Any] = {}
    for name, given in value.items():
        where = f"expect.{name}"
        if name not in EXPECTATIONS:
            raise bad(where, f"unknown expectation; use {', '.join(EXPECTATIONS)}")
        if name in ("contains", "not_contains"):
            texts = [given] if isinstance(given, str) else given
            if (
                not isinstance(texts, list)
                or not texts
                or not all(isinstance(t, str) and 0 < len(t) <= MAX_EXPECTED_CHARS for t in texts)
            ):
                raise bad(where, "must be a non-empty string or a list of them")
            out[name] = texts
        elif name == "equals":
            if not isinstance(given, str) or len(given) > MAX_EXPECTED_CHARS:
                raise bad(where, f"must be a string of at most {MAX_EXPECTED_CHARS} characters")
            out[name] = given
        elif name == "regex":
            out[name] = _pattern(given, where, bad)
        else:
            out[name] = _schema(given, where, bad)
    return out


def _pattern(given: Any, where: str, bad) -> str:
    if not isinstance(given, str) or not 0 < len(given) <= MAX_PATTERN_CHARS:
        raise bad(where, f"must be a pattern of 1-{MAX_PATTERN_CHARS} characters")
    try:
        compiled = regex.compile(given)
    except regex.error as exc:
        raise bad(where, f"not a valid regular expression ({exc})") from None
    for probe in _probes(given):
        try:
            compiled.search(probe, timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            raise bad(
                where,
                "the pattern backtracks catastrophically (a search of a few thousand "
                "characters took over "
                f"{REGEX_TIMEOUT_S * 1000:.0f} ms); avoid nested repetition such as (a+)+",
            ) from None
    return given


def _probes(pattern: str) -> list[str]:
    """Inputs that make a backtracking pattern blow up: long runs of the characters it
    names, ended by one that fails the match."""
    chars = sorted({c for c in pattern if c.isalnum() or c in " .,-_"} | {"a", "0", " "})
    return [c * 3000 + "\x00" for c in chars[:40]] + ["".join(chars) * 200 + "\x00"]


def _schema(given: Any, where: str, bad) -> dict[str, Any]:
    if not isinstance(given, dict):
        raise bad(where, "must be a JSON Schema object")
    problem = json_schema.check(given)
    if problem:
        raise bad(where, problem)
    return given


# --- judging an answer -------------------------------------------------------------------------


def judge(case: Case, answer: str) -> dict[str, bool]:
    """Each of the case's expectations: whether ``answer`` meets it."""
    out: dict[str, bool] = {}
    expect = case.expect
    if "equals" in expect:
        out["equals"] = answer.strip() == expect["equals"].strip()
    if "contains" in expect:
        out["contains"] = all(t in answer for t in expect["contains"])
    if "not_contains" in expect:
        out["not_contains"] = not any(t in answer for t in expect["not_contains"])
    if "regex" in expect:
        try:
            out["regex"] = (
                regex.search(expect["regex"], answer, timeout=REGEX_TIMEOUT_S) is not None
            )
        except TimeoutError:
            out["regex"] = False  # a pattern that cannot decide in time does not pass
    if "json_schema" in expect:
        try:
            value = json.loads(answer)
        except ValueError:
            out["json_schema"] = False
        else:
            out["json_schema"] = json_schema.matches(expect["json_schema"], value)
    return out
