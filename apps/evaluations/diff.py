"""Word-level differences between two answers, for the run page's side-by-side view."""

from __future__ import annotations

import difflib
import re

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
