"""The load profiles are pure functions of time: exact values at chosen instants."""

from __future__ import annotations

import pytest

from loadtests.shapes import (
    ENDPOINTS,
    PROFILES,
    burst_rate,
    get_profile,
    long_sessions_rate,
    plan,
    scaled_ttls,
    short_sessions_rate,
)


@pytest.mark.parametrize(
    ("t", "expected"),
    [(-1.0, 0.0), (0.0, 1000.0), (43_200.0, 1000.0), (86_399.9, 1000.0), (86_400.0, 0.0)],
)
def test_short_sessions_rate(t: float, expected: float) -> None:
    assert short_sessions_rate(t) == expected


@pytest.mark.parametrize(("t", "expected"), [(0.0, 100.0), (80_000.0, 100.0), (86_400.0, 0.0)])
def test_long_sessions_rate(t: float, expected: float) -> None:
    assert long_sessions_rate(t) == expected


@pytest.mark.parametrize(
    ("t", "expected"),
    [
        (0.0, 200.0),
        (599.0, 200.0),
        (600.0, 200.0),  # the climb starts at 10 min
        (750.0, 1600.0),  # half way up
        (900.0, 3000.0),  # peak reached within 5 min
        (1199.0, 3000.0),
        (1350.0, 1600.0),  # half way down
        (1500.0, 200.0),
        (1799.0, 200.0),
        (1800.0, 0.0),
    ],
)
def test_burst_rate(t: float, expected: float) -> None:
    assert burst_rate(t) == pytest.approx(expected)


def test_profiles_describe_the_issue() -> None:
    assert PROFILES["short_sessions"].session_s == pytest.approx(138.0)
    assert PROFILES["long_sessions"].session_s == pytest.approx(2820.0)
    assert PROFILES["short_sessions"].duration_s == 86_400.0
    assert PROFILES["burst"].duration_s == 1800.0


def test_short_plan_compresses_a_day_into_two_minutes() -> None:
    p = plan("short_sessions", duration_s=120.0, rate_scale=0.01)
    assert p.time_scale == pytest.approx(720.0)
    assert p.duration_s == pytest.approx(120.0)
    assert p.think_s == 0.5  # 6 s / 720 is below the floor
    assert p.steps_per_session == 2  # 138 s / 720 = 0.19 s -> the 2-step minimum
    # per session create + plan, and a close for the 80 % not abandoned: 2.8 requests
    assert p.requests_per_session == pytest.approx(2.8)
    assert p.requests_per_step == pytest.approx(4.4)  # 3 + 2.8 / 2
    assert p.user_rps == pytest.approx(8.8)  # 4.4 requests per step, 2 steps/s
    assert p.target_rps(0.0) == pytest.approx(10.0)
    assert p.users(0.0) == 2
    assert p.tick(0.0) == (2, 2.0)
    # 2 users x 1.136 steps/s x 4.4 requests/step = the 10 req/s target, not 17.6
    assert p.user_step_rate_at(0.0) == pytest.approx(10.0 / 8.8)
    assert p.tick(119.9) == (2, 2.0)
    assert p.tick(120.0) is None


def test_long_plan_keeps_longer_sessions() -> None:
    p = plan("long_sessions", duration_s=120.0, rate_scale=0.1)
    assert p.steps_per_session == 8  # 2820 s / 720 = 3.92 s at 0.5 s per step
    # 3 per step + one confirmation per 4 steps + (create + plan + 70 % close) / 8 steps
    assert p.requests_per_step == pytest.approx(3 + 0.25 + 2.7 / 8)
    assert p.user_rps == pytest.approx(7.175)  # 3.5875 x 2
    assert p.target_rps(60.0) == pytest.approx(10.0)
    assert p.users(60.0) == 2


def test_burst_plan_follows_the_curve_in_run_time() -> None:
    p = plan("burst", duration_s=60.0, rate_scale=0.01)
    assert p.time_scale == pytest.approx(30.0)
    assert p.target_rps(10.0) == pytest.approx(2.0)
    assert p.target_rps(25.0) == pytest.approx(16.0)
    assert p.target_rps(30.0) == pytest.approx(30.0)
    assert p.steps_per_session == 9  # 138 s / 30 = 4.6 s at 0.5 s per step
    assert p.users(30.0) == 5  # 30 / ((3 + 2.8/9) * 2) = 4.53 users
    assert p.target_rps(60.0) == 0.0


def test_time_scale_and_duration_together() -> None:
    p = plan("short_sessions", time_scale=1440.0, duration_s=30.0)
    assert p.duration_s == 30.0  # the compressed day would last 60 s; the run stops first
    assert p.profile_time(30.0) == pytest.approx(43_200.0)


def test_rate_scale_one_holds_the_full_rate() -> None:
    p = plan("short_sessions", duration_s=300.0)
    assert p.target_rps(10.0) == pytest.approx(1000.0)
    assert p.users(10.0) == 114  # 1000 / ((3 + 2.8/2) * 2) = 113.6 users


