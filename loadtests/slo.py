"""SLO gates over figures sampled during a campaign: pure functions, no Locust, no I/O.

The sampler (in the Locust process) polls Locust's own counters, the service's ``/metrics``
and Redis ``INFO`` every few seconds and stores :class:`Sample` rows; at the end
:func:`evaluate` turns them into a verdict. Keeping the arithmetic here means every gate is
unit-tested on hand-made samples.

**The held part** of a run (:func:`held_samples`) is where rate and latency are judged: from
the first sample at or after the warm-up, ``max(3 s, 10 % of the run)`` (users spawning, the
first sessions opening), to the last sample taken while the shape still ran (target > 0 and
``t <= run_s``); the sample taken after the shape stopped (users stopping, in-flight requests
draining) is left out, and so is a sample whose Locust counters were not in step
(``stats_synced`` False: in a distributed run, a worker did not flush its stats for it).
Window figures are differences of cumulative counters between the first (``a``) and the last
(``b``) held sample, never Locust's trailing ``current_rps``.

Gates (thresholds in :class:`SloThresholds`):

* ``achieved_rate``: ``(requests_b - requests_a) / (target_total_b - target_total_a) >=
  95 %``; ``target_total`` is the target rate integrated from the start of the run, so the
  denominator is what the profile asked for over exactly the same window;
* ``request_p99``: p99 of every request completed in the held part (Locust's response-time
  histogram at ``b`` minus the one at ``a``) < 100 ms;
* ``context_p99``: the same for ``POST /v1/context`` < 50 ms (the reference design: "load
  the <= 3 most relevant fragments within 50 ms");
* ``premature_expirations``: no key expired while its session still needed it (a step
  output before the step that depends on it started, any other session key before the
  session's last request) and no read of a step output the session wrote came back missing:
  the evidence of :mod:`loadtests.ledger` (Redis keyspace notifications joined with each
  session's own record), ``= 0`` by default;
* ``l3_search_p99``: p99 of the service's own ``ctx_l3_search_seconds`` histogram over the
  whole run < 100 ms;
* ``context_load_failures``: the service's ``ctx_context_load_failures_total`` did not move;
* ``error_ratio``: failed / all requests seen by Locust < 0.1 %;
* ``memory_growth``: the service's RSS and allocated Python blocks grow at most 15 % over
  the held part (:func:`memory_growth`).

A gate without data fails: a campaign that could not measure an SLO has not shown that it
holds.

**Reported, not gated** (:attr:`Verdict.figures`): ``expired_keys_growth``, Redis
``expired_keys`` growth per *profile* minute relative to the keys held over the held part
(:func:`expired_growth_per_min`). It used to be a gate (< 5 %); it moves with the load curve
rather than with the platform (after a burst's peak the keys held fall while the peak's
step outputs come due, ~20 % at any rate), so the campaign reports it next to the step-output
expirations the plan's TTLs predict (:func:`loadtests.ledger.predicted_step_expirations`).

**Distributed runs** (a Locust master and workers): the sampler runs on the master, whose
stats are the workers' reports summed. Workers report every 3 s on their own clocks, so
before each sample the master asks every worker to flush its stats and waits for all of them
(``loadtests/locustfile.py``); a sample then counts every request completed up to the same
instant on every worker, and a sample where some worker did not answer in time is marked
``stats_synced=False`` and never ends a rate or latency window. The service's ``/metrics`` and
Redis ``INFO`` are read by the master directly, as in a single-process run.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loadtests.ledger import ExpiryReport

__all__ = [
    "FIGURES",
    "GATES",
    "Sample",
    "SloResult",
    "SloThresholds",
    "Verdict",
    "achieved_share",
    "error_ratio",
    "evaluate",
    "expired_growth_per_min",
    "held_samples",
    "histogram_quantile",
    "l3_p99_windows",
    "memory_growth",
    "parse_redis_info",
    "parse_service_metrics",
    "premature_gate",
    "response_time_quantile",
]

L3_HISTOGRAM = "ctx_l3_search_seconds"
LOAD_FAILURES = "ctx_context_load_failures_total"
DEGRADED = "ctx_degraded_bundles_total"
SHED = "ctx_shed_requests_total"
L2_MISSES = "ctx_l2_misses_total"
RSS = "ctx_process_rss_bytes"
PY_BLOCKS = "ctx_python_allocated_blocks"

#: Figures :func:`evaluate` reports without gating on them (:attr:`Verdict.figures`).
FIGURES = ("expired_keys_growth",)

#: Every gate :func:`evaluate` reports, in its order.
GATES = (
    "achieved_rate",
    "request_p99",
    "context_p99",
    "premature_expirations",
    "l3_search_p99",
    "context_load_failures",
    "error_ratio",
    "memory_growth",
)

Hist = tuple[tuple[int, int], ...]
"""Locust's response-time histogram: ``(rounded ms, requests)`` pairs, counts cumulative
since the start of the run, sorted by ms."""


@dataclass(frozen=True, slots=True)
class SloThresholds:
    min_achieved_share: float = 0.95
    request_p99_ms: float = 100.0
    context_p99_ms: float = 50.0
    expired_growth_per_min: float = 0.05  # the reported figure's reference, not a gate
    premature_expirations: int = 0
    l3_p99_s: float = 0.100
    load_failures: float = 0.0
    error_ratio: float = 0.001
    memory_growth: float = 0.15
    warmup_min_s: float = 3.0
    warmup_share: float = 0.10
    expired_window_s: float = 30.0  # run seconds per expired-keys window


@dataclass(frozen=True, slots=True)
class Sample:
    """What the sampler saw at run time ``t`` (seconds since the test started).

    Counters are cumulative (as read); the gates work on differences between samples.
    ``None`` means the source could not be read at that instant (e.g. Redis down).
    ``target_total`` is the target rate integrated from 0 to ``t`` (requests asked for),
    ``rt_all`` / ``rt_context`` Locust's response-time histograms of every request and of
    ``POST /v1/context``, ``endpoints`` the requests per ``"METHOD name"``.
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
    target_total: float = 0.0
    rt_all: Hist | None = None
    rt_context: Hist | None = None
    endpoints: tuple[tuple[str, int], ...] | None = None
    rss_bytes: float | None = None
    py_blocks: float | None = None
    shed: float | None = None  # requests the service answered 503 + Retry-After (cumulative)
    workers: int | None = None  # Locust workers whose stats this sample holds; None: one process
    stats_synced: bool = True  # False: some worker's stats lag behind ``t`` (see held_samples)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.l3_buckets is not None:
            d["l3_buckets"] = [[_le_out(le), c] for le, c in self.l3_buckets]
        for name in ("rt_all", "rt_context", "endpoints"):
            pairs = getattr(self, name)
            if pairs is not None:
                d[name] = [list(p) for p in pairs]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Sample:
        data = dict(d)
        if data.get("l3_buckets") is not None:
            data["l3_buckets"] = tuple((_le_in(le), float(c)) for le, c in data["l3_buckets"])
        for name in ("rt_all", "rt_context"):
            if data.get(name) is not None:
                data[name] = tuple((int(ms), int(n)) for ms, n in data[name])
        if data.get("endpoints") is not None:
            data["endpoints"] = tuple((str(k), int(n)) for k, n in data["endpoints"])
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
    #: figures reported next to the gates, never failing the verdict (:data:`FIGURES`);
    #: ``passed`` says whether the figure is within its reference value
    figures: tuple[SloResult, ...] = ()

    @property
    def passed(self) -> bool:
        """True when every gate passed, except those the fault scenario breaks on purpose."""
        return not self.failed

    @property
    def failed(self) -> list[str]:
        """Names of the gates that failed and were not expected to (in gate order)."""
        return [
            r.name for r in self.results if not r.passed and r.name not in self.expected_breaches
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "failed": self.failed,
            "expected_breaches": sorted(self.expected_breaches),
            "results": [asdict(r) for r in self.results],
            "figures": [asdict(r) for r in self.figures],
        }


