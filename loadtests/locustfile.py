"""Locust entry point: the agent user, the profile shape, the sampler and the SLO verdict.

    locust -f loadtests/locustfile.py --headless --host http://127.0.0.1:8080 \
        --ctx-profile short_sessions --duration-s 120 --rate-scale 0.02 --keys-file keys.json

``ctx loadtest PROFILE`` runs this for you (service, Valkey, keys, report). Every option can
also come from the environment (``LOCUST_CTX_PROFILE``, ``LOCUST_RATE_SCALE``, ...), which is how
the docker-compose master gets its settings.

**Distributed** (Locust's own master and workers; ``ctx loadtest --workers N`` starts
them on this machine)::

    locust -f loadtests/locustfile.py --master --headless --expect-workers 2 \
        --host http://SERVICE:8080 --ctx-profile short_sessions ... --samples-out s.json
    locust -f loadtests/locustfile.py --worker --master-host MASTER   # on each load machine

Workers need only the locustfile: the master hands them its options (profile, rate, keys
file path: the keys file must exist at that path on every worker machine) with each spawn
message. The shape ticks on the master; the sampler and the verdict run there too. Before
each sample the master asks every worker to flush its stats (the ``ctx_flush_stats`` custom
message, answered by an immediate stats report tagged with the request's number) and waits
for all of them, so a sample's counters and histograms stop at the same instant on every
worker; a sample some worker did not answer in time is marked ``stats_synced=False`` and
never ends a gate's window (:func:`loadtests.slo.held_samples`).

The premature-expiration gate (:mod:`loadtests.ledger`): the process holding the sampler also
subscribes to the Redis expiry notifications; every process running users keeps a session
ledger, and a worker sends its ledger to the master when it stops (the ``ctx_ledger`` custom
message, before its ``client_stopped``), so the master joins every session with the expired
keys before the verdict.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import gevent
import gevent.event
from locust import LoadTestShape, events
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner

if __package__ in (None, ""):  # run as a file by locust: make `loadtests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.faults import EXPECTED_BREACHES, FAULTS
from loadtests.ledger import classify, predicted_step_expirations, watch_redis
from loadtests.sampler import Sampler
from loadtests.shapes import PROFILES
from loadtests.slo import GATES, evaluate
from loadtests.user import LEDGER, RUN_STARTED, ContextAgent, plan_from_options

__all__ = ["ContextAgent", "ProfileShape", "StatsFlush"]

log = logging.getLogger("loadtests")
_state: dict[str, Any] = {}

#: Custom message master -> workers: "report your stats now" (data: {"seq": n}).
FLUSH_MESSAGE = "ctx_flush_stats"
#: Key of the report_to_master payload carrying the last flush request a worker received.
FLUSH_SEQ = "ctx_flush_seq"
#: Custom message worker -> master at the end of the test: the worker's session ledger.
LEDGER_MESSAGE = "ctx_ledger"
#: How long the master waits for every worker's flushed report before sampling anyway.
FLUSH_TIMEOUT_S = 2.0


class StatsFlush:
    """Master side of the stats flush: ask every worker for a report, wait for all of them.

    Called by the sampler before each sample; returns ``(workers answered, all answered)``.
    A worker tags each report with the number of the last flush request it received
    (:data:`FLUSH_SEQ`), and a report built after the request holds every request the worker
    completed before it, so once every worker has answered request ``n`` the master's summed
    stats stop at (nearly) the same instant everywhere. No worker connected, or the master
    already quit (the workers sent their final reports, nothing more can arrive): ``(0, True)``.
    """

    def __init__(self, runner: MasterRunner, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        self.runner = runner
        self.timeout_s = timeout_s
        self.seq = 0
        self.acked: dict[str, int] = {}
        self._event = gevent.event.Event()
        self.closed = False  # set when the master quits: its message loop is gone

    def on_report(self, client_id: str, data: dict[str, Any], **_kw: Any) -> None:
        seq = data.get(FLUSH_SEQ)
        if isinstance(seq, int):
            self.acked[client_id] = max(seq, self.acked.get(client_id, 0))
            self._event.set()

    def _pending(self, seq: int) -> list[str]:
        live = [c.id for c in self.runner.clients.all if c.state != STATE_MISSING]
        return [c for c in live if self.acked.get(c, 0) < seq]

    def __call__(self) -> tuple[int, bool]:
        live = [c.id for c in self.runner.clients.all if c.state != STATE_MISSING]
        if not live or self.closed:
            return 0, True
        self.seq += 1
        seq = self.seq
        try:
            self.runner.send_message(FLUSH_MESSAGE, {"seq": seq})
        except Exception as e:  # the master's socket is gone: the sample is not in step
            log.warning("stats flush %d not sent: %s", seq, e)
            return 0, False
        deadline = time.monotonic() + self.timeout_s
        while self._pending(seq):
            self._event.clear()
            if not self._pending(seq):
                break
            left = deadline - time.monotonic()
            if left <= 0 or not self._event.wait(left):
                break
        pending = self._pending(seq)
        if pending:
            log.warning("stats flush %d: no answer from worker(s) %s", seq, ", ".join(pending))
        return len(live) - len(pending), not pending


@events.init.add_listener
def _distributed(environment: Any, runner: Any = None, **_kwargs: Any) -> None:
    """Wire the stats flush: the master listens for tagged reports (registered here, after
    the runner's own listener that sums the report into its stats), a worker answers the
    master's flush request with an immediate report."""
    if isinstance(runner, MasterRunner):
        flush = StatsFlush(runner)
        _state["flush"] = flush
        environment.events.worker_report.add_listener(flush.on_report)
        _state["ledgers"] = 0

        def merge_ledger(environment: Any, msg: Any, **_kw: Any) -> None:
            LEDGER.merge(msg.data)
            _state["ledgers"] += 1

        runner.register_message(LEDGER_MESSAGE, merge_ledger)
    elif isinstance(runner, WorkerRunner):

        def flush_now(environment: Any, msg: Any, **_kw: Any) -> None:
            _state["flush_seq"] = int(msg.data["seq"])
            runner._send_stats()  # what the worker's 3-s reporter calls, now

        runner.register_message(FLUSH_MESSAGE, flush_now)


@events.report_to_master.add_listener
def _tag_report(client_id: str, data: dict[str, Any], **_kwargs: Any) -> None:
    if "flush_seq" in _state:
        data[FLUSH_SEQ] = _state["flush_seq"]


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
        "--min-ttl-s",
        type=float,
        default=60.0,
        env_var="LOCUST_MIN_TTL_S",
        help="the service's CTX_WM_MIN_TTL_S (the floor of a step output's TTL), for the "
        "step-output expirations the plan predicts (reported next to the expired keys)",
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
    LEDGER.clear()
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        # A worker holds a shape instance too (never ticked, its clock started when the
        # locustfile was loaded): restart it with the test, so the users' run time (pacing,
        # the initial spawn's random phase) matches the master's.
        if environment.shape_class is not None:
            environment.shape_class.reset_time()
        return
    if runner is None or "sampler" in _state:
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
        sync=_state.get("flush"),
    )
    _state["sampler"] = sampler
    _state["greenlet"] = gevent.spawn(sampler.run)
    # the premature-expiration gate's server side: Redis keyspace notifications
    _state["watches"] = watch_redis(opts.redis_url) if opts.redis_url else []
    _state["watch_from"] = time.time()


