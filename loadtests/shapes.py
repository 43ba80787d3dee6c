"""The three 24-hour load profiles as pure functions of time, and their compression.

A profile is data: a target request rate as a function of *profile* time, a mean session
length and a think time between agent steps. A campaign never runs for 24 h on this machine:
:func:`plan` compresses profile time by ``time_scale`` (``run_t = profile_t / time_scale``),
scales the rate by ``rate_scale`` and turns the target rate into a number of users, each
holding a constant throughput of steps (Locust's ``constant_throughput``), so the rate is held
by construction instead of guessed from user counts. Nothing here imports Locust, so every
figure is unit-testable at chosen times.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "PROFILES",
    "REQUESTS_PER_STEP",
    "Profile",
    "RunPlan",
    "burst_rate",
    "get_profile",
    "long_sessions_rate",
    "plan",
    "short_sessions_rate",
]

DAY_S = 24 * 3600.0
#: Each agent step posts a tool result, loads context and posts its output.
REQUESTS_PER_STEP = 3
#: Each session adds a create, its step plan and a close request around its steps.
REQUESTS_PER_SESSION = 3

# Burst profile: a quiet baseline, a 5-minute climb, a plateau, a 5-minute descent.
BURST_BASE_QPS = 200.0
BURST_PEAK_QPS = 3000.0
BURST_RISE_START_S = 10 * 60.0
BURST_RAMP_S = 5 * 60.0
BURST_HOLD_S = 5 * 60.0
BURST_DURATION_S = 30 * 60.0


def short_sessions_rate(t: float) -> float:
    """1,000 QPS, flat, for 24 h (``t`` in profile seconds); 0 outside the day."""
    return 1000.0 if 0.0 <= t < DAY_S else 0.0


def long_sessions_rate(t: float) -> float:
    """100 QPS, flat, for 24 h; 0 outside the day."""
    return 100.0 if 0.0 <= t < DAY_S else 0.0


def burst_rate(t: float) -> float:
    """200 QPS for 10 min, rising linearly to 3,000 QPS within 5 min, 5 min at the peak,
    back down to 200 QPS within 5 min, 5 min of baseline; 0 after 30 min."""
    if t < 0.0 or t >= BURST_DURATION_S:
        return 0.0
    rise_end = BURST_RISE_START_S + BURST_RAMP_S
    fall_start = rise_end + BURST_HOLD_S
    fall_end = fall_start + BURST_RAMP_S
    span = BURST_PEAK_QPS - BURST_BASE_QPS
    if t < BURST_RISE_START_S:
        return BURST_BASE_QPS
    if t < rise_end:
        return BURST_BASE_QPS + span * (t - BURST_RISE_START_S) / BURST_RAMP_S
    if t < fall_start:
        return BURST_PEAK_QPS
    if t < fall_end:
        return BURST_PEAK_QPS - span * (t - fall_start) / BURST_RAMP_S
    return BURST_BASE_QPS


@dataclass(frozen=True, slots=True)
class Profile:
    """A load profile in profile (uncompressed) time."""

    name: str
    duration_s: float
    session_s: float  # mean session length
    think_s: float  # time between two steps of one agent
    rate: Callable[[float], float]  # target requests/s at profile time t
    description: str = ""


PROFILES: dict[str, Profile] = {
    "short_sessions": Profile(
        "short_sessions",
        DAY_S,
        2.3 * 60,
        6.0,
        short_sessions_rate,
        "1,000 QPS for 24 h, sessions of 2.3 min",
    ),
    "long_sessions": Profile(
        "long_sessions",
        DAY_S,
        47 * 60.0,
        30.0,
        long_sessions_rate,
        "100 QPS for 24 h, sessions of 47 min",
    ),
    "burst": Profile(
        "burst",
        BURST_DURATION_S,
        2.3 * 60,
        6.0,
        burst_rate,
        "200 QPS rising to 3,000 QPS within 5 min, then back",
    ),
}


def get_profile(name: str) -> Profile:
    """The named profile; an unknown name raises ``ValueError`` listing the allowed ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown load profile {name!r}; allowed: {', '.join(sorted(PROFILES))}"
        ) from None


@dataclass(frozen=True, slots=True)
class RunPlan:
    """A profile compressed and scaled to fit one run on this machine.

    ``think_s`` is the run-time pacing of one user's steps (never below ``min_think_s`` so a
    user's requests do not pile up), ``steps_per_session`` follows the compressed session
    length, and each user holds ``user_rps`` requests/s.
    """

    profile: Profile
    time_scale: float
    rate_scale: float
    duration_s: float  # run seconds
    think_s: float
    steps_per_session: int

    @property
    def user_step_rate(self) -> float:
        """Steps per second one user holds (the ``constant_throughput`` argument)."""
        return 1.0 / self.think_s

    @property
    def user_rps(self) -> float:
        """Requests per second one user sends, session create/close included."""
        per_step = REQUESTS_PER_STEP + REQUESTS_PER_SESSION / self.steps_per_session
        return per_step * self.user_step_rate

    def user_step_rate_at(self, run_t: float) -> float:
        """Steps/s each user holds at ``run_t`` so ``users x rate`` meets the target exactly
        (the user count is rounded up, so each user runs a little below its maximum)."""
        n = self.users(run_t)
        if n == 0:
            return self.user_step_rate
        per_step = REQUESTS_PER_STEP + REQUESTS_PER_SESSION / self.steps_per_session
        return self.target_rps(run_t) / (n * per_step)

    def profile_time(self, run_t: float) -> float:
        return run_t * self.time_scale

    def target_rps(self, run_t: float) -> float:
        """Target requests/s at run time ``run_t`` (0 once the run is over)."""
        if run_t < 0.0 or run_t >= self.duration_s:
            return 0.0
        return self.profile.rate(self.profile_time(run_t)) * self.rate_scale

    def users(self, run_t: float) -> int:
        """Users needed to hold the target rate at ``run_t`` (each at ``user_rps``)."""
        target = self.target_rps(run_t)
        if target <= 0.0:
            return 0
        return max(1, math.ceil(target / self.user_rps - 1e-9))

    def tick(self, run_t: float) -> tuple[int, float] | None:
        """What a Locust shape returns: ``(users, spawn_rate)``, or None to stop.

        The spawn rate lets any change of user count complete within about one second.
        """
        if run_t >= self.duration_s:
            return None
        n = self.users(run_t)
        return n, float(max(1, n))


def plan(
    profile: Profile | str,
    *,
    time_scale: float | None = None,
    duration_s: float | None = None,
    rate_scale: float = 1.0,
    min_think_s: float = 0.5,
    min_steps: int = 2,
) -> RunPlan:
    """Compress ``profile`` into a run.

    Give ``time_scale`` (profile seconds per run second) or ``duration_s`` (the run length:
    the whole profile is squeezed into it), or both (the run stops at ``duration_s``).
    """
    p = get_profile(profile) if isinstance(profile, str) else profile
    if rate_scale <= 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    if time_scale is None:
        if duration_s is None:
            raise ValueError("give time_scale or duration_s")
        if duration_s <= 0:
            raise ValueError(f"duration_s must be > 0, got {duration_s}")
        time_scale = p.duration_s / duration_s
    if time_scale <= 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    full = p.duration_s / time_scale
    run_s = full if duration_s is None else min(full, duration_s)
    think = max(p.think_s / time_scale, min_think_s)
    steps = max(min_steps, round((p.session_s / time_scale) / think))
    return RunPlan(p, time_scale, rate_scale, run_s, think, steps)
