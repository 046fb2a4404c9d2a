"""`make test`'s lanes (tools/run_tests.py) run every test once: for any set of markers a test
may carry, exactly one lane's ``-m`` expression selects it; and lanes that run at once share
no database, Redis database or log."""

from __future__ import annotations

import itertools
import tomllib

from _pytest.mark.expression import Expression

from tools.run_tests import ROOT, lanes

# every marker the project declares (pyproject.toml; --strict-markers refuses any other)
MARKERS = tuple(
    line.split(":")[0]
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"
    ]["markers"]
)


def selecting(marks: set[str]) -> list[str]:
    together, alone = lanes("cp-python", "python")
    return [
        lane.name
        for lane in together + alone
        if Expression.compile(lane.marks).evaluate(lambda name, **_: name in marks)
    ]


def test_every_combination_of_markers_runs_in_exactly_one_lane():
    for n in range(len(MARKERS) + 1):
        for marks in itertools.combinations(MARKERS, n):
            assert len(selecting(set(marks))) == 1, (marks, selecting(set(marks)))


def test_tests_go_where_their_markers_say():
    assert selecting({"engine"}) == ["session node"]
    assert selecting({"browser"}) == ["session node"]
    assert selecting({"engine", "in_process_engine"}) == ["drills and engine"]
    assert selecting({"engine", "own_nodes", "in_process_engine"}) == ["own nodes"]
    assert selecting({"engine", "own_nodes", "faults"}) == ["drills and engine"]
    assert selecting({"engine", "browser", "outage"}) == ["outages engine"]
    assert selecting(set()) == ["control plane"]
    assert selecting({"deploy"}) == ["deploy"]


def test_lanes_that_run_at_once_share_no_database_redis_database_or_log():
    together, _ = lanes("cp-python", "python")
    for attribute in ("database", "redis_db", "slug"):
        values = [getattr(lane, attribute) for lane in together]
        assert len(set(values)) == len(values), (attribute, values)
