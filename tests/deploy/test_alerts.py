"""deploy/prometheus/alerts.yml and deploy/grafana/lorahub.json: every alert rule fires (and
stays quiet) on sample series, under Prometheus' own `promtool test rules`; every metric the
rules and the dashboard read is one the nodes or the console export, so a renamed metric fails
here rather than in someone's silent dashboard."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from lorahub import health

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "lorahub.json"
PROMTOOL = ROOT / "var" / "tools" / "promtool"  # `make promtool`: Debian's, from its package
# PromQL words that are not metric names
PROMQL = {
    "sum", "by", "rate", "increase", "delta", "histogram_quantile", "and", "or", "unless",
    "without", "le", "tier", "instance", "tenant", "outcome", "state", "job", "source_tier",
    "marker", "up", "__rate_interval",
}  # fmt: skip


def promtool() -> Path:
    if not PROMTOOL.exists():
        subprocess.run(["make", "--no-print-directory", "promtool"], cwd=ROOT, check=True)
    return PROMTOOL


def test_every_alert_rule_passes_its_unit_test():
    rules = yaml.safe_load(RULES.read_text())
    names = {r["alert"] for group in rules["groups"] for r in group["rules"]}
    tests = yaml.safe_load((RULES.parent / "alerts.test.yml").read_text())
    tested = {case["alertname"] for t in tests["tests"] for case in t["alert_rule_test"]}
    assert names == tested, f"rules without a test: {sorted(names - tested)}"
    assert {
        "LorahubNodeDown",
        "LorahubEngineRestarting",
        "LorahubHitRateFalling",
        "LorahubLoadQueueSaturated",
        "LorahubVersionQuarantined",
        "LorahubReleaseRolledBack",
    } <= names
    checked = subprocess.run(
        [str(promtool()), "test", "rules", "alerts.test.yml"],
        cwd=RULES.parent,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def exported_metrics() -> set[str]:
    """What a node and the console export, as Prometheus names the samples."""
    from apps.serving.node.metrics import NodeMetrics

    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    names = {"up"}
    for collector in (NodeMetrics().registry, health._registry):
        for family in collector.collect():
            names |= {family.name, *(family.name + s for s in suffixes.get(family.type, []))}
    return names


def metrics_in(expr: str) -> set[str]:
    without_labels = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)
    words = set(re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", without_labels))
    return {w for w in words if w not in PROMQL and not re.fullmatch(r"\d+\w*", w)}


@pytest.mark.django_db
def test_the_rules_and_the_dashboard_read_metrics_that_exist():
    known = exported_metrics()
    rules = yaml.safe_load(RULES.read_text())
    exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for n, target in enumerate(panel["targets"]):
            exprs[f"{panel['title']} #{n}"] = target["expr"]
    unknown = {where: metrics_in(e) - known for where, e in exprs.items() if metrics_in(e) - known}
    assert not unknown, f"metrics nobody exports: {unknown}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
