"""SLO gates on hand-made samples (exact figures) and on real exposition/INFO sources."""

from __future__ import annotations

import json
import math

import pytest
import redis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from loadtests.ledger import ExpiryReport
from loadtests.slo import (
    GATES,
    Sample,
    SloThresholds,
    achieved_share,
    evaluate,
    expired_growth_per_min,
    held_samples,
    histogram_quantile,
    l3_p99_windows,
    memory_growth,
    parse_redis_info,
    parse_service_metrics,
    response_time_quantile,
)

INF = math.inf
MB = 2**20


def test_histogram_quantile_interpolates_between_snapshots() -> None:
    start = ((0.01, 10.0), (0.05, 10.0), (0.1, 10.0), (INF, 10.0))
    end = ((0.01, 60.0), (0.05, 150.0), (0.1, 160.0), (INF, 160.0))
    # 150 new observations: 50 <= 10 ms, 90 in (10, 50] ms, 10 in (50, 100] ms.
    assert histogram_quantile(0.5, end, start) == pytest.approx(0.01 + 0.04 * 25 / 90)
    assert histogram_quantile(0.99, end, start) == pytest.approx(0.05 + 0.05 * 8.5 / 10)
    assert histogram_quantile(0.99, start, start) is None


def test_histogram_quantile_in_the_inf_bucket_returns_the_last_bound() -> None:
    end = ((0.1, 1.0), (INF, 100.0))
    assert histogram_quantile(0.99, end) == 0.1


# --- the held part and the rate ----------------------------------------------------------------


def test_held_part_skips_the_warm_up_and_the_sample_after_the_stop() -> None:
    run = [Sample(t=t, target_rps=10.0) for t in (2.0, 9.9, 10.0, 50.0, 100.0)]
    run.append(Sample(t=101.0, target_rps=0.0))  # users stopping after the shape ended
    # warm-up max(3 s, 10 % of 100 s) = 10 s; the end is the last sample at t <= 100 s
    assert [s.t for s in held_samples(run, 100.0)] == [10.0, 50.0, 100.0]
    # without run_s, the run ends at the last sample that still had a target
    assert [s.t for s in held_samples(run)] == [10.0, 50.0, 100.0]
    # short runs: the warm-up is 3 s, not 10 %
    short = [Sample(t=t, target_rps=5.0) for t in (2.0, 3.0, 20.0)]
    assert [s.t for s in held_samples(short, 20.0)] == [3.0, 20.0]
    assert held_samples(short[:2], 20.0) == []  # one sample: no window


def test_achieved_share_uses_counters_at_the_window_ends() -> None:
    a = Sample(t=4.0, target_rps=1000.0, requests=1_900, target_total=4_000.0)
    b = Sample(t=38.0, target_rps=1000.0, requests=19_682, target_total=38_000.0)
    # 17,782 requests in 34 s = 523 req/s against 34,000 asked = 1,000 req/s
    share, done, asked = achieved_share(a, b) or (0.0, 0.0, 0.0)
    assert share == pytest.approx(17_782 / 34_000)
    assert done == pytest.approx(523.0)
    assert asked == pytest.approx(1000.0)
    assert achieved_share(a, a) is None


# --- response-time percentiles from Locust's histograms ----------------------------------------


def test_response_time_quantile_is_nearest_rank_over_the_difference() -> None:
    start = ((8, 100), (40, 3))
    end = ((8, 2_100), (40, 280), (90, 23))
    # in between: 2000 x 8 ms, 277 x 40 ms, 23 x 90 ms = 2300; rank ceil(0.99 x 2300) = 2277
    assert response_time_quantile(0.99, end, start) == 40.0
    # one more slow request pushes the rank past the 40 ms ones
    end2 = ((8, 2_100), (40, 279), (90, 24))
    assert response_time_quantile(0.99, end2, start) == 90.0
    assert response_time_quantile(0.5, end, start) == 8.0
    assert response_time_quantile(0.99, start, start) is None
    assert response_time_quantile(1.0, ((5, 1), (310, 1))) == 310.0


