"""Plotly figures of the dashboards, as plain figure dicts (``{"data": [...], "layout": ...}``)
that the page hands to Plotly.js. Built from ``dashboards.series`` and ``dashboards.fairness``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

Figure = dict[str, Any]
TIER_COLORS = {"l1": "#1b7f3b", "l2": "#3b82c4", "l3": "#c48a1b", "l4": "#b03a2e"}


def _layout(title: str, y_title: str, **extra: Any) -> dict:
    return {
        "title": {"text": title, "font": {"size": 14}},
        "margin": {"l": 55, "r": 30, "t": 40, "b": 40},  # r: room for the last date label
        "height": 280,
        "xaxis": {"type": "date"},
        "yaxis": {"title": {"text": y_title}, "rangemode": "tozero"},
        "legend": {"orientation": "h", "y": -0.2},
        "hovermode": "x unified",
        **extra,
    }


def _line(x: list, y: list, name: str, **style: Any) -> dict:
    return {"type": "scatter", "mode": "lines+markers", "x": x, "y": y, "name": name, **style}


def _outcome_figures(data: dict, t: list, layout: Callable[..., dict], marker: dict) -> dict:
    """What became of the requests, and the quality markers of their answers."""
    return {
        # apps/telemetry/outcomes.py: the error rate is the server failures'; the callers' own
        # mistakes and their rate limits are series of their own, never counted as errors
        "chart-outcomes": {
            "data": [
                _line(t, data.get(key, []), label, line={"color": color}, connectgaps=False)
                for key, label, color in (
                    ("server_failure_rate", "server failures (the error rate)", "#b03a2e"),
                    ("caller_error_rate", "caller errors (4xx)", "#d68910"),
                    ("throttled_rate", "throttled (429)", "#7d3c98"),
                    ("cancelled_rate", "cancelled by the caller", "#7f8c8d"),
                )
            ],
            "layout": layout(
                "What became of requests (share of requests)",
                "share",
                yaxis={"title": {"text": "share"}, "rangemode": "tozero", "tickformat": ".0%"},
            ),
        },
        "chart-quality": {
            "data": [
                _line(t, data.get(f"{key}_share", []), label, marker=marker, connectgaps=False)
                for key, label in (
                    ("cut", "cut by max_tokens"),
                    ("empty", "empty answer"),
                    ("json_invalid", "JSON asked, invalid (of those)"),
                    ("failed", "generation failed"),
                )
            ],
            "layout": layout(
                "Output quality markers (share of requests)",
                "share",
                yaxis={"title": {"text": "share"}, "range": [0, 1.05], "tickformat": ".0%"},
            ),
        },
    }


def timeline(data: dict) -> dict[str, Figure]:
    """The per-tenant (or per-adapter) charts over time, keyed by the element they fill.
    The x axis always spans the whole range picked, so a quiet period looks quiet."""
    t = data.get("t", [])
    marker = {"size": 4}
    span = [data.get("start"), data.get("end")]
    bar_width = data.get("step_s", 60) * 1000 * 0.9  # milliseconds on a date axis

    def layout(title: str, y_title: str, **extra: Any) -> dict:
        return _layout(title, y_title, xaxis={"type": "date", "range": span}, **extra)

    return {
        "chart-ttft": {
            "data": [
                _line(t, data.get(f"ttft_{p}", []), f"TTFT {p}", marker=marker)
                for p in ("p50", "p95", "p99")
            ],
            "layout": layout("Time to first token (from histogram buckets)", "ms"),
        },
        "chart-hits": {
            "data": [
                _line(
                    t,
                    data.get(f"hit_{tier}", []),
                    tier.upper(),
                    marker=marker,
                    line={"color": TIER_COLORS[tier]},
                )
                for tier in ("l1", "l2", "l3", "l4")
            ],
            "layout": layout(
                "Where adapters were found (share of requests)",
                "share",
                yaxis={"title": {"text": "share"}, "range": [0, 1.05], "tickformat": ".0%"},
            ),
        },
        "chart-requests": {
            "data": [
                {
                    "type": "bar",
                    "x": t,
                    "y": data.get("requests", []),
                    "name": "requests",
                    "width": bar_width,
                },
            ],
            "layout": layout("Requests per step", "requests", barmode="overlay"),
        },
        **_outcome_figures(data, t, layout, marker),
        "chart-loads": {
            "data": [
                _line(
                    t,
                    data.get(f"load_{tier}_{p}", []),
                    f"from {tier.upper()} {p}",
                    marker=marker,
                    line={"color": TIER_COLORS[tier], "dash": "dot" if p == "p95" else "solid"},
                    connectgaps=False,
                )
                for tier in ("l3", "l4")
                for p in ("p50", "p95")
            ],
            "layout": layout("Adapter load latency by source tier", "ms"),
        },
    }


def engine(data: dict, share: dict) -> dict[str, Figure]:
    """The tenant's wait for a seat in the engine (p95 per step), and its share of the
    engine's service against its weighted fair share (``engine_share.py``)."""
    span = {"type": "date", "range": [data.get("start"), data.get("end")]}
    marker = {"size": 4}
    return {
        "chart-queue": {
            "data": [_line(data.get("t", []), data.get("queue_p95", []), "queue wait p95")],
            "layout": _layout(
                "Wait for a seat in the engine (p95)", "ms", xaxis=span, showlegend=True
            ),
        },
        "chart-engine-share": {
            "data": [
                _line(share["t"], share["share"], "share of the engine's tokens", marker=marker),
                _line(
                    share["t"],
                    share["fair"],
                    "fair share (weight / weights served)",
                    marker=marker,
                    line={"dash": "dot"},
                ),
            ],
            "layout": _layout(
                "Share of the engine against its weight",
                "share",
                xaxis=span,
                yaxis={"title": {"text": "share"}, "range": [0, 1.05], "tickformat": ".0%"},
            ),
        },
    }


