"""SLO gates on hand-made samples (exact figures) and on real exposition/INFO sources."""

from __future__ import annotations

import math

import pytest
import redis
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from loadtests.slo import (
    Sample,
    evaluate,
    expired_growth_per_min,
    histogram_quantile,
    parse_redis_info,
    parse_service_metrics,
)

INF = math.inf


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


def test_expired_growth_uses_one_minute_windows() -> None:
    samples = [
        Sample(t=0.0, expired_keys=0, keys=1000),
        Sample(t=30.0, expired_keys=10, keys=1000),
        Sample(t=60.0, expired_keys=30, keys=1000),
        Sample(t=120.0, expired_keys=90, keys=600),
    ]
    # windows: 0->60: 30/1000 = 3 %; 30->120: 80 over 1.5 min / 1000 = 5.33 %;
    # 60->120: 60/1000 = 6 %
    assert expired_growth_per_min(samples) == pytest.approx(0.06)
    assert expired_growth_per_min(samples[:1]) is None


def test_short_runs_scale_growth_to_a_minute() -> None:
    samples = [Sample(t=0.0, expired_keys=5, keys=200), Sample(t=20.0, expired_keys=6, keys=200)]
    assert expired_growth_per_min(samples) == pytest.approx(3 / 200)


def _good_run() -> list[Sample]:
    b0 = ((0.01, 0.0), (0.05, 0.0), (0.1, 0.0), (INF, 0.0))
    b1 = ((0.01, 500.0), (0.05, 990.0), (0.1, 1000.0), (INF, 1000.0))
    return [
        Sample(t=0.0, expired_keys=0, keys=10, l3_buckets=b0, load_failures=2.0, requests=0),
        Sample(
            t=30.0,
            expired_keys=0,
            keys=400,
            l3_buckets=b1,
            load_failures=2.0,
            requests=20_000,
            failures=3,
        ),
    ]


def test_evaluate_passes_a_clean_run() -> None:
    v = evaluate(_good_run())
    by = {r.name: r for r in v.results}
    assert v.passed
    assert by["l3_search_p99"].achieved == pytest.approx(50.0)
    assert by["context_load_failures"].achieved == 0.0  # 2 before the run are not charged
    assert by["error_ratio"].achieved == pytest.approx(3 / 20_000)
    assert by["expired_keys_growth"].achieved == 0.0


def test_evaluate_fails_each_breached_gate() -> None:
    run = _good_run()
    bad = Sample(
        t=40.0,
        expired_keys=5,
        keys=400,
        l3_buckets=((0.1, 0.0), (INF, 1000.0)),
        load_failures=3.0,
        requests=20_100,
        failures=40,
    )
    v = evaluate([*run, bad])
    failed = {r.name for r in v.results if not r.passed}
    assert failed == {
        "expired_keys_growth",
        "l3_search_p99",
        "context_load_failures",
        "error_ratio",
    }
    assert not v.passed
    # A fault scenario that breaks gates on purpose passes when only those are breached.
    assert evaluate([*run, bad], expected_breaches=failed).passed


def test_a_gate_without_data_fails() -> None:
    v = evaluate([Sample(t=0.0)])
    assert not v.passed
    assert all(not r.passed for r in v.results)
    assert {r.note for r in v.results} >= {"Redis INFO never read twice", "no request completed"}


def test_sample_round_trips_through_json_dicts() -> None:
    s = _good_run()[1]
    assert Sample.from_dict(s.to_dict()) == s


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
