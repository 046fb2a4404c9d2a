"""Request sequences to replay: synthetic generators, a CSV arrival trace with a seeded
mapping to tenants and adapters, and files exported from a node's request log.

The mapping of a trace without tenants or adapters (such as the Azure conversation trace) is
documented here and printed beside every result (``Trace.description``):

* ``adapters`` adapters owned round-robin by ``tenants`` tenants (adapter ``a`` belongs to
  tenant ``a % tenants``); tenant priorities 0/1/2 (batch/standard/premium) drawn 50/35/15.
* Sizes: ``uniform`` — every adapter 27 MB (Llama-3-8B, rank 16, q/k/v/o in bf16); ``mixed``
  — ranks 8/16/32/64 drawn 40/35/18/7, i.e. 14/27/55/109 MB.
* Popularity: Zipf with exponent ``alpha`` over a random ranking of the adapters; with
  ``drift`` > 0, every ``drift_every_s`` seconds that share of the adapters swap ranks at
  random (launches, campaigns ending).
* Each request picks its adapter independently from the popularity of that moment; arrival
  times come from the CSV (or, for synthetic traces, a Poisson process at ``rate`` per
  second, 5.4/s by default: the Azure trace's mean).

Everything is drawn from one ``numpy`` generator seeded with ``seed``: the same arguments give
the same trace on any machine.

A generated trace also keeps the popularity it was drawn from (``Trace.popularity``: each
epoch's request probability per adapter), so the replay can report the ceiling of an online
policy that knew it (``offline.known_popularity_hits``). A trace read from a node's log has
none, nor has a bursty one (its bursts are a second, faster process the epochs do not hold).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

MB = 1048576
RANK_MB = {8: 14, 16: 27, 32: 55, 64: 109}
RANK_MIX = {8: 40, 16: 35, 32: 18, 64: 7}
AZURE_RATE = 19_366 / 3600  # the conversation trace's mean arrivals per second


@dataclass(frozen=True)
class Adapter:
    key: int
    tenant: int
    size_bytes: int
    label: str = ""


@dataclass(frozen=True)
class Epoch:
    """From request ``start`` on (until the next epoch), request ``i`` names adapter ``k`` with
    probability ``p[k]``, independently of every other request; keys past ``p``'s end: 0."""

    start: int
    p: np.ndarray

    def of(self, key: int) -> float:
        return float(self.p[key]) if 0 <= key < len(self.p) else 0.0


@dataclass
class Trace:
    """Requests in arrival order (``at`` seconds, ``keys`` adapter keys) and their world."""

    name: str
    description: str
    adapters: dict[int, Adapter]
    priorities: dict[int, int]  # tenant -> priority (0 batch, 1 standard, 2 premium)
    at: list[float]
    keys: list[int]
    tiers: list[str] | None = None  # what the node reported, for a trace from its log
    # how long each request held its version (s), for a trace from the node's log: from its
    # arrival (``at``) to its last byte; None when unknown (a version leaves whenever chosen)
    held_s: list[float] | None = None
    tenant_names: dict[int, str] = field(default_factory=dict)
    popularity: list[Epoch] | None = None  # what a generator drew from; None when unknown

    def __len__(self) -> int:
        return len(self.keys)

    def head(self, fraction: float) -> Trace:
        return self._slice(0, int(len(self) * fraction), f"{self.name}[:{fraction:g}]")

    def tail(self, fraction: float) -> Trace:
        return self._slice(
            int(len(self) * (1 - fraction)), len(self), f"{self.name}[-{fraction:g}:]"
        )

    def _slice(self, start: int, stop: int, name: str) -> Trace:
        return Trace(
            name=name,
            description=self.description,
            adapters=self.adapters,
            priorities=self.priorities,
            at=self.at[start:stop],
            keys=self.keys[start:stop],
            tiers=self.tiers[start:stop] if self.tiers else None,
            held_s=self.held_s[start:stop] if self.held_s else None,
            tenant_names=self.tenant_names,
            popularity=_epochs_within(self.popularity, start, stop),
        )


