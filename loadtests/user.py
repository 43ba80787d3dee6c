"""A Locust user that plays one agent after another against the context service.

Each session: create, send the step plan (so step outputs get plan-derived TTLs), then N
steps of (tool result event -> context load -> step output), then close. N and the think
time come from the run plan (:mod:`loadtests.shapes`), so a compressed 24-hour profile keeps
its proportions. Each user holds a constant step rate
(Locust's ``constant_throughput`` pacing, rate from the plan); the shape decides how many users run.

A share of sessions (``Profile.abandon_share``, drawn per session from the user's own RNG) is
*abandoned*: after its last step the agent just starts the next session, without ``DELETE``,
and the service's TTLs and idle sweep have to clean up. Where the profile asks for it
(``confirm_every``, long_sessions), every n-th step of a user also posts a user confirmation,
so the hot knowledge collection grows during the run.

Requests go over the agent's own keep-alive connection (:mod:`loadtests.http_client`, a
lean HTTP/1.1 client: the generator shares the service's cores) and are reported to Locust's
statistics through its ``request`` event, as its own clients report them: response time from
the send to the last byte of the body, and a failure for a transport error, a status outside
the expected ones, or a logical failure (a 200 without a bundle, a bundle for the wrong step),
so the SLO error ratio sees them all.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
import msgspec
from locust import User, task
from locust.exception import CatchResponseError, StopTest

from loadtests.agent_steps import (
    DEVICES,
    INTENT_CYCLE,
    QUERIES,
    bundle_problem,
    context_body,
    create_body,
    event_body,
    output_body,
    plan_body,
    sensor_event,
)
from loadtests.http_client import (
    KeepAliveConnection,
    ProtocolError,
    Response,
    service_endpoint,
)
from loadtests.ledger import SessionLedger
from loadtests.shapes import RunPlan, plan

__all__ = ["LEDGER", "SHORT_TTL_PLAN_SCALE", "ContextAgent", "plan_from_options"]

_ENCODE = msgspec.json.Encoder().encode
_DECODE = msgspec.json.Decoder().decode

#: Users born within this many run seconds are the initial spawn (they get a random phase).
INITIAL_SPAWN_S = 2.0

_key_cycle: itertools.cycle[tuple[str, str]] | None = None
#: perf_counter() at test start, set by the locustfile on every runner (workers have no shape
#: of their own, so they read the run time from here).
RUN_STARTED: list[float] = []
_plans: dict[tuple[Any, ...], RunPlan] = {}
#: This process's sessions (:mod:`loadtests.ledger`): the premature-expiration gate's
#: client-side evidence. A worker sends it to the master at the end of the test.
LEDGER = SessionLedger()
#: The ``short-ttl`` drill: the agents' plans say each step starts this share of its real
#: period later (20 times too optimistic), so the service computes step-output TTLs that run
#: out before the dependent step (with ``CTX_WM_MIN_TTL_S=1``, see :mod:`loadtests.faults`).
SHORT_TTL_PLAN_SCALE = 0.05


def plan_from_options(opts: Any) -> RunPlan:
    """The run plan for Locust's parsed options (cached: every user asks)."""
    sig = (opts.ctx_profile, opts.duration_s, opts.time_scale, opts.rate_scale)
    if sig not in _plans:
        _plans[sig] = plan(
            opts.ctx_profile,
            time_scale=opts.time_scale or None,
            duration_s=opts.duration_s or None,
            rate_scale=opts.rate_scale,
        )
    return _plans[sig]


def _next_key(opts: Any) -> tuple[str, str]:
    """Agent id and raw API key, round robin over the keys file (``{agent: key}``)."""
    global _key_cycle
    if _key_cycle is None:
        path = Path(opts.keys_file)
        keys = json.loads(path.read_text(encoding="utf-8"))
        if not keys:
            raise RuntimeError(f"{path}: no API keys in the keys file")
        _key_cycle = itertools.cycle(sorted(keys.items()))
    return next(_key_cycle)