# --- parsing -------------------------------------------------------------------------------


def parse_service_metrics(text: str) -> dict[str, Any]:
    """Pick the gate figures out of a Prometheus text exposition.

    Returns ``{"l3_buckets": ((le, cumulative), ...), "load_failures", "degraded", "shed",
    "l2_misses", "rss_bytes", "py_blocks"}``; a counter the service did not export yet reads
    as 0, a memory gauge it does not export as None (no data: the memory gate fails).
    """
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[float, float] = {}
    out: dict[str, Any] = {
        "load_failures": 0.0,
        "degraded": 0.0,
        "shed": 0.0,
        "l2_misses": 0.0,
        "rss_bytes": None,
        "py_blocks": None,
    }
    names = {
        LOAD_FAILURES: "load_failures",
        DEGRADED: "degraded",
        L2_MISSES: "l2_misses",
        SHED: "shed",
    }
    gauges = {RSS: "rss_bytes", PY_BLOCKS: "py_blocks"}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"{L3_HISTOGRAM}_bucket":
                le = _le_in(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
            elif s.name in names:
                out[names[s.name]] += s.value
            elif s.name in gauges:
                out[gauges[s.name]] = float(s.value)
    out["l3_buckets"] = tuple(sorted(buckets.items()))
    return out


def parse_redis_info(info: Mapping[str, Any], db: int = 0) -> tuple[int, int]:
    """``(expired_keys, keys in db)`` from ``INFO`` (``redis-py``'s parsed dict)."""
    expired = int(info.get("expired_keys", 0))
    ks = info.get(f"db{db}")
    keys = int(ks.get("keys", 0)) if isinstance(ks, Mapping) else 0
    return expired, keys


# --- gate arithmetic -----------------------------------------------------------------------


def held_samples(
    samples: Sequence[Sample], run_s: float | None = None, th: SloThresholds | None = None
) -> list[Sample]:
    """The samples of the held part (see the module docstring), in order.

    ``run_s`` is the shape's length; None takes the time of the last sample with a target.
    The warm-up is ``max(th.warmup_min_s, th.warmup_share x run_s)``: 3 s for runs up to
    30 s, then 10 %. Samples with ``stats_synced`` False are skipped. Empty when fewer than
    two samples fall in (no window to judge).
    """
    th = th or SloThresholds()
    if run_s is None:
        running = [s.t for s in samples if s.target_rps > 0]
        if not running:
            return []
        run_s = max(running)
    warmup = max(th.warmup_min_s, th.warmup_share * run_s)
    held = [s for s in samples if warmup <= s.t <= run_s and s.target_rps > 0 and s.stats_synced]
    return held if len(held) >= 2 else []


def achieved_share(a: Sample, b: Sample) -> tuple[float, float, float] | None:
    """``(share, achieved req/s, target req/s)`` between samples ``a`` and ``b``:
    ``share = (b.requests - a.requests) / (b.target_total - a.target_total)``, the rates are
    the same two differences over ``b.t - a.t``. None when the window asks for nothing."""
    asked = b.target_total - a.target_total
    dt = b.t - a.t
    if asked <= 0 or dt <= 0:
        return None
    done = b.requests - a.requests
    return done / asked, done / dt, asked / dt


def response_time_quantile(q: float, end: Hist, start: Hist | None = None) -> float | None:
    """The ``q`` quantile (0..1), nearest rank, of the requests between two histograms.

    Counts are ``end - start`` per rounded ms; with ``N`` requests in between, the answer is
    the smallest ms value ``v`` with ``count(<= v) >= ceil(q x N)`` (like Locust's own
    percentiles, on its rounded values). None when no request completed in between.
    """
    before = dict(start or ())
    deltas = [(ms, n - before.get(ms, 0)) for ms, n in sorted(end)]
    total = sum(max(0, n) for _, n in deltas)
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total - 1e-9))
    seen = 0
    for ms, n in deltas:
        seen += max(0, n)
        if seen >= rank:
            return float(ms)
    return float(deltas[-1][0])  # pragma: no cover - seen reaches total


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