def cache(data: dict, *, hot_quota: int | None = None, warm_quota: int | None = None) -> Figure:
    """Evictions per step (bars) and, for a tenant, its engine residency against its quota."""
    t = data["t"]
    width = data.get("step_s", 60) * 1000 * 0.9
    traces: list[dict] = [
        {"type": "bar", "x": t, "y": data["evictions_l2"], "name": "evicted from engine (L2)",
         "width": width, "marker": {"color": TIER_COLORS["l2"]}},
        {"type": "bar", "x": t, "y": data["evictions_l3"], "name": "evicted from disk (L3)",
         "width": width, "marker": {"color": TIER_COLORS["l3"]}},
    ]  # fmt: skip
    if data["warm"]:
        traces += [
            {"type": "scatter", "mode": "lines", "line": {"shape": "hv", "color": "#1b7f3b"},
             "x": t, "y": data["warm"], "name": "warm (in engine)", "yaxis": "y2"},
            {"type": "scatter", "mode": "lines", "line": {"shape": "hv", "color": "#6b3fa0"},
             "x": t, "y": data["hot"], "name": "hot (device slots)", "yaxis": "y2"},
        ]  # fmt: skip
    shapes = [
        {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y2", "y0": q, "y1": q,
         "line": {"dash": "dash", "color": color, "width": 1}}
        for q, color in ((warm_quota, "#1b7f3b"), (hot_quota, "#6b3fa0")) if q
    ]  # fmt: skip
    layout = _layout(
        "Evictions" + (" and residency against quota (dashed)" if data["warm"] else ""),
        "evictions",
        xaxis={"type": "date", "range": [data["start"], data["end"]]},
        barmode="stack",
        shapes=shapes,
    )
    if data["warm"]:
        layout["yaxis2"] = {
            "title": {"text": "versions"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
        }
    return {"data": traces, "layout": layout}


def fairness(rows: list[dict]) -> dict[str, Figure]:
    """Each tenant's engine hit rate and p95 TTFT side by side (operators)."""
    tenants = [r["tenant"] for r in rows]
    return {
        "chart-fairness": {
            "data": [
                {
                    "type": "bar",
                    "x": tenants,
                    "y": [r["hit_rate"] for r in rows],
                    "name": "hit rate (L1+L2)",
                    "yaxis": "y",
                    "offsetgroup": 1,
                },
                {
                    "type": "bar",
                    "x": tenants,
                    "y": [r["ttft_p95"] for r in rows],
                    "name": "p95 TTFT (ms)",
                    "yaxis": "y2",
                    "offsetgroup": 2,
                },
            ],
            "layout": {
                **_layout("Fairness: hit rate and p95 TTFT per tenant", "hit rate"),
                "xaxis": {"type": "category"},
                "yaxis": {"title": {"text": "hit rate"}, "range": [0, 1.05], "tickformat": ".0%"},
                "yaxis2": {
                    "title": {"text": "p95 TTFT (ms)"},
                    "overlaying": "y",
                    "side": "right",
                    "rangemode": "tozero",
                },
                "barmode": "group",
                "hovermode": "closest",
            },
        }
    }


def replay_runs(report: dict) -> list[dict]:
    """A replay's per-policy figures, the default first (PostgreSQL's jsonb keeps no key
    order)."""
    order = {name: n for n, name in enumerate(report.get("policy_order", []))}
    return sorted(report["policies"].values(), key=lambda r: order.get(r["policy"], len(order)))


def _replay_tiers(runs: list[dict], names: list[str], best: dict) -> list[dict]:
    """Each policy's tiers, stacked, with the offline optimum (and the online ceiling)."""
    tiers = [
        {
            "type": "bar",
            "x": names,
            "y": [r["tier_rates"][tier] for r in runs],
            "name": tier,
            "marker": {"color": TIER_COLORS[tier.lower()]},
        }
        for tier in ("L1", "L2", "L3", "L4")
    ]
    tiers.append(
        {
            "type": "scatter",
            "mode": "lines",
            "x": names,
            "y": [best["hit_rate"]] * len(names),
            "name": f"{best['kind']} (engine hits)",
            "line": {"dash": "dash", "color": "#222"},
        }
    )
    if "known_popularity_hit_rate" in best:
        tiers.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": names,
                "y": [best["known_popularity_hit_rate"]] * len(names),
                "name": "A0, popularity known (online ceiling)",
                "line": {"dash": "dot", "color": "#666"},
            }
        )
    return tiers