# --- expired keys per profile minute -----------------------------------------------------------


def test_expired_growth_uses_windows_and_the_mean_keys_held() -> None:
    samples = [
        Sample(t=0.0, expired_keys=0, keys=1000),
        Sample(t=30.0, expired_keys=10, keys=1000),
        Sample(t=60.0, expired_keys=30, keys=1000),
        Sample(t=120.0, expired_keys=90, keys=600),
    ]
    # 60 s windows: 0->60: 30 / 1000 = 3 %; 30->120: 80 / 866.7 x 60/90 = 6.15 %;
    # 60->120: 60 / 800 = 7.5 %
    assert expired_growth_per_min(samples, window_s=60.0) == pytest.approx(0.075)
    assert expired_growth_per_min(samples[:1]) is None


def test_short_runs_use_one_window_over_all_samples() -> None:
    samples = [Sample(t=0.0, expired_keys=5, keys=200), Sample(t=20.0, expired_keys=6, keys=200)]
    assert expired_growth_per_min(samples) == pytest.approx(3 / 200)


def _steady(expired_per_30s: int, keys: int) -> list[Sample]:
    return [
        Sample(t=t, expired_keys=int(expired_per_30s * t / 30.0), keys=keys)
        for t in (0.0, 10.0, 20.0, 30.0)
    ]


def test_expired_growth_per_profile_minute_passes_design_ttls_and_fails_short_ones() -> None:
    # Sessions run 100x compressed and the TTLs were divided by 100. Abandoned sessions'
    # keys expiring at the (scaled) design TTLs: 120 in 30 s, 2,000 keys held.
    # 120 / 2000 x 60 / (30 x 100) = 0.12 % per profile minute: passes.
    design = _steady(120, 2000)
    assert expired_growth_per_min(design, ttl_factor=100.0) == pytest.approx(0.0012)
    # TTLs 50 times too short: keys live 50 times shorter, so 50 times as many expire for
    # the same sessions, and fewer are held: 6000 in 30 s, 1,000 held = 12 %: fails.
    short = _steady(6000, 1000)
    assert expired_growth_per_min(short, ttl_factor=100.0) == pytest.approx(0.12)
    assert SloThresholds().expired_growth_per_min == 0.05
    for samples, ok in ((design, True), (short, False)):
        v = evaluate(_with_load(samples), ttl_factor=100.0, run_s=30.0)
        # reported next to the gates (within its reference or not), never failing the run
        fig = {r.name: r for r in v.figures}["expired_keys_growth"]
        assert fig.passed is ok, fig
        assert "expired_keys_growth" not in v.failed
    # The design figures counted per *run* minute (factor 1) would have tripped the gate.
    assert expired_growth_per_min(design, ttl_factor=1.0) == pytest.approx(0.12)
    with pytest.raises(ValueError, match="ttl_factor"):
        expired_growth_per_min(design, ttl_factor=0.0)


def _with_load(samples: list[Sample]) -> list[Sample]:
    """Give Redis-only samples a target so they fall in the held part."""
    return [
        Sample(t=s.t, target_rps=1.0, expired_keys=s.expired_keys, keys=s.keys) for s in samples
    ]


# --- memory ----------------------------------------------------------------------------------


def _mem(rss_mb: list[float], blocks: list[float]) -> list[Sample]:
    return [
        Sample(t=4.0 + 2 * i, target_rps=1.0, rss_bytes=r * MB, py_blocks=b)
        for i, (r, b) in enumerate(zip(rss_mb, blocks, strict=True))
    ]


