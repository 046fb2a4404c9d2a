"""Output-quality markers: what a request's answer looked like, recorded with its statistics
and rolled up per version (``stats.py``), so that a new version's answers can be judged, not
only its error rate and latency.

Per request: how it finished (``stop``, cut by ``max_tokens`` = ``length``, ``error``), whether
an answer came back empty, whether vLLM refused the request itself, and — when the request
asked for JSON with ``response_format`` — whether the answer parsed and, for a
``json_schema`` format, whether it matched the schema. Pure functions: the node computes them
when a request ends, off nothing but what the request and its generation already hold.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from rapidfuzz.distance import Levenshtein

from lorahub import json_schema

FINISH_REASONS = ("stop", "length", "error")


def similarity(a: str, b: str) -> float:
    """1 - the normalised edit distance between two answers' words (rapidfuzz): 1.0 for
    identical answers, 0.0 for answers with no word in place in common."""
    if not a and not b:
        return 1.0
    return float(Levenshtein.normalized_similarity(a.split(), b.split()))


@dataclass(frozen=True)
class JsonWanted:
    """What a request's ``response_format`` asked for: any JSON value, or one matching
    ``schema`` (its text, so that compiled validators can be cached by it)."""

    schema: str | None = None


def json_wanted(body: dict[str, Any]) -> JsonWanted | None:
    """``response_format`` of an OpenAI request, if it asks for JSON."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        return None
    kind = fmt.get("type")
    if kind == "json_object":
        return JsonWanted()
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if isinstance(schema, dict):
            return JsonWanted(json.dumps(schema, sort_keys=True))
        return JsonWanted()
    return None


@functools.lru_cache(maxsize=256)
def _schema(schema: str) -> dict[str, Any] | None:
    """``schema`` loaded; None for one that is not valid JSON Schema (vLLM refuses such a
    request, so its answers are judged only on parsing) or that refers outside itself (never
    fetched: ``lorahub/json_schema.py``, the rule evaluation sets follow)."""
    try:
        loaded = json.loads(schema)
    except ValueError:
        return None
    if not isinstance(loaded, dict) or json_schema.check(loaded) is not None:
        return None
    return loaded


@dataclass(frozen=True)
class JsonVerdict:
    valid: bool  # every choice parsed as JSON
    matches: bool | None  # every choice matched the schema; None without one


def judge_json(texts: list[str], wanted: JsonWanted) -> JsonVerdict:
    """Whether every choice's text is JSON (and matches the schema asked for)."""
    values = []
    for text in texts:
        try:
            values.append(json.loads(text))
        except ValueError:
            return JsonVerdict(valid=False, matches=False if wanted.schema else None)
    schema = _schema(wanted.schema) if wanted.schema else None
    if schema is None:
        return JsonVerdict(valid=bool(values), matches=None)
    return JsonVerdict(
        valid=bool(values),
        matches=bool(values) and all(json_schema.matches(schema, v) for v in values),
    )


_WORDS = re.compile(r"\s*\S+\s*|\s+")  # each word with the spaces around it


def side_by_side(
    baseline: str, candidate: str
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Each answer as (kind, text) pieces: ``same``, or ``del`` (only in the baseline) and
    ``ins`` (only in the candidate), split at word boundaries."""
    old, new = _WORDS.findall(baseline), _WORDS.findall(candidate)
    left: list[tuple[str, str]] = []
    right: list[tuple[str, str]] = []
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            left.append(("same", "".join(old[i1:i2])))
            right.append(("same", "".join(new[j1:j2])))
            continue
        if i2 > i1:
            left.append(("del", "".join(old[i1:i2])))
        if j2 > j1:
            right.append(("ins", "".join(new[j1:j2])))
    return left, right
