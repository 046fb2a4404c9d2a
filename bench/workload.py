"""The many-adapter workload the adapter benches share: the Azure conversation trace's arrivals
mapped to N aliases by Zipf(1.0), 20 % of the ranking reshuffled every 10 trace minutes."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "azure-llm-2023-conv.csv"


def workload(names: list[str], n: int, seed: int) -> list[str]:
    """The aliases of ``n`` arrivals taken evenly across the Azure trace's hour."""
    import numpy as np

    from apps.serving.replay import traces

    trace = traces.from_csv(
        TRACE,
        world=traces.World(adapters=len(names), tenants=1, seed=seed),
        alpha=1.0,
        drift=0.2,
        drift_every_s=600.0,
    )
    picks = np.linspace(0, len(trace) - 1, n).round().astype(int)
    return [names[trace.keys[i]] for i in picks]


def ranking(models: list[str], names: list[str]) -> list[str]:
    """Aliases, most requested in the workload first."""
    from collections import Counter

    counts = Counter(models)
    return sorted(names, key=lambda n: (-counts[n], n))