class ContextAgent(User):
    """One agent slot: runs sessions back to back."""

    connection_timeout = 5.0
    network_timeout = 10.0  # a hung service shows up as failures, never as a stuck run

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        try:
            host, port, self._prefix = service_endpoint(self.host)
        except ValueError as e:
            raise StopTest(str(e)) from None
        self.http = KeepAliveConnection(
            host,
            port,
            connection_timeout=self.connection_timeout,
            network_timeout=self.network_timeout,
        )

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        self.plan = plan_from_options(opts)
        self._t_born = time.perf_counter()
        self._backoff_s = 0.0  # Retry-After of the last shed answer, taken before the next step
        # A random phase within one step period: users start within the same second and then
        # hold the same period, so without it they stay in lock-step and the service sees
        # every user's step at the same instant (an N-deep burst per period, measured as tail
        # latency) rather than the steady stream of independently started agent sessions.
        # Only the users of the initial spawn wait (inside the warm-up, which no gate sees):
        # a user added later by a ramp is already out of step, and a delay would only be
        # requests the target asked for and the generator never sent.
        t = self._run_time()
        rate = self.plan.user_step_rate_at(t)
        self.rng = random.Random()  # every draw of this agent: phase, session, abandonment
        if rate > 0 and t < INITIAL_SPAWN_S:
            gevent.sleep(self.rng.uniform(0.0, min(1.0 / rate, 5.0)))
        self._t_task = time.perf_counter()
        self.agent_id, key = _next_key(opts)
        self._key_headers = f"X-API-Key: {key}\r\n".encode("latin-1")
        self._json_headers = self._key_headers + b"Content-Type: application/json\r\n"
        self.state: str | None = None  # sealed: sent back as it is
        self.state_step = 0  # the state's current step, from the answers' clear session info
        self.sid = ""
        self.steps_done = 0
        self.steps_total = 0  # over every session of this user: paces the confirmations
        self.abandon = False
        self.device = self.rng.choice(DEVICES)
        self.rms = 0.0

    def _run_time(self) -> float:
        shape = self.environment.shape_class
        if shape is not None and getattr(shape, "runner", None) is not None:
            return float(shape.get_run_time())
        return time.perf_counter() - (RUN_STARTED[0] if RUN_STARTED else self._t_born)

    def wait_time(self) -> float:
        """Locust's constant_throughput, with the rate read from the plan at the current run
        time: ``users x rate`` then equals the target even when users are rounded up."""
        rate = self.plan.user_step_rate_at(self._run_time())
        backoff, self._backoff_s = self._backoff_s, 0.0
        return max(backoff, 1.0 / rate - (time.perf_counter() - self._t_task))

    # --- the session -------------------------------------------------------------------------
    @task
    def step(self) -> None:
        self._t_task = time.perf_counter()
        if self.state is None and not self._create():
            return
        ok = self._one_step()
        self.steps_done += 1
        self.steps_total += 1
        every = self.plan.profile.confirm_every
        if ok and every > 0 and self.steps_total % every == 0:
            ok = self._confirm()
        if not ok or self.steps_done >= self.plan.steps_per_session:
            self._end_session()

    def on_stop(self) -> None:
        if self.state is not None:
            self._end_session()
        self.http.close()

    def _end_session(self) -> None:
        """Close the session, or, for an abandoned one, just stop using it (its keys are
        left to the service's TTLs and idle sweep)."""
        if self.abandon:
            LEDGER.ended(self.sid, "abandoned")
            self.state = None
        else:
            self._close()
            LEDGER.ended(self.sid, "closed")

    def _call(
        self,
        method: str,
        path: str,
        name: str,
        what: str,
        body: Any = None,
        *,
        ok: tuple[int, ...] = (200,),
        parse: bool = False,
        check: Callable[[Any], str | None] | None = None,
    ) -> Any:
        """One request, reported to Locust's statistics under ``name``: a transport error, a
        status outside ``ok``, or a body that ``check`` finds wrong (it returns the reason)
        is a failure and gives ``None``. Otherwise the parsed JSON body when ``parse`` or
        ``check`` asks for it, else ``True`` (the load generator parses only what it reads)."""
        # msgspec both ways: the generator shares the service's cores, and the stdlib JSON
        # (encode the state, parse the answer) was a good part of its CPU per request
        data: bytes | None = None if body is None else _ENCODE(body)
        headers = self._key_headers if body is None else self._json_headers
        start_time = time.time()
        if self.sid:
            LEDGER.sent(self.sid, start_time)
        t0 = time.perf_counter()
        resp: Response | None = None
        error: BaseException | None = None
        try:
            resp = self.http.request(method, self._prefix + path, data, headers)
        except (OSError, ProtocolError) as e:  # refused, reset, timed out, not HTTP
            error = e
        elapsed_ms = (time.perf_counter() - t0) * 1000.0
        result: Any = None
        if resp is not None:
            result, error = self._judge(resp, what, ok, parse, check)
        self.environment.events.request.fire(
            request_type=method,
            name=name,
            response_time=elapsed_ms,
            response_length=len(resp.body) if resp is not None else 0,
            response=resp,
            context={},
            exception=error,
            start_time=start_time,
            url=path,
        )
        return result

    def _judge(
        self,
        resp: Response,
        what: str,
        ok: tuple[int, ...],
        parse: bool,
        check: Callable[[Any], str | None] | None,
    ) -> tuple[Any, BaseException | None]:
        """(result, failure) of an answer that arrived."""
        if resp.status not in ok:
            if resp.status == 409 and what.startswith("context"):
                self._note_miss(resp)
            retry = resp.header("retry-after") if resp.status in (429, 503) else None
            if retry and retry.isdigit():
                # shed by the service: a failure all the same, and the agent backs off as
                # told before its next step, the way a well-behaved client does
                self._backoff_s = max(self._backoff_s, float(retry))
                return None, CatchResponseError(
                    f"{what}: HTTP {resp.status} shed (Retry-After {retry} s)"
                )
            return None, CatchResponseError(f"{what}: HTTP {resp.status}")
        if not (parse or check):
            return True, None
        try:
            data = _DECODE(resp.body)
        except msgspec.DecodeError as e:
            return None, CatchResponseError(f"{what}: the answer is not JSON ({e})")
        problem = check(data) if check is not None else None
        if problem:
            return None, CatchResponseError(f"{what}: {problem}")
        return data, None

    def _note_miss(self, resp: Response) -> None:
        """A ``context_miss`` naming one of this session's step outputs is a *lost read*: the
        session wrote that step (its event succeeded) and the read found it gone."""
        try:
            doc = _DECODE(resp.body)
        except msgspec.DecodeError:
            return
        if not isinstance(doc, dict) or doc.get("error") != "context_miss":
            return
        key = str(doc.get("key", ""))
        prefix = f"wm:{{{self.sid}}}:step:"
        if key.startswith(prefix) and key[len(prefix) :].isdigit():
            step = int(key[len(prefix) :])
            rec = LEDGER.sessions.get(self.sid)
            if rec is not None and step in rec.written:
                LEDGER.lost_read(self.sid, key)

    def _create(self) -> bool:
        self.sid = f"lt-{self.rng.getrandbits(64):016x}"
        LEDGER.opened(self.sid, time.time())
        self.device = self.rng.choice(DEVICES)
        self.abandon = self.rng.random() < self.plan.profile.abandon_share
        user = f"user-{self.rng.randint(1, 500)}"
        body = create_body(self.sid, user, self.rng.choice(QUERIES), self.device)
        created = self._call(
            "POST", "/v1/sessions", "/v1/sessions", "create", body, ok=(201,), parse=True
        )
        if created is None:
            return False
        self.state, self.state_step = created["state"], int(created["session"]["step"])
        self.steps_done = 0
        return self._send_plan()

    def session_plan(self) -> dict[str, Any]:
        """The step plan (:func:`loadtests.agent_steps.plan_body`) at the current step rate."""
        rate = self.plan.user_step_rate_at(self._run_time())
        if getattr(self.environment.parsed_options, "fault", "none") == "short-ttl":
            rate /= SHORT_TTL_PLAN_SCALE  # a plan 20 times too optimistic
        return plan_body(int(self.plan.steps_per_session), rate)

    def _send_plan(self) -> bool:
        path, name = f"/v1/sessions/{self.sid}/plan", "/v1/sessions/{id}/plan"
        return self._call("PUT", path, name, "plan", self.session_plan()) is not None

    def _one_step(self) -> bool:
        assert self.state is not None
        rms = round(self.rng.uniform(2.0, 8.0), 2)
        self.rms = rms
        event = sensor_event(self.device, rms, time.time())
        step_no = self.state_step  # the event writes step:<step_no>
        LEDGER.step_started(self.sid, step_no, time.time())
        done = self._call(
            "POST",
            f"/v1/sessions/{self.sid}/events",
            "/v1/sessions/{id}/events",
            "event",
            event_body(self.state, event),
            parse=True,
        )
        if done is None:
            return False
        LEDGER.wrote(self.sid, step_no)
        self.state, self.state_step = done["state"], int(done["session"]["step"])

        intent = INTENT_CYCLE[self.steps_done % len(INTENT_CYCLE)]
        body = context_body(self.sid, intent, self.state, self.device)
        step = self.state_step
        bundle = self._call(
            "POST",
            "/v1/context",
            "/v1/context",
            f"context {intent}",
            body,
            check=lambda b: bundle_problem(b, step),
        )
        if bundle is None:
            return False
        out = output_body(self.state, bundle["trace_id"], intent, self.device, rms)
        path, name = f"/v1/sessions/{self.sid}/outputs", "/v1/sessions/{id}/outputs"
        return self._call("POST", path, name, "output", out) is not None

    def _confirm(self) -> bool:
        """The user confirms an answer: it goes to hot knowledge (a new point each time, the
        text differs), so the hot collection grows with the run."""
        assert self.state is not None
        n = self.rng.getrandbits(32)
        answer = {
            "text": f"Confirmed for {self.device}: vibration RMS {self.rms} mm/s is within "
            f"limits after the bearing and coupling check (field note {n}).",
            "section": self.device.split("-")[0],
            "title": "Vibration check confirmed by the operator",
        }
        path = f"/v1/sessions/{self.sid}/confirmations"
        name = "/v1/sessions/{id}/confirmations"
        body = {"state": self.state, "answers": [answer]}
        return self._call("POST", path, name, "confirmation", body, ok=(201,)) is not None

    def _close(self) -> None:
        # 404: Redis lost the session (fault drills)
        path, name = f"/v1/sessions/{self.sid}", "/v1/sessions/{id}"
        self._call("DELETE", path, name, "close", ok=(200, 404))
        self.state = None