def test_memory_growth_compares_medians_of_first_and_last_thirds() -> None:
    flat = _mem([500, 502, 950, 501, 499, 503], [1e6, 1.01e6, 1.0e6, 0.99e6, 1.0e6, 1.02e6])
    # thirds of 2: RSS median(500, 502) = 501 -> median(499, 503) = 501; the 950 MB spike
    # sits in the middle third. Blocks 1.005e6 -> 1.01e6 = +0.5 %.
    worst, rss, blocks = memory_growth(flat) or (0.0, 0.0, 0.0)
    assert rss == pytest.approx(0.0)
    assert blocks == pytest.approx(1.01e6 / 1.005e6 - 1)
    assert worst == pytest.approx(blocks)
    rising = _mem([500, 520, 540, 560, 580, 600], [1e6, 1.05e6, 1.1e6, 1.15e6, 1.2e6, 1.25e6])
    # RSS 510 -> 590 = +15.7 %; blocks 1.025e6 -> 1.225e6 = +19.5 %
    worst, rss, blocks = memory_growth(rising) or (0.0, 0.0, 0.0)
    assert rss == pytest.approx(590 / 510 - 1)
    assert blocks == pytest.approx(1.225 / 1.025 - 1)
    assert worst == pytest.approx(blocks)
    assert memory_growth(rising[:2]) is None


def test_memory_gate_passes_flat_fails_rising_and_skips_the_warm_up() -> None:
    def gate(samples: list[Sample]) -> bool:
        v = evaluate(samples, run_s=14.0)
        return {r.name: r for r in v.results}["memory_growth"].passed

    flat = _mem([500, 502, 950, 501, 499, 503], [1e6] * 6)
    rising = _mem([500, 520, 540, 560, 580, 600], [1e6] * 6)
    assert gate(flat)
    assert not gate(rising)
    # a warm-up sample at t = 2 s (imports, first caches) is not charged to the run
    warm = [Sample(t=2.0, target_rps=1.0, rss_bytes=200 * MB, py_blocks=0.5e6), *flat]
    assert gate(warm)


# --- L3 drift --------------------------------------------------------------------------------


def test_l3_p99_windows_difference_consecutive_samples() -> None:
    b0 = ((0.01, 0.0), (0.1, 0.0), (INF, 0.0))
    b1 = ((0.01, 100.0), (0.1, 100.0), (INF, 100.0))
    b2 = ((0.01, 100.0), (0.1, 200.0), (INF, 200.0))
    samples = [Sample(t=0.0, l3_buckets=b0), Sample(t=2.0, l3_buckets=b1), Sample(t=4.0)]
    rows = l3_p99_windows([*samples, Sample(t=6.0, l3_buckets=b2)])
    # window 0-2 s: 100 searches <= 10 ms; window 2-6 s: 100 in (10, 100] ms
    assert rows[0] == (2.0, pytest.approx(0.01 * 0.99 * 1000), 100.0)
    assert rows[1] == (6.0, pytest.approx((0.01 + 0.09 * 99 / 100) * 1000), 100.0)
    assert len(rows) == 2


# --- evaluate ----------------------------------------------------------------------------------


def _good_run() -> list[Sample]:
    """A 30 s run at 100 req/s; held part 5-29 s (warm-up 3 s, t = 31 s after the stop)."""
    b0 = ((0.01, 0.0), (0.05, 0.0), (0.1, 0.0), (INF, 0.0))
    b1 = ((0.01, 500.0), (0.05, 990.0), (0.1, 1000.0), (INF, 1000.0))
    return [
        Sample(
            t=0.0,
            target_rps=100.0,
            expired_keys=0,
            keys=10,
            l3_buckets=b0,
            load_failures=2.0,
            requests=0,
        ),
        Sample(
            t=5.0,
            target_rps=100.0,
            target_total=500.0,
            requests=480,
            expired_keys=0,
            keys=2000,
            rt_all=((8, 100), (40, 3)),
            rt_context=((10, 30),),
            rss_bytes=100 * MB,
            py_blocks=1.0e6,
        ),
        Sample(
            t=17.0,
            target_rps=100.0,
            target_total=1700.0,
            requests=1630,
            expired_keys=100,
            keys=2000,
            rss_bytes=104 * MB,
            py_blocks=1.02e6,
        ),
        Sample(
            t=29.0,
            target_rps=100.0,
            target_total=2900.0,
            requests=2780,
            failures=2,
            expired_keys=240,
            keys=2000,
            l3_buckets=b1,
            load_failures=2.0,
            rt_all=((8, 2_100), (40, 280), (90, 23)),
            rt_context=((10, 730), (45, 66), (60, 1)),
            rss_bytes=110 * MB,
            py_blocks=1.05e6,
        ),
        Sample(t=31.0, target_rps=0.0, target_total=2900.0, requests=2850, failures=2),
    ]