def l3_p99_windows(samples: Sequence[Sample]) -> list[tuple[float, float | None, float]]:
    """Per sampling window: ``(t at the window's end, L3 search p99 in ms or None, searches)``
    from the ``ctx_l3_search_seconds`` buckets of consecutive samples (the drift table)."""
    rows: list[tuple[float, float | None, float]] = []
    with_b = [s for s in samples if s.l3_buckets]
    for a, b in itertools.pairwise(with_b):
        assert a.l3_buckets is not None and b.l3_buckets is not None
        p99 = histogram_quantile(0.99, b.l3_buckets, a.l3_buckets)
        n = b.l3_buckets[-1][1] - dict(a.l3_buckets).get(b.l3_buckets[-1][0], 0.0)
        rows.append((b.t, None if p99 is None else p99 * 1000.0, n))
    return rows


def expired_growth_per_min(
    samples: Sequence[Sample], ttl_factor: float = 1.0, window_s: float = 30.0
) -> float | None:
    """Worst growth of Redis ``expired_keys`` per *profile* minute, relative to the keys held.

    A window runs from a sample ``a`` to the first sample ``b`` at least ``window_s`` run
    seconds later (or, when the samples span less than that, from the first to the last
    sample: one window). With ``K`` the mean of the ``keys`` read in the window's samples
    and ``f = ttl_factor`` (profile seconds per run second as the sessions experience it,
    the factor the campaign divided the TTLs by)::

        growth = (expired_b - expired_a) / max(K, 1) x 60 / ((t_b - t_a) x f)

    i.e. expirations per run second, times the run seconds one profile minute lasts
    (``60 / f``), over the keys held. Example: 120 keys expired in a 30 s window, 2,000
    keys held, ``f = 100``: ``120 / 2000 x 60 / 3000 = 0.12 %`` per profile minute. The
    same keys expiring with TTLs 10 times too short expire 10 times as often: 1.2 %.
    None when Redis was never read twice.
    """
    if ttl_factor <= 0:
        raise ValueError(f"ttl_factor must be > 0, got {ttl_factor}")
    usable = [s for s in samples if s.expired_keys is not None and s.keys is not None]
    if len(usable) < 2:
        return None
    pairs: list[tuple[int, int]] = []
    if usable[-1].t - usable[0].t < window_s:
        pairs.append((0, len(usable) - 1))
    else:
        for i, a in enumerate(usable):
            j = next((k for k in range(i + 1, len(usable)) if usable[k].t - a.t >= window_s), None)
            if j is None:
                break
            pairs.append((i, j))
    worst: float | None = None
    for i, j in pairs:
        a, b = usable[i], usable[j]
        dt = b.t - a.t
        if dt <= 0:
            continue
        assert a.expired_keys is not None and b.expired_keys is not None
        held = statistics.fmean(float(s.keys or 0) for s in usable[i : j + 1])
        delta = max(0, b.expired_keys - a.expired_keys)
        growth = delta / max(held, 1.0) * 60.0 / (dt * ttl_factor)
        worst = growth if worst is None else max(worst, growth)
    return worst