def test_abandon_shares_and_confirmations_per_profile() -> None:
    assert {n: p.abandon_share for n, p in PROFILES.items()} == {
        "short_sessions": 0.2,
        "long_sessions": 0.3,
        "burst": 0.2,
    }
    assert {n: p.confirm_every for n, p in PROFILES.items()} == {
        "short_sessions": 0,
        "long_sessions": 4,
        "burst": 0,
    }


def test_endpoint_rates_split_the_target_by_the_plan() -> None:
    p = plan("short_sessions", duration_s=120.0, rate_scale=0.01)
    rates = p.endpoint_rates(1000.0)
    steps = 1000.0 / 4.4  # 227.27 steps/s
    assert rates["event"] == rates["context"] == rates["output"] == pytest.approx(steps)
    assert rates["create"] == rates["plan"] == pytest.approx(steps / 2)  # 113.6 sessions/s
    assert rates["close"] == pytest.approx(0.8 * steps / 2)  # 20 % abandoned
    assert rates["confirmation"] == 0.0
    assert sum(rates.values()) == pytest.approx(1000.0)
    assert set(rates) == set(ENDPOINTS)
    long = plan("long_sessions", duration_s=120.0, rate_scale=0.1)
    lr = long.endpoint_rates(100.0)
    assert lr["confirmation"] == pytest.approx(lr["context"] / 4)
    assert lr["close"] == pytest.approx(0.7 * lr["create"])
    assert sum(lr.values()) == pytest.approx(100.0)


def test_target_requests_integrate_the_target() -> None:
    p = plan("short_sessions", duration_s=120.0, rate_scale=0.01)
    assert p.target_requests(0.0, 120.0) == pytest.approx(1200.0)
    assert p.target_requests(100.0, 130.0) == pytest.approx(200.0)  # the shape stops at 120 s
    assert p.target_requests(5.0, 5.0) == 0.0
    b = plan("burst", duration_s=60.0, rate_scale=0.01)
    # the climb from 2 to 30 req/s between run seconds 20 and 30: mean 16 req/s for 10 s
    assert b.target_requests(20.0, 30.0) == pytest.approx(160.0)
    assert b.target_requests(0.0, 20.0) == pytest.approx(40.0)


def test_ttl_factor_is_the_compression_the_sessions_see() -> None:
    p = plan("short_sessions", duration_s=120.0, rate_scale=0.01)
    # 2 users at 10/8.8 steps/s each: one step every 0.88 s, not the 0.5 s think floor
    assert p.mean_step_period() == pytest.approx(0.88)
    assert p.run_session_s == pytest.approx(1.76)  # 2 steps
    assert p.ttl_factor == pytest.approx(138.0 / 1.76)  # 78.4, not time_scale 720
    full = plan("short_sessions", duration_s=120.0, rate_scale=1.0)
    # 114 users hold 1000 req/s at 1.994 steps/s each: close to the 0.5 s floor
    assert full.mean_step_period() == pytest.approx(114 * 4.4 / 1000.0)
    assert full.ttl_factor == pytest.approx(138.0 / (2 * 0.5016))


DESIGN_TTLS = {
    "wm_default_ttl_s": 900,
    "wm_min_ttl_s": 60,
    "wm_contract_ttl_s": 7200,
    "session_idle_s": 90,
    "idle_sweep_interval_s": 15.0,
}


def test_scaled_ttls_divide_by_the_factor_with_floors() -> None:
    assert scaled_ttls(DESIGN_TTLS, 10.0, 0.5) == {
        "wm_default_ttl_s": 90,
        "wm_min_ttl_s": 6,
        "wm_contract_ttl_s": 720,
        "session_idle_s": 9,
        "idle_sweep_interval_s": 1.5,
    }
    # factor 100: min TTL 0.6 s and idle 0.9 s hit their floors, the sweep its 1 s
    assert scaled_ttls(DESIGN_TTLS, 100.0, 0.5) == {
        "wm_default_ttl_s": 9,
        "wm_min_ttl_s": 1,
        "wm_contract_ttl_s": 72,
        "session_idle_s": 2,
        "idle_sweep_interval_s": 1.0,
    }
    # a slow step period (0.88 s) raises the floors: min TTL covers 2 steps, idle 3
    got = scaled_ttls(DESIGN_TTLS, 138.0 / 1.76, 0.88)
    assert got["wm_min_ttl_s"] == 2 and got["session_idle_s"] == 3
    assert got["wm_default_ttl_s"] == 11 and got["wm_contract_ttl_s"] == 92
    assert all(isinstance(got[k], int) for k in DESIGN_TTLS if k != "idle_sweep_interval_s")
    off = scaled_ttls({**DESIGN_TTLS, "idle_sweep_interval_s": 0.0}, 100.0, 0.5)
    assert off["idle_sweep_interval_s"] == 0.0  # the sweep switched off stays off
    with pytest.raises(ValueError, match="factor"):
        scaled_ttls(DESIGN_TTLS, 0.0, 0.5)


def test_bad_arguments_name_the_problem() -> None:
    with pytest.raises(ValueError, match="allowed: burst, long_sessions, short_sessions"):
        get_profile("nope")
    with pytest.raises(ValueError, match="time_scale or duration_s"):
        plan("burst")
    with pytest.raises(ValueError, match="rate_scale"):
        plan("burst", duration_s=10.0, rate_scale=0.0)
