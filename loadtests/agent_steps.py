"""What one simulated agent sends: the request bodies of a load-campaign session.

A session is create -> plan -> N x (tool-result event -> context load -> step output) ->
close. The Locust user (:mod:`loadtests.user`), the capacity benchmark
(``benchmarks/service_capacity.py``) and the campaign's warm-up (:func:`warm_up`) build their
requests from these functions, so all three measure the same traffic. Nothing here imports
Locust: importing it monkey-patches the whole process for gevent.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from loadtests.faults import _http

__all__ = [
    "DEVICES",
    "INTENT_CYCLE",
    "QUERIES",
    "WarmUp",
    "bundle_problem",
    "context_body",
    "create_body",
    "event_body",
    "output_body",
    "plan_body",
    "sensor_event",
    "warm_up",
]

#: The step intents a session walks through, in order (then again from the top).
INTENT_CYCLE = (
    "compare_vibration",
    "generate_report",
    "call_api",
    "fetch_sensor_data",
    "default",
)
DEVICES = ("PUMP-0042", "PUMP-0107", "FAN-0003", "COMP-0011")
QUERIES = (
    "Pump vibration above alarm limit, what should I check?",
    "Fan bearing temperature rising after maintenance",
    "Compressor discharge pressure trips the unit",
    "Write the maintenance report for the vibration check",
)


def create_body(sid: str, user_id: str, query: str, device: str) -> dict[str, Any]:
    return {"session_id": sid, "user_id": user_id, "user_query": query, "device_id": device}


def plan_body(steps: int, step_rate: float) -> dict[str, Any]:
    """The step dependency plan an agent states up front: step n+1 reads step n's output and
    starts one step period later (the service's step keys are the step numbers)."""
    period = 1.0 / step_rate if step_rate > 0 else 1.0
    return {
        "steps": [
            {
                "step_id": str(i),
                "depends_on": [str(i - 1)] if i > 0 else [],
                "est_start_s": round(i * period, 3),
            }
            for i in range(max(1, int(steps)))
        ],
        "factor": 2.0,
    }


def sensor_event(device: str, rms: float, now: float) -> dict[str, Any]:
    """A ``read_sensor`` tool result with a two-point vibration series."""
    return {
        "type": "tool_call",
        "name": "read_sensor",
        "args": {"device": device, "window_s": 60},
        "result": {"device": device, "rms_mm_s": rms, "status": "running"},
        "series": {f"{device}.vibration": [[now - 1.0, rms * 0.97], [now, rms]]},
    }


def event_body(state: str, event: dict[str, Any]) -> dict[str, Any]:
    """``state``: the sealed state of the last answer, sent back as it is."""
    return {"state": state, "event": event}


def context_body(sid: str, intent: str, state: str, device: str) -> dict[str, Any]:
    """The context load of one step (``call_api`` names the API it is about to call)."""
    params: dict[str, Any] = {"device": device}
    if intent == "call_api":
        params.update(endpoint="read_sensor", api_params={"device": device, "window_s": 60})
    return {"session_id": sid, "step_intent": intent, "state": state, "params": params}


def output_body(state: str, trace_id: str, intent: str, device: str, rms: float) -> dict[str, Any]:
    return {"state": state, "trace_id": trace_id, "output": f"{intent}: {device} RMS {rms} mm/s"}


def bundle_problem(bundle: Any, step: int) -> str | None:
    """Why a 200 answer to a context load is still wrong, or None."""
    if not isinstance(bundle, dict) or bundle.get("step") != step or not bundle.get("fragments"):
        return "bundle for the wrong step or empty"
    return None


# --- the campaign's warm-up ------------------------------------------------------------------


@dataclass(frozen=True)
class WarmUp:
    """What :func:`warm_up` sent: request count, wall seconds, and the slowest context load."""

    sessions: int
    requests: int
    seconds: float
    context_max_ms: float

    def note(self) -> str:
        return (
            f"warm-up before the load: {self.sessions} sessions ({self.requests} requests, "
            f"{self.seconds:.1f} s, slowest context load {self.context_max_ms:.0f} ms), one per "
            "device walking every intent, then closed; not in Locust's statistics. It fills "
            "the query-embedding cache of the profile's few query texts, as a running "
            "deployment has it (--no-warm-up measures a cold start)"
        )


def warm_up(service_url: str, key: str, *, timeout_s: float = 30.0) -> WarmUp:
    """One closed session per device, each walking :data:`INTENT_CYCLE` once, before a
    campaign's load starts.

    A freshly started service has an empty query-embedding cache: the first context load of
    each of the profile's few query texts runs the encoder (tens of ms on shared cores), and
    in a short low-rate run those few cold loads are the context p99. A deployment that has
    served traffic has them cached; this is that state. Raises ``RuntimeError`` naming the
    request on no answer or an answer outside the expected status (a service that cannot
    serve one session would fail the campaign anyway, with less to go on).
    """
    base = service_url.rstrip("/")
    t0 = time.perf_counter()
    n = 0
    worst = 0.0

    def call(method: str, path: str, body: dict[str, Any] | None, ok: int = 200) -> Any:
        nonlocal n
        n += 1
        status, doc, _ = _http(method, base + path, body, key, timeout_s)
        if status == 0:
            raise RuntimeError(f"warm-up {method} {path}: no answer (refused or timed out)")
        if status != ok:
            raise RuntimeError(f"warm-up {method} {path}: HTTP {status} {str(doc)[:300]}")
        return doc

    for i, device in enumerate(DEVICES):
        sid = f"warmup-{uuid.uuid4().hex[:16]}"
        query = QUERIES[i % len(QUERIES)]
        state = call("POST", "/v1/sessions", create_body(sid, "warm-up", query, device), 201)[
            "state"
        ]
        call("PUT", f"/v1/sessions/{sid}/plan", plan_body(len(INTENT_CYCLE), 1.0))
        for intent in INTENT_CYCLE:
            rms = 4.0
            event = sensor_event(device, rms, time.time())
            done = call("POST", f"/v1/sessions/{sid}/events", event_body(state, event))
            state = done["state"]  # sealed: the step is in the answer's clear session info
            t = time.perf_counter()
            bundle = call("POST", "/v1/context", context_body(sid, intent, state, device))
            worst = max(worst, (time.perf_counter() - t) * 1000.0)
            problem = bundle_problem(bundle, done["session"]["step"])
            if problem:
                raise RuntimeError(f"warm-up context {intent}: {problem}: {str(bundle)[:300]}")
            out = output_body(state, bundle["trace_id"], intent, device, rms)
            call("POST", f"/v1/sessions/{sid}/outputs", out)
        call("DELETE", f"/v1/sessions/{sid}", None)
    return WarmUp(len(DEVICES), n, time.perf_counter() - t0, worst)
