"""The three 24-hour load profiles as pure functions of time, and their compression.

A profile is data: a target request rate as a function of *profile* time, a mean session
length and a think time between agent steps. A campaign never runs for 24 h on this machine:
:func:`plan` compresses profile time by ``time_scale`` (``run_t = profile_t / time_scale``),
scales the rate by ``rate_scale`` and turns the target rate into a number of users, each
holding a constant throughput of steps (Locust's ``constant_throughput``), so the rate is held
by construction instead of guessed from user counts. Nothing here imports Locust, so every
figure is unit-testable at chosen times.

**Abandoned sessions.** Agents do not all say goodbye: a share of sessions
(:attr:`Profile.abandon_share`, drawn per session by each user) just stop after their last
step, without ``DELETE``, and their working-memory keys must go through the TTLs and the idle
sweep. The shares are a judgement, not a measurement: 20 % for the short-session profiles
(a chat closed mid-task), 30 % for long_sessions (a 47-minute task is more often left
unfinished than a 2-minute one).

**TTL scaling.** Compressing the profile makes sessions shorter, so the service's TTLs must
shrink with them or no key ever expires during a run. The factor is the compression the
*sessions* experience, not the profile's ``time_scale`` (think time has a floor)::

    ttl_factor = profile.session_s / (steps_per_session x step period held in the run)

and :func:`scaled_ttls` divides each TTL setting by it, with floors (see there).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = [
    "ENDPOINTS",
    "PROFILES",
    "REQUESTS_PER_STEP",
    "SESSION_CLOSE_REQUESTS",
    "SESSION_OPEN_REQUESTS",
    "TTL_SETTINGS",
    "Profile",
    "RunPlan",
    "burst_rate",
    "get_profile",
    "long_sessions_rate",
    "plan",
    "scaled_ttls",
    "short_sessions_rate",
]

DAY_S = 24 * 3600.0
#: Each agent step posts a tool result, loads context and posts its output.
REQUESTS_PER_STEP = 3
#: Each session opens with a create and its step plan ...
SESSION_OPEN_REQUESTS = 2
#: ... and ends with a close, unless the agent abandons it.
SESSION_CLOSE_REQUESTS = 1

#: Locust request names (``METHOD name``) of the agent's endpoints, in the agent's order.
ENDPOINTS: dict[str, str] = {
    "create": "POST /v1/sessions",
    "plan": "PUT /v1/sessions/{id}/plan",
    "event": "POST /v1/sessions/{id}/events",
    "context": "POST /v1/context",
    "output": "POST /v1/sessions/{id}/outputs",
    "confirmation": "POST /v1/sessions/{id}/confirmations",
    "close": "DELETE /v1/sessions/{id}",
}

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
    abandon_share: float = 0.0  # sessions that end without DELETE (keys left to the TTLs)
    confirm_every: int = 0  # one user confirmation per this many steps of a user (0: none)


PROFILES: dict[str, Profile] = {
    "short_sessions": Profile(
        "short_sessions",
        DAY_S,
        2.3 * 60,
        6.0,
        short_sessions_rate,
        "1,000 QPS for 24 h, sessions of 2.3 min",
        abandon_share=0.2,
    ),
    "long_sessions": Profile(
        "long_sessions",
        DAY_S,
        47 * 60.0,
        30.0,
        long_sessions_rate,
        "100 QPS for 24 h, sessions of 47 min",
        abandon_share=0.3,
        # confirmed answers feed the hot collection, so L3 latency drift shows over the run
        confirm_every=4,
    ),
    "burst": Profile(
        "burst",
        BURST_DURATION_S,
        2.3 * 60,
        6.0,
        burst_rate,
        "200 QPS rising to 3,000 QPS within 5 min, then back",
        abandon_share=0.2,
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
    def confirmations_per_step(self) -> float:
        """User confirmations per step (``1 / confirm_every``; 0 when the profile has none)."""
        n = self.profile.confirm_every
        return 1.0 / n if n > 0 else 0.0

    @property
    def requests_per_session(self) -> float:
        """Mean requests a session adds around its steps: create + plan, and a close unless
        abandoned: ``2 + (1 - abandon_share) x 1``."""
        keep = 1.0 - self.profile.abandon_share
        return SESSION_OPEN_REQUESTS + keep * SESSION_CLOSE_REQUESTS

    @property
    def requests_per_step(self) -> float:
        """Mean requests per agent step, the session's own requests spread over its steps:
        ``3 + confirmations_per_step + requests_per_session / steps_per_session``."""
        return (
            REQUESTS_PER_STEP
            + self.confirmations_per_step
            + self.requests_per_session / self.steps_per_session
        )

    @property
    def user_rps(self) -> float:
        """Requests per second one user sends at its maximum step rate (session requests,
        abandoned sessions' missing close and confirmations included)."""
        return self.requests_per_step * self.user_step_rate

    def user_step_rate_at(self, run_t: float) -> float:
        """Steps/s each user holds at ``run_t`` so ``users x rate`` meets the target exactly
        (the user count is rounded up, so each user runs a little below its maximum)."""
        n = self.users(run_t)
        if n == 0:
            return self.user_step_rate
        return self.target_rps(run_t) / (n * self.requests_per_step)

    def endpoint_rates(self, total_rps: float) -> dict[str, float]:
        """How ``total_rps`` requests/s split over the agent's endpoints (keys of
        :data:`ENDPOINTS`): ``steps/s = total / requests_per_step``; event, context and
        output at ``steps/s``; create and plan at ``steps/s / steps_per_session``; close at
        ``(1 - abandon_share)`` of that; confirmations at ``steps/s / confirm_every``."""
        steps = total_rps / self.requests_per_step
        sessions = steps / self.steps_per_session
        return {
            "create": sessions,
            "plan": sessions,
            "event": steps,
            "context": steps,
            "output": steps,
            "confirmation": steps * self.confirmations_per_step,
            "close": sessions * (1.0 - self.profile.abandon_share),
        }

    def mean_step_period(self, n: int = 400) -> float:
        """The run-time step period users hold, averaged over the run and weighted by the
        steps taken (the target rate): ``think_s``, or longer while the rounded-up user count
        lets each user run below its maximum."""
        num = den = 0.0
        for i in range(n):
            t = (i + 0.5) * self.duration_s / n
            r = self.target_rps(t)
            if r <= 0.0:
                continue
            num += r / self.user_step_rate_at(t)
            den += r
        return num / den if den > 0 else self.think_s

    @property
    def run_session_s(self) -> float:
        """Mean session length in run seconds: ``steps_per_session x mean_step_period()``."""
        return self.steps_per_session * self.mean_step_period()

    @property
    def ttl_factor(self) -> float:
        """Profile seconds per run second *as the sessions experience it*:
        ``profile.session_s / run_session_s``. Smaller than ``time_scale`` whenever the think
        time floor or the step minimum stretches the sessions."""
        return self.profile.session_s / self.run_session_s

    def profile_time(self, run_t: float) -> float:
        return run_t * self.time_scale

    def target_rps(self, run_t: float) -> float:
        """Target requests/s at run time ``run_t`` (0 once the run is over)."""
        if run_t < 0.0 or run_t >= self.duration_s:
            return 0.0
        return self.profile.rate(self.profile_time(run_t)) * self.rate_scale

    def target_requests(self, t0: float, t1: float, step_s: float = 0.05) -> float:
        """Requests the target asks for between run times ``t0`` and ``t1``: the target rate
        integrated with the midpoint rule in steps of at most ``step_s`` (exact for the flat
        and linear pieces of the profiles, off by at most one step at a kink)."""
        if t1 <= t0:
            return 0.0
        n = max(1, math.ceil((t1 - t0) / step_s))
        h = (t1 - t0) / n
        return h * sum(self.target_rps(t0 + (i + 0.5) * h) for i in range(n))

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


#: The service settings :func:`scaled_ttls` compresses (``Settings`` field names).
TTL_SETTINGS = (
    "wm_default_ttl_s",
    "wm_min_ttl_s",
    "wm_contract_ttl_s",
    "session_idle_s",
    "idle_sweep_interval_s",
)


def scaled_ttls(
    design: Mapping[str, float], factor: float, step_period_s: float
) -> dict[str, float]:
    """The service's TTL settings for a run whose sessions are ``factor`` times shorter than
    the profile's (``RunPlan.ttl_factor``), from their ``design`` values (the operator's
    settings; keys of :data:`TTL_SETTINGS`).

    Each is ``design / factor``, rounded to whole seconds for the int settings (Redis TTLs are
    whole seconds), with floors that keep the run's sessions working where the think time
    floor keeps the steps from compressing as much as the sessions (``p`` = the run's step
    period, ``step_period_s``):

    * ``wm_min_ttl_s`` >= ``max(1, ceil(2 p))``: the design floor (60 s = 10 think times) is
      for a dependent step that runs late; it must still cover the next step;
    * ``wm_default_ttl_s`` >= ``wm_min_ttl_s``;
    * ``session_idle_s`` >= ``max(2, ceil(3 p))``: an agent between two steps is not idle
      (the design gives 15 think times);
    * ``wm_contract_ttl_s`` >= ``session_idle_s``: the idle sweep finds the contract it marks;
    * ``idle_sweep_interval_s`` >= 1 s (float; 0, the sweep switched off, stays 0).
    """
    if factor <= 0 or step_period_s <= 0:
        raise ValueError(f"factor and step period must be > 0, got {factor}, {step_period_s}")

    def down(name: str) -> float:
        return float(design[name]) / factor

    min_ttl = max(1, round(down("wm_min_ttl_s")), math.ceil(2.0 * step_period_s - 1e-9))
    default = max(round(down("wm_default_ttl_s")), min_ttl)
    idle = max(2, round(down("session_idle_s")), math.ceil(3.0 * step_period_s - 1e-9))
    contract = max(1, round(down("wm_contract_ttl_s")), idle)
    sweep_design = float(design["idle_sweep_interval_s"])
    sweep = 0.0 if sweep_design <= 0 else max(1.0, round(sweep_design / factor, 3))
    return {
        "wm_default_ttl_s": default,
        "wm_min_ttl_s": min_ttl,
        "wm_contract_ttl_s": contract,
        "session_idle_s": idle,
        "idle_sweep_interval_s": sweep,
    }


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
