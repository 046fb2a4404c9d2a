"""Replay specifications small enough for a test."""

from __future__ import annotations

SMALL = {
    "source": "shift",
    "since_hours": "24",
    "alpha": "1.0",
    "drift": "0.2",
    "adapters": "200",
    "tenants": "5",
    "sizes": "uniform",
    "seed": "3",
    "requests": "3000",
    "policies": ["weighted", "lru", "lfu"],
    "l1": "4",
    "l2": "12",
    "l2_gb": "0",
    "l3_gb": "0",
    "sweep": "on",
}
