"""The load profiles are pure functions of time: exact values at chosen instants."""

from __future__ import annotations

import pytest

from loadtests.shapes import (
    PROFILES,
    burst_rate,
    get_profile,
    long_sessions_rate,
    plan,
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
    assert p.user_rps == pytest.approx(9.0)  # (3 + 3/2) requests per step, 2 steps/s
    assert p.target_rps(0.0) == pytest.approx(10.0)
    assert p.users(0.0) == 2
    assert p.tick(0.0) == (2, 2.0)
    # 2 users x 1.11 steps/s x 4.5 requests/step = the 10 req/s target, not 18
    assert p.user_step_rate_at(0.0) == pytest.approx(10.0 / 9.0)
    assert p.tick(119.9) == (2, 2.0)
    assert p.tick(120.0) is None


def test_long_plan_keeps_longer_sessions() -> None:
    p = plan("long_sessions", duration_s=120.0, rate_scale=0.1)
    assert p.steps_per_session == 8  # 2820 s / 720 = 3.92 s at 0.5 s per step
    assert p.user_rps == pytest.approx(6.75)  # (3 + 3/8) x 2
    assert p.target_rps(60.0) == pytest.approx(10.0)
    assert p.users(60.0) == 2


def test_burst_plan_follows_the_curve_in_run_time() -> None:
    p = plan("burst", duration_s=60.0, rate_scale=0.01)
    assert p.time_scale == pytest.approx(30.0)
    assert p.target_rps(10.0) == pytest.approx(2.0)
    assert p.target_rps(25.0) == pytest.approx(16.0)
    assert p.target_rps(30.0) == pytest.approx(30.0)
    assert p.steps_per_session == 9  # 138 s / 30 = 4.6 s at 0.5 s per step
    assert p.users(30.0) == 5  # 30 / ((3 + 3/9) * 2) = 4.5 users
    assert p.target_rps(60.0) == 0.0


def test_time_scale_and_duration_together() -> None:
    p = plan("short_sessions", time_scale=1440.0, duration_s=30.0)
    assert p.duration_s == 30.0  # the compressed day would last 60 s; the run stops first
    assert p.profile_time(30.0) == pytest.approx(43_200.0)


def test_rate_scale_one_holds_the_full_rate() -> None:
    p = plan("short_sessions", duration_s=300.0)
    assert p.target_rps(10.0) == pytest.approx(1000.0)
    assert p.users(10.0) == 112  # 1000 / ((3 + 3/2) * 2) = 111.1 users


def test_bad_arguments_name_the_problem() -> None:
    with pytest.raises(ValueError, match="allowed: burst, long_sessions, short_sessions"):
        get_profile("nope")
    with pytest.raises(ValueError, match="time_scale or duration_s"):
        plan("burst")
    with pytest.raises(ValueError, match="rate_scale"):
        plan("burst", duration_s=10.0, rate_scale=0.0)
