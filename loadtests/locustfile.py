"""Locust entry point: the agent user, the profile shape, the sampler and the SLO verdict.

    locust -f loadtests/locustfile.py --headless --host http://127.0.0.1:8080 \
        --ctx-profile short_sessions --duration-s 120 --rate-scale 0.02 --keys-file keys.json

``ctx loadtest PROFILE`` runs this for you (service, Valkey, keys, report). Every option can
also come from the environment (``LOCUST_CTX_PROFILE``, ``LOCUST_RATE_SCALE``, ...), which is how
the docker-compose master gets its settings.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import gevent
from locust import LoadTestShape, events
from locust.runners import WorkerRunner

if __package__ in (None, ""):  # run as a file by locust: make `loadtests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.faults import EXPECTED_BREACHES, FAULTS
from loadtests.sampler import Sampler
from loadtests.shapes import PROFILES
from loadtests.slo import GATES, evaluate
from loadtests.user import RUN_STARTED, ContextAgent, plan_from_options

__all__ = ["ContextAgent", "ProfileShape"]

log = logging.getLogger("loadtests")
_state: dict[str, Any] = {}


@events.init_command_line_parser.add_listener
def _options(parser: Any, **_kwargs: Any) -> None:
    g = parser.add_argument_group("context-service campaign")
    g.add_argument(
        "--ctx-profile",
        dest="ctx_profile",
        choices=sorted(PROFILES),
        default="short_sessions",
        env_var="LOCUST_CTX_PROFILE",
        help="load profile",
    )
    g.add_argument(
        "--duration-s",
        type=float,
        default=120.0,
        env_var="LOCUST_DURATION",
        help="run length in seconds; the whole profile is compressed into it",
    )
    g.add_argument(
        "--time-scale",
        type=float,
        default=0.0,
        env_var="LOCUST_TIME_SCALE",
        help="profile seconds per run second (overrides the squeeze)",
    )
    g.add_argument(
        "--rate-scale",
        type=float,
        default=1.0,
        env_var="LOCUST_RATE_SCALE",
        help="multiply the profile's request rate",
    )
    g.add_argument(
        "--keys-file", default="", env_var="LOCUST_KEYS_FILE", help="JSON {agent_id: raw API key}"
    )
    g.add_argument(
        "--redis-url",
        default="",
        env_var="LOCUST_REDIS_URL",
        help="Redis the service uses, for the expired-keys gate",
    )
    g.add_argument(
        "--samples-out",
        default="",
        env_var="LOCUST_SAMPLES_OUT",
        help="where to write sampled figures + verdict (JSON)",
    )
    g.add_argument(
        "--fault",
        choices=["none", *FAULTS],
        default="none",
        env_var="LOCUST_FAULT",
        help="fault drill running alongside",
    )
    g.add_argument(
        "--ttl-factor",
        type=float,
        default=1.0,
        env_var="LOCUST_TTL_FACTOR",
        help="the factor the service's TTLs were divided by (ctx loadtest passes it when it "
        "scales them); the expired-keys gate counts per profile minute with it",
    )
    g.add_argument(
        "--sample-every",
        type=float,
        default=2.0,
        env_var="LOCUST_SAMPLE_EVERY",
        help="seconds between samples",
    )


class ProfileShape(LoadTestShape):
    """Users over time from the compressed profile: ``users = target rate / per-user rate``."""

    def tick(self) -> tuple[int, float] | None:
        assert self.runner is not None
        return plan_from_options(self.runner.environment.parsed_options).tick(self.get_run_time())


@events.test_start.add_listener
def _start_sampler(environment: Any, **_kwargs: Any) -> None:
    RUN_STARTED[:] = [time.perf_counter()]
    runner = environment.runner
    if runner is None or isinstance(runner, WorkerRunner) or "sampler" in _state:
        return
    opts = environment.parsed_options
    run_plan = plan_from_options(opts)
    shape = environment.shape_class
    sampler = Sampler(
        service_url=environment.host,
        redis_url=opts.redis_url or None,
        stats=environment.stats,
        run_time=shape.get_run_time if shape is not None else (lambda: 0.0),
        target=run_plan.target_rps,
        users=lambda: runner.user_count,
        every_s=opts.sample_every,
        target_requests=run_plan.target_requests,
    )
    _state["sampler"] = sampler
    _state["greenlet"] = gevent.spawn(sampler.run)


@events.quitting.add_listener
def _verdict(environment: Any, **_kwargs: Any) -> None:
    sampler: Sampler | None = _state.get("sampler")
    if sampler is None:
        return
    sampler.stop()
    if "greenlet" in _state:
        _state["greenlet"].kill(block=False)
    opts = environment.parsed_options
    expected = EXPECTED_BREACHES.get(opts.fault, frozenset())
    run_plan = plan_from_options(opts)
    verdict = evaluate(
        sampler.samples,
        expected_breaches=expected,
        baseline=sampler.baseline,
        run_s=run_plan.duration_s,
        ttl_factor=opts.ttl_factor,
    )
    if opts.samples_out:
        sampler.dump(
            Path(opts.samples_out),
            profile=opts.ctx_profile,
            fault=opts.fault,
            plan={
                "time_scale": run_plan.time_scale,
                "rate_scale": run_plan.rate_scale,
                "duration_s": run_plan.duration_s,
                "think_s": run_plan.think_s,
                "steps_per_session": run_plan.steps_per_session,
                "user_rps": run_plan.user_rps,
                "abandon_share": run_plan.profile.abandon_share,
                "confirm_every": run_plan.profile.confirm_every,
                "requests_per_step": run_plan.requests_per_step,
                "requests_per_session": run_plan.requests_per_session,
                "step_period_s": run_plan.mean_step_period(),
                "run_session_s": run_plan.run_session_s,
                "profile_session_s": run_plan.profile.session_s,
                "ttl_factor": opts.ttl_factor,
            },
            verdict=verdict.to_dict(),
        )
    for r in verdict.results:
        log.warning(
            "SLO %-22s %-26s achieved=%s %s %s",
            r.name,
            r.target,
            r.achieved,
            "PASS" if r.passed else "FAIL",
            r.note,
        )
    if verdict.passed:
        log.warning("SLO verdict: PASS (%d gates)", len(GATES))
    else:
        log.error("SLO verdict: FAIL; failed gates: %s", ", ".join(verdict.failed))
    environment.process_exit_code = 0 if verdict.passed else 1


if __name__ == "__main__":
    from locust import run_single_user

    run_single_user(ContextAgent)