def _epochs_within(epochs: list[Epoch] | None, start: int, stop: int) -> list[Epoch] | None:
    """The epochs of requests ``start:stop``, renumbered from ``start``."""
    if epochs is None:
        return None
    first = max(i for i, e in enumerate(epochs) if e.start <= start)  # epochs[0] starts at 0
    later = [Epoch(e.start - start, e.p) for e in epochs[first + 1 :] if e.start < stop]
    return [Epoch(0, epochs[first].p), *later]


@dataclass(frozen=True)
class World:
    """Who owns which adapter, how big each is and each tenant's priority."""

    adapters: int = 1000
    tenants: int = 30
    sizes: str = "uniform"  # or "mixed"
    seed: int = 7

    def build(self, rng: np.random.Generator) -> tuple[dict[int, Adapter], dict[int, int]]:
        priorities = {
            t: int(p) for t, p in enumerate(rng.choice(3, self.tenants, p=[0.5, 0.35, 0.15]))
        }
        if self.sizes == "uniform":
            sizes = np.full(self.adapters, RANK_MB[16])
        elif self.sizes == "mixed":
            ranks = rng.choice(
                list(RANK_MIX), self.adapters, p=np.array(list(RANK_MIX.values())) / 100
            )
            sizes = np.array([RANK_MB[int(r)] for r in ranks])
        else:
            raise ValueError(f"sizes must be 'uniform' or 'mixed', not {self.sizes!r}")
        adapters = {
            a: Adapter(a, a % self.tenants, int(sizes[a]) * MB, f"t{a % self.tenants}/a{a}")
            for a in range(self.adapters)
        }
        return adapters, priorities

    def describe(self) -> str:
        sizes = "27 MB each" if self.sizes == "uniform" else "14/27/55/109 MB drawn 40/35/18/7 %"
        return (
            f"{self.adapters} adapters over {self.tenants} tenants (priorities 0/1/2 drawn "
            f"50/35/15 %), {sizes}, seed {self.seed}"
        )


def _zipf_weights(n: int, alpha: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1) ** alpha
    return weights / weights.sum()


