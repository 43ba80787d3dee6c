"""SLO gates over figures sampled during a campaign: pure functions, no Locust, no I/O.

The sampler (in the Locust process) polls the service's ``/metrics`` and Redis ``INFO`` every
few seconds and stores :class:`Sample` rows; at the end :func:`evaluate` turns them into a
verdict. Keeping the arithmetic here means every gate is unit-tested on hand-made samples.

Gates (from the issue):

* ``expired_keys_growth``: Redis ``expired_keys`` growth per minute, relative to the keys held
  at the start of the window, stays below 5 % (keys expiring faster than that means the L2
  TTLs are too short for the sessions that depend on them);
* ``l3_search_p99``: p99 of the service's own ``ctx_l3_search_seconds`` histogram < 100 ms;
* ``context_load_failures``: the service's ``ctx_context_load_failures_total`` did not move;
* ``error_ratio``: failed / all requests seen by Locust < 0.1 %.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "Sample",
    "SloResult",
    "SloThresholds",
    "Verdict",
    "error_ratio",
    "evaluate",
    "expired_growth_per_min",
    "histogram_quantile",
    "parse_redis_info",
    "parse_service_metrics",
]

L3_HISTOGRAM = "ctx_l3_search_seconds"
LOAD_FAILURES = "ctx_context_load_failures_total"
DEGRADED = "ctx_degraded_bundles_total"
L2_MISSES = "ctx_l2_misses_total"


@dataclass(frozen=True, slots=True)
class SloThresholds:
    expired_growth_per_min: float = 0.05
    l3_p99_s: float = 0.100
    load_failures: float = 0.0
    error_ratio: float = 0.001


@dataclass(frozen=True, slots=True)
class Sample:
    """What the sampler saw at run time ``t`` (seconds since the test started).

    Counters are cumulative (as read); the gates work on differences between samples.
    ``None`` means the source could not be read at that instant (e.g. Redis down).
    """

    t: float
    target_rps: float = 0.0
    achieved_rps: float = 0.0
    users: int = 0
    requests: int = 0
    failures: int = 0
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    expired_keys: int | None = None
    keys: int | None = None
    l3_buckets: tuple[tuple[float, float], ...] | None = None  # (le, cumulative count)
    load_failures: float | None = None
    degraded: float | None = None
    l2_misses: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.l3_buckets is not None:
            d["l3_buckets"] = [[_le_out(le), c] for le, c in self.l3_buckets]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Sample:
        data = dict(d)
        if data.get("l3_buckets") is not None:
            data["l3_buckets"] = tuple((_le_in(le), float(c)) for le, c in data["l3_buckets"])
        return cls(**data)


def _le_out(le: float) -> float | str:
    return "+Inf" if math.isinf(le) else le


def _le_in(le: float | str) -> float:
    return math.inf if le in ("+Inf", "inf", "Inf") else float(le)


@dataclass(frozen=True, slots=True)
class SloResult:
    name: str
    target: str
    achieved: float | None
    passed: bool
    note: str = ""


@dataclass(frozen=True, slots=True)
class Verdict:
    results: tuple[SloResult, ...]
    expected_breaches: frozenset[str] = field(default_factory=frozenset)

    @property
    def passed(self) -> bool:
        """True when every gate passed, except those the fault scenario breaks on purpose."""
        return all(r.passed or r.name in self.expected_breaches for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "expected_breaches": sorted(self.expected_breaches),
            "results": [asdict(r) for r in self.results],
        }


# --- parsing -------------------------------------------------------------------------------


def parse_service_metrics(text: str) -> dict[str, Any]:
    """Pick the gate figures out of a Prometheus text exposition.

    Returns ``{"l3_buckets": ((le, cumulative), ...), "load_failures", "degraded",
    "l2_misses"}``; a metric the service did not export yet reads as 0.
    """
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[float, float] = {}
    out: dict[str, Any] = {"load_failures": 0.0, "degraded": 0.0, "l2_misses": 0.0}
    names = {LOAD_FAILURES: "load_failures", DEGRADED: "degraded", L2_MISSES: "l2_misses"}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"{L3_HISTOGRAM}_bucket":
                le = _le_in(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
            elif s.name in names:
                out[names[s.name]] += s.value
    out["l3_buckets"] = tuple(sorted(buckets.items()))
    return out


def parse_redis_info(info: Mapping[str, Any], db: int = 0) -> tuple[int, int]:
    """``(expired_keys, keys in db)`` from ``INFO`` (``redis-py``'s parsed dict)."""
    expired = int(info.get("expired_keys", 0))
    ks = info.get(f"db{db}")
    keys = int(ks.get("keys", 0)) if isinstance(ks, Mapping) else 0
    return expired, keys


# --- gate arithmetic -----------------------------------------------------------------------


def histogram_quantile(
    q: float,
    end: Sequence[tuple[float, float]],
    start: Sequence[tuple[float, float]] | None = None,
) -> float | None:
    """The ``q`` quantile (0..1) of observations between two cumulative bucket snapshots.

    Linear interpolation inside the bucket, like Prometheus' ``histogram_quantile``; an
    answer in the ``+Inf`` bucket returns the largest finite bound. None when nothing was
    observed in between.
    """
    before = dict(start or ())
    deltas = [(le, c - before.get(le, 0.0)) for le, c in sorted(end)]
    if not deltas:
        return None
    total = deltas[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in deltas:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def expired_growth_per_min(samples: Sequence[Sample], window_s: float = 60.0) -> float | None:
    """Worst per-minute growth of ``expired_keys`` relative to the keys held.

    For each sample, the window runs to the first sample ``window_s`` later (or the last one,
    for runs shorter than a window) and the growth is scaled to one minute. None when Redis
    was never read twice.
    """
    usable = [s for s in samples if s.expired_keys is not None and s.keys is not None]
    worst: float | None = None
    for i, a in enumerate(usable[:-1]):
        b = next((s for s in usable[i + 1 :] if s.t - a.t >= window_s), usable[-1])
        dt = b.t - a.t
        if dt <= 0:
            continue
        assert a.expired_keys is not None and b.expired_keys is not None and a.keys is not None
        delta = max(0, b.expired_keys - a.expired_keys)
        growth = delta * (60.0 / dt) / max(a.keys, 1)
        worst = growth if worst is None else max(worst, growth)
    return worst


def error_ratio(samples: Sequence[Sample]) -> float | None:
    """Failed / all requests over the run (Locust's cumulative counters at the last sample)."""
    if not samples:
        return None
    last = samples[-1]
    if last.requests <= 0:
        return None
    return last.failures / last.requests


def _counter_delta(samples: Iterable[Sample], attr: str) -> float | None:
    values = [getattr(s, attr) for s in samples if getattr(s, attr) is not None]
    if not values:
        return None
    # A counter that went down means the service restarted; sum the non-negative steps.
    total = 0.0
    prev = values[0]
    for v in values[1:]:
        total += v - prev if v >= prev else v
        prev = v
    return total


def _first_last_buckets(
    samples: Sequence[Sample],
) -> tuple[tuple[tuple[float, float], ...] | None, tuple[tuple[float, float], ...] | None]:
    with_b = [s.l3_buckets for s in samples if s.l3_buckets]
    if not with_b:
        return None, None
    return with_b[0], with_b[-1]


def evaluate(
    samples: Sequence[Sample],
    *,
    thresholds: SloThresholds | None = None,
    expected_breaches: Iterable[str] = (),
    baseline: Sample | None = None,
) -> Verdict:
    """Every gate over ``samples`` (ordered by ``t``).

    ``baseline`` is a sample taken before the load started (service counters at that moment),
    so counters that moved during warm-up are not charged to the run. A gate without data
    fails: a campaign that could not measure an SLO has not shown that it holds.
    """
    th = thresholds or SloThresholds()
    series = ([baseline] if baseline is not None else []) + list(samples)
    results: list[SloResult] = []

    growth = expired_growth_per_min(series)
    results.append(
        SloResult(
            "expired_keys_growth",
            f"< {th.expired_growth_per_min:.0%}/min",
            growth,
            growth is not None and growth < th.expired_growth_per_min,
            "" if growth is not None else "Redis INFO never read twice",
        )
    )

    first, last = _first_last_buckets(series)
    p99 = histogram_quantile(0.99, last, first) if last else None
    if p99 is None and last:
        p99_note = "no L3 search during the run"
    else:
        p99_note = "" if p99 is not None else "service /metrics never read"
    results.append(
        SloResult(
            "l3_search_p99",
            f"< {th.l3_p99_s * 1000:.0f} ms",
            None if p99 is None else p99 * 1000.0,
            p99 is not None and p99 < th.l3_p99_s,
            p99_note,
        )
    )

    fails = _counter_delta(series, "load_failures")
    results.append(
        SloResult(
            "context_load_failures",
            f"= {th.load_failures:.0f}",
            fails,
            fails is not None and fails <= th.load_failures,
            "" if fails is not None else "service /metrics never read",
        )
    )

    ratio = error_ratio(samples)
    results.append(
        SloResult(
            "error_ratio",
            f"< {th.error_ratio:.1%}",
            ratio,
            ratio is not None and ratio < th.error_ratio,
            "" if ratio is not None else "no request completed",
        )
    )
    return Verdict(tuple(results), frozenset(expected_breaches))