def _expiry(premature: int) -> ExpiryReport:
    """What the ledger and the expiry watch saw: 40 sessions, ``premature`` of 240 expired
    keys needed by their session still."""
    return ExpiryReport(
        expired=240, premature=premature, expected=240 - premature, untracked=0, lost_reads=0,
        sessions=40, closed=32, abandoned=8, steps=400, step_keys_expired=240,
    )  # fmt: skip


def test_evaluate_passes_a_clean_run() -> None:
    v = evaluate(_good_run(), run_s=30.0, ttl_factor=50.0, expiry=_expiry(0))
    by = {r.name: r for r in v.results}
    assert [r.name for r in v.results] == list(GATES)
    assert v.passed and v.failed == []
    # (2780 - 480) / (2900 - 500) = 2300 / 2400 asked
    assert by["achieved_rate"].achieved == pytest.approx(2300 / 2400)
    assert "95.8 of 100.0 req/s over 5-29 s" in by["achieved_rate"].note
    assert by["request_p99"].achieved == 40.0  # rank 2277 of 2300 lands on 40 ms
    # context: 700 x 10 ms, 66 x 45 ms, 1 x 60 ms; rank ceil(0.99 x 767) = 760 -> 45 ms
    assert by["context_p99"].achieved == 45.0
    # 240 expired over 24 s, 2,000 keys held, f = 50: 240/2000 x 60/(24 x 50) = 0.6 %
    assert {r.name: r for r in v.figures}["expired_keys_growth"].achieved == pytest.approx(0.006)
    assert by["premature_expirations"].achieved == 0.0
    assert by["l3_search_p99"].achieved == pytest.approx(50.0)
    assert by["context_load_failures"].achieved == 0.0  # 2 before the run are not charged
    assert by["error_ratio"].achieved == pytest.approx(2 / 2850)
    assert by["memory_growth"].achieved == pytest.approx(0.10)  # RSS 100 -> 110 MB
    assert json.loads(json.dumps(v.to_dict()))["failed"] == []


def test_evaluate_fails_each_breached_gate() -> None:
    run = _good_run()
    t5, t29 = run[1], run[3]
    bad_end = Sample(
        t=29.0,
        target_rps=100.0,
        target_total=2900.0,
        requests=1700,  # 1220 of 2400 asked: 51 %
        failures=40,
        expired_keys=6000,
        keys=1000,
        l3_buckets=((0.1, 0.0), (INF, 1000.0)),
        load_failures=3.0,
        rt_all=((8, 1000), (40, 100), (310, 123)),
        rt_context=((10, 300), (45, 20), (60, 30)),
        rss_bytes=130 * MB,
        py_blocks=1.0e6,
    )
    after = Sample(t=31.0, target_rps=0.0, target_total=2900.0, requests=1750, failures=40)
    bad = [run[0], t5, run[2], bad_end, after]
    v = evaluate(bad, run_s=30.0, ttl_factor=50.0, expiry=_expiry(3))
    assert set(v.failed) == set(GATES)
    assert v.failed == list(GATES)  # in gate order
    assert not v.passed
    by = {r.name: r for r in v.results}
    assert by["achieved_rate"].achieved == pytest.approx(1220 / 2400)
    assert by["request_p99"].achieved == 310.0
    assert by["context_p99"].achieved == 60.0
    # A fault scenario that breaks gates on purpose passes when only those are breached.
    assert evaluate(
        bad, run_s=30.0, ttl_factor=50.0, expected_breaches=GATES, expiry=_expiry(3)
    ).passed
    assert t29.requests == 2780  # the good run itself is untouched