def _popularity_draws(
    rng: np.random.Generator,
    at: np.ndarray,
    n: int,
    alpha: float,
    drift: float,
    drift_every_s: float,
) -> tuple[np.ndarray, list[Epoch]]:
    """Adapter per request: Zipf(alpha) over a ranking that re-shuffles ``drift`` of its
    entries every ``drift_every_s`` seconds; and each epoch's probability per adapter."""
    ranking = rng.permutation(n)
    weights = _zipf_weights(n, alpha)
    ranks = rng.choice(n, len(at), p=weights)
    epochs = (at // drift_every_s).astype(np.int64) if drift > 0 else np.zeros(len(at), np.int64)
    out = np.empty(len(at), dtype=np.int64)
    schedule = []
    start = 0
    for epoch in np.unique(epochs):
        stop = start + int((epochs == epoch).sum())
        if epoch and drift > 0:
            moved = rng.choice(n, int(n * drift), replace=False)
            ranking[moved] = ranking[rng.permutation(moved)]
        out[start:stop] = ranking[ranks[start:stop]]
        p = np.empty(n)
        p[ranking] = weights  # the adapter at rank r is asked for with the r-th weight
        schedule.append(Epoch(start, p))
        start = stop
    return out, schedule


def poisson_arrivals(rng: np.random.Generator, requests: int, rate: float) -> np.ndarray:
    return np.cumsum(rng.exponential(1.0 / rate, requests))


def _trace(name, description, world, adapters, priorities, at, keys, popularity) -> Trace:
    return Trace(
        name=name,
        description=f"{description}; {world.describe()}",
        adapters=adapters,
        priorities=priorities,
        at=[float(t) for t in at],
        keys=[int(k) for k in keys],
        popularity=popularity,
    )


def _synthetic(
    world: World,
    requests: int,
    rate: float,
    alpha: float,
    drift: float = 0.0,
    drift_every_s: float = 600.0,
):
    """The generator, the world, Poisson arrivals and Zipf draws every synthetic trace starts
    from (always drawn in this order, so a seed gives the same trace)."""
    rng = np.random.default_rng(world.seed)
    adapters, priorities = world.build(rng)
    at = poisson_arrivals(rng, requests, rate)
    keys, popularity = _popularity_draws(rng, at, world.adapters, alpha, drift, drift_every_s)
    return rng, adapters, priorities, at, keys, popularity


def zipf(
    alpha: float = 1.0,
    *,
    requests: int = 50_000,
    rate: float = AZURE_RATE,
    world: World = World(),
    drift: float = 0.0,
    drift_every_s: float = 600.0,
    name: str | None = None,
) -> Trace:
    """Independent Zipf requests (``drift`` > 0: a shifting hot set)."""
    _, adapters, priorities, at, keys, popularity = _synthetic(
        world, requests, rate, alpha, drift, drift_every_s
    )
    what = f"Zipf {alpha:g}, Poisson {rate:.2f}/s, {requests} requests"
    if drift:
        what += f", {drift:.0%} of ranks shuffled every {drift_every_s / 60:g} min"
    default = f"zipf-{alpha:g}" + (f"-drift{drift:g}" if drift else "")
    return _trace(name or default, what, world, adapters, priorities, at, keys, popularity)


def bursty(
    *,
    requests: int = 50_000,
    rate: float = AZURE_RATE,
    world: World = World(),
    alpha: float = 1.0,
    on_s: float = 60.0,
    off_s: float = 540.0,
    burst_share: float = 0.5,
    bursting: int = 20,
) -> Trace:
    """Zipf background, plus ``bursting`` adapters that each alternate ``on_s`` of heavy use
    (together ``burst_share`` of the traffic while on) with ``off_s`` of silence."""
    rng, adapters, priorities, at, keys, _ = _synthetic(world, requests, rate, alpha)
    bursters = rng.choice(world.adapters, bursting, replace=False)
    phase = rng.uniform(0, on_s + off_s, bursting)
    for i, t in enumerate(at):
        on = bursters[((t + phase) % (on_s + off_s)) < on_s]
        if len(on) and rng.random() < burst_share:
            keys[i] = on[rng.integers(len(on))]
    what = (
        f"bursty: Zipf {alpha:g} background, {bursting} adapters on {on_s:g} s / off {off_s:g} s "
        f"taking {burst_share:.0%} while on, Poisson {rate:.2f}/s, {requests} requests"
    )
    return _trace("bursty", what, world, adapters, priorities, at, keys, None)


def scan(
    *,
    requests: int = 50_000,
    rate: float = AZURE_RATE,
    world: World = World(),
    alpha: float = 1.0,
    scan_share: float = 0.2,
) -> Trace:
    """Zipf traffic where ``scan_share`` of the requests each name a new adapter used once
    (an evaluation sweep, a crawler): what a recency-only policy lets flush its cache."""
    rng, adapters, priorities, at, keys, popularity = _synthetic(world, requests, rate, alpha)
    one_off = rng.random(requests) < scan_share
    size = RANK_MB[16] * MB
    next_key = world.adapters
    for i in np.flatnonzero(one_off):
        tenant = int(rng.integers(world.tenants))
        adapters[next_key] = Adapter(next_key, tenant, size, f"t{tenant}/scan{next_key}")
        keys[i] = next_key
        next_key += 1
    what = (
        f"scan: Zipf {alpha:g} with {scan_share:.0%} one-off adapters, "
        f"Poisson {rate:.2f}/s, {requests} requests"
    )
    # each one-off adapter is asked for once, never again: probability 0 from then on
    background = [Epoch(e.start, e.p * (1 - scan_share)) for e in popularity]
    return _trace("scan", what, world, adapters, priorities, at, keys, background)


def read_arrivals(path: Path) -> np.ndarray:
    """Seconds since the first row, from a CSV with a ``TIMESTAMP`` column (Azure format)."""
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or "TIMESTAMP" not in reader.fieldnames:
            raise ValueError(f"{path}: expected a TIMESTAMP column, found {reader.fieldnames}")
        stamps = [datetime.fromisoformat(row["TIMESTAMP"][:26]) for row in reader]
    if not stamps:
        raise ValueError(f"{path}: no rows")
    start = stamps[0]
    return np.array([(s - start).total_seconds() for s in stamps])


def from_csv(
    path: Path,
    *,
    world: World = World(),
    alpha: float = 1.0,
    drift: float = 0.2,
    drift_every_s: float = 600.0,
) -> Trace:
    """A CSV arrival trace, mapped to tenants and adapters by the module's documented scheme."""
    rng = np.random.default_rng(world.seed)
    adapters, priorities = world.build(rng)
    at = read_arrivals(path)
    keys, popularity = _popularity_draws(rng, at, world.adapters, alpha, drift, drift_every_s)
    what = (
        f"{path.name}: {len(at)} arrivals over {at[-1] / 60:.0f} min, Zipf {alpha:g}, "
        f"{drift:.0%} of ranks shuffled every {drift_every_s / 60:g} min"
    )
    return _trace(path.stem, what, world, adapters, priorities, at, keys, popularity)


# --- files exported from a node's request log (``manage.py export_requests``) --------------

EXPORT_FIELDS = (
    "at",  # when the request arrived
    "tenant",
    "alias",
    "version_id",
    "version",
    "size_bytes",
    "priority",
    "tier",
    "duration_ms",  # arrival to last byte: how long the request held its version
)


def write_export(rows: Iterable[dict], path: Path) -> int:
    """Write rows (``EXPORT_FIELDS``) as JSONL (``.jsonl``) or CSV (anything else)."""
    count = 0
    with path.open("w", newline="") as fh:
        if path.suffix == ".jsonl":
            for row in rows:
                fh.write(json.dumps({k: row[k] for k in EXPORT_FIELDS}) + "\n")
                count += 1
        else:
            writer = csv.DictWriter(fh, fieldnames=EXPORT_FIELDS)
            writer.writeheader()
            for row in rows:
                writer.writerow({k: row[k] for k in EXPORT_FIELDS})
                count += 1
    return count


def from_rows(rows: Iterable[dict], *, name: str, description: str) -> Trace:
    """A trace from request-log rows in arrival order: ``at`` (ISO time or seconds),
    ``tenant``, ``version_id``, ``size_bytes``, ``priority`` and, when known, the ``tier`` the
    node reported and ``duration_ms`` (arrival to last byte; files exported before it was
    written have none, and their versions are never held in the replay)."""
    adapters: dict[int, Adapter] = {}
    priorities: dict[int, int] = {}
    tenant_ids: dict[str, int] = {}
    at: list[float] = []
    keys: list[int] = []
    tiers: list[str] = []
    held: list[float] = []
    start: datetime | None = None
    for number, row in enumerate(rows, start=1):
        try:
            stamp = row["at"]
            if isinstance(stamp, int | float) or str(stamp).replace(".", "", 1).isdigit():
                seconds = float(stamp)
            else:
                moment = datetime.fromisoformat(str(stamp))
                start = start or moment
                seconds = (moment - start).total_seconds()
            tenant = tenant_ids.setdefault(str(row["tenant"]), len(tenant_ids))
            key = int(row["version_id"])
            size = int(row["size_bytes"])
            priority = int(row.get("priority") or 1)
            duration = float(row.get("duration_ms") or 0) / 1000
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(
                f"{name}: row {number}: {exc!r}; expected {', '.join(EXPORT_FIELDS)}"
            ) from None
        adapters.setdefault(
            key,
            Adapter(
                key,
                tenant,
                size,
                f"{row['tenant']}/{row.get('alias', '')}@{row.get('version', key)}",
            ),
        )
        priorities[tenant] = priority
        at.append(seconds)
        keys.append(key)
        tiers.append(str(row.get("tier") or ""))
        held.append(duration)
    return Trace(
        name=name,
        description=description,
        adapters=adapters,
        priorities=priorities,
        at=at,
        keys=keys,
        tiers=tiers if any(tiers) else None,
        held_s=held if any(held) else None,
        tenant_names={v: k for k, v in tenant_ids.items()},
    )


def read_export(path: Path) -> Trace:
    """A trace from a file written by ``manage.py export_requests`` (JSONL or CSV)."""
    with path.open(newline="") as fh:
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in fh if line.strip()]
        else:
            rows = list(csv.DictReader(fh))
    return from_rows(rows, name=path.stem, description=f"request log exported to {path.name}")