@events.test_stop.add_listener
def _send_ledger(environment: Any, **_kwargs: Any) -> None:
    """A worker hands its session ledger to the master (before its ``client_stopped``)."""
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        try:
            runner.send_message(LEDGER_MESSAGE, LEDGER.to_wire())
        except Exception as e:  # the master is gone: its verdict lacks this worker's sessions
            log.warning("session ledger not sent to the master: %s", e)


def _expiry(opts: Any, run_plan: Any) -> Any:
    """Stop the expiry watches and classify what they saw against the session ledger."""
    watches = _state.get("watches", [])
    for w in watches:
        w.stop()
    events_seen = sorted(e for w in watches for e in w.events)
    watched = bool(watches) and all(w.subscribed for w in watches)
    report = classify(events_seen, LEDGER.sessions, watched=watched)
    period = run_plan.mean_step_period()
    step_ttl = max(opts.min_ttl_s, float(math.ceil(2.0 * period)))
    until = max((t for t, _ in events_seen), default=time.time())
    extra = {
        "watch_gaps": sum(w.gaps for w in watches),
        "watch_errors": [w.error for w in watches if w.error],
        "ledgers_from_workers": _state.get("ledgers"),
        "step_ttl_s": step_ttl,
        "predicted_step_keys_expired": predicted_step_expirations(
            LEDGER.sessions, step_ttl_s=step_ttl, until=until
        ),
        "profile_abandon_share": run_plan.profile.abandon_share,
    }
    return report, extra


@events.quitting.add_listener
def _verdict(environment: Any, **_kwargs: Any) -> None:
    sampler: Sampler | None = _state.get("sampler")
    if sampler is None:
        return
    if "flush" in _state:  # the master quit before this listener (quitting fires in reverse)
        _state["flush"].closed = True
    sampler.stop()
    if "greenlet" in _state:
        _state["greenlet"].kill(block=False)
    opts = environment.parsed_options
    expected = EXPECTED_BREACHES.get(opts.fault, frozenset())
    run_plan = plan_from_options(opts)
    expiry, expiry_extra = _expiry(opts, run_plan)
    verdict = evaluate(
        sampler.samples,
        expected_breaches=expected,
        baseline=sampler.baseline,
        run_s=run_plan.duration_s,
        ttl_factor=opts.ttl_factor,
        expiry=expiry,
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
                "locust_workers": sampler.max_workers,  # 0: one process
            },
            verdict=verdict.to_dict(),
            expiry={**expiry.to_dict(), **expiry_extra},
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
    for r in verdict.figures:
        log.warning("reported %-17s %-26s achieved=%s %s", r.name, r.target, r.achieved, r.note)
    if verdict.passed:
        log.warning("SLO verdict: PASS (%d gates)", len(GATES))
    else:
        log.error("SLO verdict: FAIL; failed gates: %s", ", ".join(verdict.failed))
    environment.process_exit_code = 0 if verdict.passed else 1


if __name__ == "__main__":
    from locust import run_single_user

    run_single_user(ContextAgent)