def memory_growth(samples: Sequence[Sample]) -> tuple[float, float, float] | None:
    """``(worst, rss growth, python-blocks growth)`` over ``samples`` (the held part).

    Each series (samples where both gauges were read) is split in thirds of ``k = n // 3``
    samples; growth is ``median(last k) / median(first k) - 1``. The held part already skips
    the warm-up, and medians ignore a single garbage-collection spike. None with fewer than
    three readings.
    """
    rows = [(s.rss_bytes, s.py_blocks) for s in samples]
    usable = [(r, b) for r, b in rows if r is not None and b is not None and r > 0 and b > 0]
    if len(usable) < 3:
        return None
    k = len(usable) // 3

    def grow(values: list[float]) -> float:
        return statistics.median(values[-k:]) / statistics.median(values[:k]) - 1.0

    rss = grow([float(r) for r, _ in usable])
    blocks = grow([float(b) for _, b in usable])
    return max(rss, blocks), rss, blocks


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


NO_WINDOW = "fewer than two samples in the held part"


def _p99_gate(
    name: str,
    held: Sequence[Sample],
    attr: str,
    limit_ms: float,
    what: str,
    no_window: str = NO_WINDOW,
) -> SloResult:
    target = f"< {limit_ms:.0f} ms"
    if not held:
        return SloResult(name, target, None, False, no_window)
    a, b = getattr(held[0], attr), getattr(held[-1], attr)
    if b is None:
        return SloResult(name, target, None, False, f"no {what} histogram sampled")
    p99 = response_time_quantile(0.99, b, a)
    if p99 is None:
        return SloResult(name, target, None, False, f"no {what} completed in the held part")
    return SloResult(
        name, target, p99, p99 < limit_ms, f"held part {held[0].t:.0f}-{held[-1].t:.0f} s"
    )


