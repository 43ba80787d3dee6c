"""Where the service runs its hot endpoints (context_app/service/execution.py), on a real
Redis and a real uvicorn.

* On the event loop (the default) the agent's whole sequence (create, plan, event, context,
  output, close) sends **no** synchronous Redis command from loop code: every round trip is
  awaited on the client's asynchronous twin, so a waiting request never blocks the loop.
* The round trips per endpoint are bounded (the counts the capacity work bought; a change that
  adds one fails here and says which endpoint and what it sends).
* Both modes answer the same sequence with the same shapes and the same stored state.
* A hung Redis gives a fast 503 and ``/healthz`` stays instant on threads too (the default
  mode is covered by tests/test_ops_hardening.py).
* A Redis Cluster runs on threads (it has no twin).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import RoundTrips, cleanup_keys, redis_client
from sealed_state import Held
from test_ops_hardening import context_body, private_redis, run_app, start_session, stuck_requests
from test_service import cleanup_service_keys, service_settings

#: Round trips per request on a single Redis (the agent's sequence of loadtests/user.py).
MAX_ROUND_TRIPS = {"create": 5, "plan": 3, "event": 3, "context": 1, "output": 1, "close": 4}


def _sequence(c: httpx.Client, rt: RoundTrips) -> dict[str, Any]:
    """One session of the load-test agent; per endpoint its response and round trips."""
    out: dict[str, Any] = {}

    def call(name: str, method: str, path: str, body: Any = None, ok: int = 200) -> Any:
        rt.clear()
        r = c.request(method, path, json=body)
        assert r.status_code == ok, f"{name}: {r.status_code} {r.text}"
        out[name] = {
            "json": r.json(),
            "sync": list(rt.trips),
            "loop": list(rt.loop_trips),
            "async": list(rt.async_trips),
        }
        return r.json()

    sid = f"t-{uuid.uuid4().hex[:12]}"
    state = Held.of(
        call(
            "create",
            "POST",
            "/v1/sessions",
            {"session_id": sid, "user_id": "u-1", "user_query": "pump", "device_id": "PUMP-0042"},
            201,
        )
    )
    call(
        "plan",
        "PUT",
        f"/v1/sessions/{sid}/plan",
        {"steps": [{"step_id": "0"}, {"step_id": "1", "depends_on": ["0"], "est_start_s": 1}]},
    )
    now = time.time()
    state = Held.of(
        call(
            "event",
            "POST",
            f"/v1/sessions/{sid}/events",
            {
                "state": state,
                "event": {
                    "type": "tool_call",
                    "name": "read_sensor",
                    "args": {"device": "PUMP-0042", "window_s": 60},
                    "result": {"device": "PUMP-0042", "rms_mm_s": 4.2, "status": "running"},
                    "series": {"PUMP-0042.vibration": [[now - 1, 4.0], [now, 4.2]]},
                },
            },
        )
    )
    bundle = call("context", "POST", "/v1/context", context_body(state, "compare_vibration"))
    call(
        "output",
        "POST",
        f"/v1/sessions/{sid}/outputs",
        {"state": state, "trace_id": bundle["trace_id"], "output": "RMS 4.2 mm/s"},
    )
    call("close", "DELETE", f"/v1/sessions/{sid}")
    out["sid"] = sid
    return out


@pytest.fixture(scope="module")
def services(
    tmp_path_factory: pytest.TempPathFactory, default_redis_url: str
) -> Iterator[dict[str, tuple[str, Any, dict[str, str]]]]:
    """The same service twice on one Redis: on the loop, and on threads."""
    running: dict[str, tuple[str, Any, dict[str, str]]] = {}
    stack = []
    try:
        for mode in ("loop", "threads"):
            settings, raw = service_settings(
                tmp_path_factory.mktemp(mode), default_redis_url, service_execution=mode
            )
            cm = run_app(settings)
            url, app = cm.__enter__()
            stack.append(cm)
            running[mode] = (url, app, raw)
        yield running
    finally:
        for cm in reversed(stack):
            cm.__exit__(None, None, None)
        cleanup_service_keys(default_redis_url)
        cleanup_keys(default_redis_url, "ctx:activity")


def _client(entry: tuple[str, Any, dict[str, str]]) -> httpx.Client:
    url, _app, raw = entry
    return httpx.Client(base_url=url, headers={"X-API-Key": raw["agent-a"]}, timeout=30)


def _warm_sequence(
    services: dict[str, tuple[str, Any, dict[str, str]]], mode: str
) -> dict[str, Any]:
    """The agent's sequence on the ``mode`` service, counted the second time (the first
    loads the scripts, fills the pools and runs the ACL sync)."""
    _url, app, _ = services[mode]
    assert app.state.services.on_loop is (mode == "loop")
    with _client(services[mode]) as c, RoundTrips() as rt:
        _sequence(c, rt)
        return _sequence(c, rt)


def test_on_the_loop_no_endpoint_blocks_on_redis_and_round_trips_are_bounded(
    services: dict[str, tuple[str, Any, dict[str, str]]],
) -> None:
    seen = _warm_sequence(services, "loop")
    for name, limit in MAX_ROUND_TRIPS.items():
        got = seen[name]
        assert got["loop"] == [], f"{name} blocked the event loop on Redis: {got['loop']}"
        assert 1 <= len(got["async"]) <= limit, (
            f"{name}: {len(got['async'])} round trips (at most {limit}): {got['async']}"
        )


def test_threads_mode_sends_the_same_round_trips_synchronously(
    services: dict[str, tuple[str, Any, dict[str, str]]],
) -> None:
    seen = _warm_sequence(services, "threads")
    for name, limit in MAX_ROUND_TRIPS.items():
        got = seen[name]
        assert got["async"] == [] and got["loop"] == [], name
        own = [t for t in got["sync"] if t]  # the L3 thread's embedding cache reads included
        assert 1 <= len(own) <= limit + 2, f"{name}: {own}"


def test_both_modes_answer_the_same(services: dict[str, tuple[str, Any, dict[str, str]]]) -> None:
    answers = {}
    for mode in ("loop", "threads"):
        with _client(services[mode]) as c, RoundTrips() as rt:
            answers[mode] = _sequence(c, rt)

    def shape(doc: Any) -> Any:  # keys and value types, not ids, times or nonces
        if isinstance(doc, dict):
            return {k: shape(v) for k, v in sorted(doc.items())}
        if isinstance(doc, list):
            return [shape(v) for v in doc]
        return type(doc).__name__

    for name in MAX_ROUND_TRIPS:
        assert shape(answers["loop"][name]["json"]) == shape(answers["threads"][name]["json"]), name
    loop_ctx, thr_ctx = answers["loop"]["context"]["json"], answers["threads"]["context"]["json"]
    assert [f["layer"] for f in loop_ctx["fragments"]] == [f["layer"] for f in thr_ctx["fragments"]]
    assert answers["loop"]["event"]["json"]["info"]["event"] == "tool_call"


def test_hung_redis_on_threads_still_gives_fast_503s_and_an_instant_healthz(
    tmp_path: Path,
) -> None:
    with private_redis(tmp_path / "redis") as server:
        settings, raw = service_settings(tmp_path, server.url, service_execution="threads")
        with run_app(settings) as (url, app):
            assert app.state.services.on_loop is False
            with httpx.Client(base_url=url, headers={"X-API-Key": raw["agent-a"]}, timeout=30) as c:
                body = context_body(start_session(c))
                server.pause()
                try:
                    t0 = time.perf_counter()
                    r = c.post("/v1/context", json=body)
                    took = time.perf_counter() - t0
                    assert r.status_code == 503 and r.json()["backend"] == "redis", r.text
                    assert took < 1.0, f"503 after {took:.2f} s"
                    with stuck_requests(url, raw["agent-a"], body, 8):
                        time.sleep(0.2)
                        lat = []
                        for _ in range(10):
                            t0 = time.perf_counter()
                            assert c.get("/healthz").status_code == 200
                            lat.append(time.perf_counter() - t0)
                finally:
                    server.resume()
    lat.sort()
    assert lat[-2] < 0.1 and lat[-1] < 0.5, f"/healthz took {lat[-3:]} s"


def test_a_cluster_runs_on_threads(tmp_path: Path, cluster_redis_url: str) -> None:
    settings, raw = service_settings(tmp_path, cluster_redis_url)
    assert settings.service_execution == "loop"  # asked for, not possible on a cluster
    with run_app(settings) as (url, app):
        assert app.state.services.on_loop is False
        with httpx.Client(base_url=url, headers={"X-API-Key": raw["agent-a"]}, timeout=30) as c:
            state = start_session(c)
            assert c.post("/v1/context", json=context_body(state)).status_code == 200
    cleanup_service_keys(cluster_redis_url)


def test_a_refused_request_touches_nothing_of_the_session(
    services: dict[str, tuple[str, Any, dict[str, str]]], default_redis_url: str
) -> None:
    """The owner check rides on the route's (and the output's) round trip; the activity touch
    in it is guarded by the owner record, so another agent holding a leaked state gets the
    usual 404 and the session's activity stays as the owner left it."""
    url, _app, raw = services["loop"]
    r = redis_client(default_redis_url, decode_responses=True)
    with (
        _client(services["loop"]) as a,
        httpx.Client(base_url=url, headers={"X-API-Key": raw["agent-b"]}, timeout=30) as b,
    ):
        state = start_session(a)
        sid = state.sid
        before = r.zscore("ctx:activity", sid)
        assert before is not None
        time.sleep(0.05)
        got = b.post("/v1/context", json=context_body(state))
        assert got.status_code == 404, got.text
        out = b.post(
            f"/v1/sessions/{sid}/outputs",
            json={"state": state, "trace_id": "t-" + "0" * 30, "output": "x"},
        )
        assert out.status_code == 404, out.text
        assert r.zscore("ctx:activity", sid) == before  # untouched
        assert a.post("/v1/context", json=context_body(state)).status_code == 200
        assert r.zscore("ctx:activity", sid) > before  # the owner's request touches it
    r.close()