def test_a_gate_without_data_fails() -> None:
    v = evaluate([Sample(t=0.0)])
    assert not v.passed
    assert all(not r.passed for r in v.results)
    assert v.failed == list(GATES)
    notes = {r.name: r.note for r in v.results}
    assert notes["achieved_rate"] == "fewer than two samples in the held part"
    assert notes["request_p99"] == "fewer than two samples in the held part"
    assert notes["error_ratio"] == "no request completed"
    assert notes["memory_growth"] == "service memory never read"


def test_latency_gates_without_histograms_fail() -> None:
    run = [
        Sample(t=t, target_rps=10.0, target_total=10.0 * t, requests=int(10 * t))
        for t in (4.0, 6.0)
    ]
    by = {r.name: r for r in evaluate(run, run_s=6.0).results}
    assert by["achieved_rate"].passed
    assert not by["request_p99"].passed and by["request_p99"].note == (
        "no request histogram sampled"
    )
    assert not by["context_p99"].passed


def test_sample_round_trips_through_json_dicts() -> None:
    s = _good_run()[3]
    s2 = Sample(
        t=1.0,
        endpoints=(("POST /v1/context", 12), ("POST /v1/sessions", 3)),
        rt_all=((5, 1),),
    )
    for sample in (s, s2, Sample(t=0.0)):
        assert Sample.from_dict(json.loads(json.dumps(sample.to_dict()))) == sample


def test_parse_service_metrics_from_a_real_exposition() -> None:
    reg = CollectorRegistry()
    h = Histogram("ctx_l3_search_seconds", "l3", buckets=(0.01, 0.1), registry=reg)
    c = Counter("ctx_context_load_failures", "f", ["reason"], registry=reg)
    h.observe(0.005)
    h.observe(0.05)
    h.observe(0.5)
    c.labels(reason="redis").inc(2)
    c.labels(reason="miss").inc()
    got = parse_service_metrics(generate_latest(reg).decode())
    assert got["l3_buckets"] == ((0.01, 1.0), (0.1, 2.0), (INF, 3.0))
    assert got["load_failures"] == 3.0
    assert got["degraded"] == 0.0
    assert got["rss_bytes"] is None and got["py_blocks"] is None  # not exported: no data
    Gauge("ctx_process_rss_bytes", "rss", registry=reg).set(123456789)
    Gauge("ctx_python_allocated_blocks", "b", registry=reg).set(4242)
    got = parse_service_metrics(generate_latest(reg).decode())
    assert got["rss_bytes"] == 123456789.0 and got["py_blocks"] == 4242.0


def test_the_service_exports_its_memory_at_scrape_time() -> None:
    from context_app.service.metrics import ServiceMetrics

    m = ServiceMetrics()
    m.sample_process()  # what /metrics does at every scrape (and each worker every 2 s)
    got = parse_service_metrics(m.render().decode())
    assert got["rss_bytes"] is not None and got["rss_bytes"] > 10 * MB
    assert got["py_blocks"] is not None and got["py_blocks"] > 1000


def test_parse_redis_info_from_a_real_server(redis_url: str) -> None:
    c = redis.Redis.from_url(redis_url)
    try:
        db = c.connection_pool.connection_kwargs.get("db", 0)
        c.set("slo-test:probe", "1", ex=30)
        expired, keys = parse_redis_info(c.info(), db=db)
        assert expired >= 0
        assert keys >= 1
        c.delete("slo-test:probe")
    finally:
        c.close()