def _replay_sweep(sweep: dict, runs: list[dict]) -> Figure:
    """Engine hit rate against L2 slots, one line per policy."""
    lines = [  # in the order run (jsonb keeps no key order)
        _line(sweep["values"], sweep["policies"][r["policy"]], r["policy"])
        for r in runs
        if r["policy"] in sweep["policies"]
    ]
    if "optimum" in sweep:
        lines.append(_line(sweep["values"], sweep["optimum"], "offline", line={"dash": "dash"}))
    return {
        "data": lines,
        "layout": _layout(
            "Engine hit rate (L1+L2) against L2 slots (log scale)",
            "hit rate",
            xaxis={"type": "log", "tickvals": sweep["values"]},
            hovermode="closest",
        ),
    }


def replay(report: dict) -> dict[str, Figure]:
    """The replay page's charts: tiers per policy against the offline optimum, reload time,
    TTFT percentiles and, when swept, hit rate against L2 capacity."""
    runs = replay_runs(report)
    names = [r["policy"] for r in runs]
    best = report["optimum"]

    def layout(title: str, y_title: str, **extra: Any) -> dict:
        return _layout(title, y_title, xaxis={"type": "category"}, hovermode="closest", **extra)

    tiers = _replay_tiers(runs, names, best)
    figures = {
        "chart-replay-tiers": {
            "data": tiers,
            "layout": layout(
                "Where requests were served, per policy", "share of requests", barmode="stack"
            ),
        },
        "chart-replay-reload": {
            "data": [
                {"type": "bar", "x": names, "y": [r["reload_s"] for r in runs], "name": "reload"}
            ],
            "layout": layout("Total time spent loading adapters", "seconds"),
        },
        "chart-replay-ttft": {
            "data": [
                {
                    "type": "bar",
                    "x": names,
                    "y": [r["ttft_ms"][p] for r in runs],
                    "name": f"TTFT {p}",
                }
                for p in ("p50", "p95", "p99")
            ],
            "layout": layout("Estimated time to first token", "ms", barmode="group"),
        },
    }
    sweep = report.get("sweeps", {}).get("l2")
    if sweep:
        figures["chart-replay-sweep"] = _replay_sweep(sweep, runs)
    return figures


def shadow(minutes: list[dict], since: str, until: str) -> Figure:
    """The shadow's agreement with the live answers per minute since it was set: the share
    of identical answers and the mean similarity."""
    t = [m["t"] for m in minutes]
    return {
        "data": [
            _line(t, [m["agreement"] for m in minutes], "identical answers", marker={"size": 5}),
            _line(t, [m["similarity"] for m in minutes], "mean similarity", marker={"size": 5}),
        ],
        "layout": _layout(
            "Shadow against live, per minute",
            "share",
            yaxis={"title": {"text": "share"}, "range": [0, 1.05], "tickformat": ".0%"},
            xaxis={"type": "date", "range": [since, until]},
        ),
    }


def usage(days: list, stacks: dict[str, dict], stack_name: str) -> Figure:
    """Tokens per day, one bar segment per ``stack_name`` (alias or tenant)."""
    x = [d.isoformat() for d in days]
    # half a day either side, so that the first and last bars are whole
    bounds = [f"{days[0] - timedelta(days=1)}T12:00:00", f"{days[-1]}T12:00:00"] if days else None
    return {
        "data": [
            {
                "type": "bar",
                "name": name,
                "x": x,
                "y": [per_day.get(d, 0) for d in days],
                "hovertemplate": f"{name}: %{{y:,}} tokens<extra></extra>",
            }
            for name, per_day in sorted(stacks.items())
        ],
        "layout": _layout(
            f"Tokens per day, by {stack_name} (prompt + completion)",
            "tokens",
            barmode="stack",
            height=320,
            xaxis={"type": "date", "range": bounds},
        ),
    }