def evaluate(
    samples: Sequence[Sample],
    *,
    thresholds: SloThresholds | None = None,
    expected_breaches: Iterable[str] = (),
    baseline: Sample | None = None,
    run_s: float | None = None,
    ttl_factor: float = 1.0,
    expiry: ExpiryReport | None = None,
) -> Verdict:
    """Every gate of :data:`GATES` over ``samples`` (ordered by ``t``).

    ``baseline`` is a sample taken before the load started (service counters at that moment),
    so counters that moved during warm-up are not charged to the run. ``run_s`` is the
    shape's length (for the held part), ``ttl_factor`` the compression the campaign applied
    to the service's TTLs (1: not scaled; growth per run minute), ``expiry`` the run's
    classified expirations (:func:`loadtests.ledger.classify`). A gate without data fails.
    """
    th = thresholds or SloThresholds()
    series = ([baseline] if baseline is not None else []) + list(samples)
    held = held_samples(samples, run_s, th)
    unsynced = sum(1 for s in samples if not s.stats_synced)
    no_window = NO_WINDOW + (
        f" ({unsynced} samples left out: Locust workers' stats not flushed)" if unsynced else ""
    )
    results: list[SloResult] = []

    share_target = f">= {th.min_achieved_share:.0%} of target"
    got = achieved_share(held[0], held[-1]) if held else None
    if got is None:
        results.append(
            SloResult(
                "achieved_rate",
                share_target,
                None,
                False,
                no_window if not held else "no target in the held part",
            )
        )
    else:
        share, done_rps, asked_rps = got
        results.append(
            SloResult(
                "achieved_rate",
                share_target,
                share,
                share >= th.min_achieved_share,
                f"{done_rps:,.1f} of {asked_rps:,.1f} req/s over "
                f"{held[0].t:.0f}-{held[-1].t:.0f} s",
            )
        )
    results.append(
        _p99_gate("request_p99", held, "rt_all", th.request_p99_ms, "request", no_window)
    )
    results.append(
        _p99_gate(
            "context_p99", held, "rt_context", th.context_p99_ms, "POST /v1/context", no_window
        )
    )

    growth = expired_growth_per_min(held, ttl_factor, th.expired_window_s)
    if growth is not None:
        expired_note = f"held part, TTLs scaled 1/{ttl_factor:.4g}; reported, not gated"
    else:
        expired_note = no_window if not held else "Redis INFO never read twice"
    figures = (
        SloResult(
            "expired_keys_growth",
            f"< {th.expired_growth_per_min:.0%}/profile min (reference)",
            growth,
            growth is not None and growth < th.expired_growth_per_min,
            expired_note,
        ),
    )
    results.append(premature_gate(expiry, th))

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

    mem = memory_growth(held)
    mem_target = f"<= {th.memory_growth:.0%} over the held part"
    if mem is None:
        results.append(
            SloResult("memory_growth", mem_target, None, False, "service memory never read")
        )
    else:
        worst, rss, blocks = mem
        results.append(
            SloResult(
                "memory_growth",
                mem_target,
                worst,
                worst <= th.memory_growth,
                f"RSS {rss:+.1%}, Python blocks {blocks:+.1%}",
            )
        )
    return Verdict(tuple(results), frozenset(expected_breaches), figures)


def premature_gate(expiry: ExpiryReport | None, th: SloThresholds | None = None) -> SloResult:
    """The ``premature_expirations`` gate over a run's classified expirations."""
    th = th or SloThresholds()
    target = f"<= {th.premature_expirations}"
    if expiry is None:
        return SloResult("premature_expirations", target, None, False, "no session ledger")
    if expiry.sessions == 0:
        return SloResult(
            "premature_expirations", target, None, False, "no session was opened in the run"
        )
    n = expiry.violations
    note = (
        f"{expiry.premature} of {expiry.expired} expired keys premature ({expiry.expected} "
        f"expected, {expiry.untracked} untracked); {expiry.lost_reads} lost reads; "
        f"{expiry.sessions} sessions"
    )
    if not expiry.watched:
        return SloResult(
            "premature_expirations",
            target,
            float(n),
            False,
            note + "; Redis expirations not watched (keyspace notifications unavailable)",
        )
    if expiry.examples and n:
        note += "; e.g. " + expiry.examples[0]
    return SloResult("premature_expirations", target, float(n), n <= th.premature_expirations, note)
