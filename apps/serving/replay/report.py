"""Terminal tables for replay reports (``run.execute``) and tuning rows (``run.tune``)."""

from __future__ import annotations


def _pct(x: float) -> str:
    return f"{x * 100:5.1f}%"


def _costs(costs: dict) -> str:
    return (
        f"base TTFT {costs['base_ttft_ms']:.0f} ms, L3 {costs['l3_ms']:.0f} ms "
        f"+ {costs['l3_ms_per_mb']:g}/MB, L4 +{costs['l4_ms']:.0f} ms + "
        f"{costs['l4_ms_per_mb']:g}/MB — {costs.get('source', '')}"
    )


def policy_table(report: dict) -> str:
    trace, best = report["trace"], report["optimum"]
    lines = [
        f"trace: {trace['name']} — {trace['requests']} requests, {trace['adapters']} adapters, "
        f"{trace['tenants']} tenants over {trace['duration_s'] / 60:.0f} min",
        f"  mapping: {trace['description']}",
        f"capacity: {report['capacity']['described']}; offline reference: {best['kind']}"
        + ("" if best.get("bound") else " (a heuristic, not a bound)"),
        f"load costs: {_costs(report['costs'])}",
        "",
        f"{'policy':<10}{'hit':>7}{'L1':>7}{'L2':>7}{'L3':>7}{'L4':>7}{'bytes':>7}"
        f"{'of opt':>8}{'reload s':>10}{'TTFT p50':>9}{'p95':>8}{'p99':>8}"
        f"{'evict L2':>9}{'L3':>6}{'peak L2 MB':>11}{'Jain':>6}{'req/s':>9}",
    ]
    rows = list(report["policies"].values())
    if not best.get("bound"):
        rows.append({**best, "policy": "offline"})
    for run in rows:
        tiers = run["tier_rates"]
        share = run.get("share_of_optimum")
        lines.append(
            f"{run['policy']:<10}{_pct(run['hit_rate']):>7}{_pct(tiers['L1']):>7}"
            f"{_pct(tiers['L2']):>7}{_pct(tiers['L3']):>7}{_pct(tiers['L4']):>7}"
            f"{_pct(run['byte_hit_rate']):>7}"
            f"{(_pct(share) if share is not None else '—'):>8}{run['reload_s']:>10.1f}"
            f"{run['ttft_ms']['p50']:>9.0f}{run['ttft_ms']['p95']:>8.0f}{run['ttft_ms']['p99']:>8.0f}"
            f"{run['evictions']['L2']:>9}{run['evictions']['L3']:>6}{run['peak_mb']['L2']:>11.0f}"
            f"{run['fairness']:>6.3f}{run['requests_per_s']:>9.0f}"
        )
    if best.get("bound"):
        lines.append(f"{'Belady':<10}{_pct(best['hit_rate']):>7}")
    if "known_popularity_hit_rate" in best:
        known = best["known_popularity_hit_rate"]
        lines.append(
            f"{'A0':<10}{_pct(known):>7}{'':>35}{_pct(known / best['hit_rate']):>8}"
            "  (the online ceiling: evicts the least popular, knowing the trace's popularity)"
        )
    if "node_tiers" in report:
        node = report["node_tiers"]
        lines.append(
            "as the node reported: " + ", ".join(f"{t} {_pct(v).strip()}" for t, v in node.items())
        )
    return "\n".join(lines)


def tenant_table(report: dict, policy: str) -> str:
    run = report["policies"][policy]
    lines = [f"per tenant under {policy} (Jain's index {run['fairness']:.3f}):"]
    lines.append(f"{'tenant':<10}{'requests':>9}{'hit':>8}{'TTFT p95':>10}")
    for tenant, row in sorted(run["tenants"].items(), key=lambda kv: -kv[1]["requests"])[:20]:
        lines.append(
            f"{tenant:<10}{row['requests']:>9}{_pct(row['hit_rate']):>8}{row['ttft_p95_ms']:>10.0f}"
        )
    return "\n".join(lines)


def sweep_table(report: dict, which: str) -> str:
    curve = report["sweeps"][which]
    label = "L1 hit rate" if which == "l1" else "engine hit rate (L1+L2)"
    lines = [f"{label} vs {which.upper()} slots:"]
    lines.append(f"{'policy':<10}" + "".join(f"{v:>8}" for v in curve["values"]))
    for name, rates in curve["policies"].items():
        lines.append(f"{name:<10}" + "".join(f"{_pct(r):>8}" for r in rates))
    if "optimum" in curve:
        lines.append(f"{'offline':<10}" + "".join(f"{_pct(r):>8}" for r in curve["optimum"]))
    return "\n".join(lines)


def tune_table(rows: list[dict], top: int = 12) -> str:
    lines = [
        f"{'memory':>8}{'drift s':>8}{'bursts s':>9}{'priority w':>11}{'size exp':>9}"
        f"{'train hit':>10}{'reload s':>9}{'valid hit':>10}{'reload s':>9}"
    ]
    shown = rows[:top] + [r for r in rows[top:] if r["shipped"]]
    for row in shown:
        p = row["params"]
        lines.append(
            f"{p['memory']:>8g}{p['drift_half_life_s']:>8g}{p['bursts_recency_s']:>9g}"
            f"{p['priority_weight']:>11g}{p['size_exponent']:>9g}"
            f"{_pct(row['train']['hit_rate']):>10}{row['train']['reload_s']:>9.1f}"
            f"{_pct(row['validate']['hit_rate']):>10}{row['validate']['reload_s']:>9.1f}"
            + ("  <- shipped default" if row["shipped"] else "")
        )
    return "\n".join(lines)
