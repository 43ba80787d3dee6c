"""Issue 10, "Service and gateway hardening": every fix over a real HTTP connection.

The real app (uvicorn on a free loopback port), the real Redis (DB 13) or embedded Valkey,
Qdrant Edge on a temp dir and the real encoder, as in ``test_service.py``. Two services: one
with the default limits (and a body limit big enough for the hostile bodies), one with tight
limits so the caps and quotas are reached quickly.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_lib
from conftest import cleanup_keys
from sealed_state import keyring_of, opened
from test_service import _start, _tool, running_service

import context_core.errors as errors_mod
from context_core.access.auth import generate_keys
from context_core.config import get_settings
from context_core.errors import ContextError, PayloadTooLargeError


def _service(tmp: Path, redis_url: str, agents: tuple[str, ...], **limits: Any) -> Any:
    digests, raws = generate_keys(tmp / "keys", agents)
    settings = get_settings(
        data_dir=tmp / "ctx",
        reports_dir=tmp / "reports",
        redis_url=redis_url,
        api_keys_file=digests,
        l3_timeout_ms=5000,
        **limits,
    )
    return settings, json.loads(raws.read_text())


@pytest.fixture(scope="module")
def hard(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[dict[str, Any]]:
    """Default limits; a 512 KB body limit so 216 KB results and 200 KB hostile bodies arrive."""
    tmp = tmp_path_factory.mktemp("hard")
    agents = (f"ha-{uuid.uuid4().hex[:8]}", f"hb-{uuid.uuid4().hex[:8]}")
    settings, keys = _service(tmp, redis_url, agents, max_body_bytes=512 * 1024)
    with running_service(settings) as url:
        yield {"url": url, "keys": keys, "a": agents[0], "b": agents[1], "settings": settings}
    cleanup_keys(redis_url, "svc:{t-*")
    cleanup_keys(redis_url, "wm:{t-*")
    for agent in agents:
        cleanup_keys(redis_url, f"svc:agent:{{{agent}}}:*")


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[dict[str, Any]]:
    """Small caps: 8 KB states, 4 KB step results, 3 live sessions, 100 KB per minute."""
    tmp = tmp_path_factory.mktemp("tight")
    names = ("general", "sessions", "bytes")
    agents = tuple(f"t{n[0]}-{uuid.uuid4().hex[:8]}" for n in names)
    settings, keys = _service(
        tmp,
        redis_url,
        agents,
        max_body_bytes=128 * 1024,
        l1_max_result_bytes=20_000,
        l1_max_state_bytes=8192,
        max_step_result_bytes=4096,
        max_live_sessions_per_agent=3,
        max_write_bytes_per_agent_per_min=100_000,
    )
    with running_service(settings) as url:
        yield {"url": url, "keys": keys, **dict(zip(names, agents, strict=True))}
    cleanup_keys(redis_url, "svc:{t-*")
    cleanup_keys(redis_url, "wm:{t-*")
    for agent in agents:
        cleanup_keys(redis_url, f"svc:agent:{{{agent}}}:*")


def _client(env: dict[str, Any], agent: str) -> httpx.Client:
    return httpx.Client(base_url=env["url"], headers={"X-API-Key": env["keys"][agent]}, timeout=60)


@pytest.fixture
def ca(hard: dict[str, Any]) -> Iterator[httpx.Client]:
    with _client(hard, hard["a"]) as c:
        yield c


@pytest.fixture
def cb(hard: dict[str, Any]) -> Iterator[httpx.Client]:
    with _client(hard, hard["b"]) as c:
        yield c


def _raw_event(c: httpx.Client, sid: str, state: Any, event_json: str) -> httpx.Response:
    body = f'{{"state": {json.dumps(state)}, "event": {event_json}}}'
    return c.post(
        f"/v1/sessions/{sid}/events",
        content=body.encode(),
        headers={"Content-Type": "application/json"},
    )


def _ctx(c: httpx.Client, sid: str, state: Any, intent: str = "default") -> httpx.Response:
    return c.post("/v1/context", json={"session_id": sid, "step_intent": intent, "state": state})


def _post_json(c: httpx.Client, path: str, raw: bytes | str) -> httpx.Response:
    data = raw.encode() if isinstance(raw, str) else raw
    return c.post(path, content=data, headers={"Content-Type": "application/json"})


def _one_error(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_request"
    (err,) = r.json()["detail"]
    return dict(err)


def _still_serves(c: httpx.Client, sid: str, state: Any) -> None:
    """The same connection still answers (no reset) and the session is intact."""
    r = _ctx(c, sid, state)
    assert r.status_code == 200, r.text


# --- A: hostile input is a 422 naming the field -------------------------------------------------


def test_lone_surrogate_is_422_naming_the_field(ca: httpx.Client, session_id: str) -> None:
    state = _start(ca, session_id)["state"]
    r = _raw_event(ca, session_id, state, '{"type":"tool_call","name":"t","result":"\\ud800"}')
    err = _one_error(r)
    assert err["field"] == "event.tool_call.result" and err["type"] == "string_surrogate"
    assert "\ud800" not in r.text and "\\ud800" not in r.text  # the input is never echoed
    r = _raw_event(
        ca, session_id, state, '{"type":"tool_call","name":"t","result":{"k":["ok","x\\udfff"]}}'
    )
    assert _one_error(r)["msg"].startswith("a string at $.k[1] holds a lone UTF-16 surrogate")
    r = ca.post(
        "/v1/sessions",
        content=b'{"user_id": "u", "user_query": "hi \\ud83d"}',
        headers={"Content-Type": "application/json"},
    )
    assert _one_error(r)["field"] == "user_query"
    _still_serves(ca, session_id, state)


def test_nesting_250_deep_is_422_naming_the_field(ca: httpx.Client, session_id: str) -> None:
    state = _start(ca, session_id)["state"]
    deep = "[" * 250 + "]" * 250
    tool = '{"type":"tool_call","name":"t",'
    err = _one_error(_raw_event(ca, session_id, state, f'{tool}"result":{deep}}}'))
    assert err["loc"] == ["body", "event", "result"] and err["type"] == "json_too_deep"
    assert err["limit"] == 40
    r = ca.post(
        "/v1/sessions",
        content=f'{{"user_id":"u","user_query":"q","contract":{{"spec":{deep}}}}}'.encode(),
        headers={"Content-Type": "application/json"},
    )
    assert _one_error(r)["loc"] == ["body", "contract", "spec"]
    # deeper than a free-form field may be, though within the body's bracket budget: pydantic
    # names the field and the inner path
    mid = "[" * 35 + "]" * 35
    err = _one_error(_raw_event(ca, session_id, state, f'{tool}"result":{mid}}}'))
    assert err["field"] == "event.tool_call.result" and err["limit"] == 32
    err = _one_error(_raw_event(ca, session_id, state, f'{tool}"args":{{"a":{mid}}},"result":1}}'))
    assert err["field"] == "event.tool_call.args" and "$.a[0]" in err["msg"]
    _still_serves(ca, session_id, state)


def test_a_string_holding_deep_json_is_422(ca: httpx.Client, session_id: str) -> None:
    state = _start(ca, session_id)["state"]
    brackets = "[" * 3000 + "]" * 3000
    event = {"type": "tool_call", "name": "t", "args": {}, "result": brackets}
    r = ca.post(f"/v1/sessions/{session_id}/events", json={"state": state, "event": event})
    err = _one_error(r)
    assert err["field"] == "event.tool_call.result" and err["type"] == "json_too_deep"
    assert err["limit"] == 32
    # JSON inside a JSON string inside the result: the gateway would parse both, so do we
    event["result"] = {"note": json.dumps({"inner": json.dumps([[[[1]]]] * 2)})}
    r = ca.post(f"/v1/sessions/{session_id}/events", json={"state": state, "event": event})
    assert r.status_code == 200, r.text
    _still_serves(ca, session_id, r.json()["state"])


def test_values_at_the_limits_pass_and_their_state_keeps_working(
    ca: httpx.Client, session_id: str
) -> None:
    """What the wire accepts, L1 carries and accepts back on the next request."""
    state = _start(ca, session_id)["state"]
    at_limit = json.loads("[" * 32 + "]" * 32)
    in_string = {"s": "[" * 31 + "]" * 31}  # 1 (the object) + 31 (the JSON in the string)
    for result in (at_limit, in_string, {"q": "pw=" + "x" * 7990}):
        state = _tool(ca, session_id, state, type="tool_call", name="t", result=result)["state"]
    over = {"s": "[" * 32 + "]" * 32}
    event = {"type": "tool_call", "name": "t", "result": over}
    r = ca.post(f"/v1/sessions/{session_id}/events", json={"state": state, "event": event})
    assert _one_error(r)["msg"].startswith("a string holding JSON nested 33 levels deep at $.s")
    long_query = "call 13812341234, password=" + "p" * 7970  # cleaned before it enters L1
    body = {"session_id": f"{session_id}-q", "user_id": "u", "user_query": long_query}
    r = ca.post("/v1/sessions", json=body)
    assert r.status_code == 201, r.text
    _still_serves(ca, f"{session_id}-q", r.json()["state"])
    _still_serves(ca, session_id, state)


def test_100k_deep_body_is_422_or_413_never_500(
    ca: httpx.Client, session_id: str, hard: dict[str, Any]
) -> None:
    """Python's json recurses: 100,000 nested arrays (200 KB) used to reach it and fail with a
    RecursionError (400/500, reset connections). Now the body guard answers first."""
    state = _start(ca, session_id)["state"]
    deep = "[" * 100_000 + "]" * 100_000
    for body in (deep, f'{{"state": {json.dumps(state)}, "event": {{"result": {deep}}}}}'):
        t0 = time.perf_counter()
        r = ca.post(
            f"/v1/sessions/{session_id}/events",
            content=body.encode(),
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["type"] == "json_too_deep"
        assert time.perf_counter() - t0 < 5
    # over the body limit: 413 before anything is parsed
    limit = hard["settings"].max_body_bytes
    huge = "[" * limit + "]" * limit
    r = ca.post("/v1/sessions", content=huge.encode(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    r = _post_json(ca, "/v1/sessions", b'{"user_id": "\xff"}')
    assert _one_error(r)["type"] == "json_invalid" and "UTF-8" in r.json()["detail"][0]["msg"]
    _still_serves(ca, session_id, state)


def test_api_params_and_param_types_are_checked(ca: httpx.Client, session_id: str) -> None:
    state = _start(ca, session_id)["state"]

    def ctx(params: Any) -> httpx.Response:
        body = {"session_id": session_id, "step_intent": "call_api", "state": state}
        return ca.post("/v1/context", json={**body, "params": params})

    for bad in ([1, 2], "x", 5):
        err = _one_error(ctx({"endpoint": "read_sensor", "api_params": bad}))
        assert err["field"] == "params.api_params" and err["expected"] == "object"
    err = _one_error(ctx({"query": 5}))
    assert err["field"] == "params.query" and err["expected"] == "string"
    err = _one_error(ctx({"device": ["PUMP"]}))
    assert err["field"] == "params.device"
    err = _one_error(ctx({"whatever": {"nested": 1}}))
    assert err["field"] == "params.whatever" and err["type"] == "scalar_type"
    err = _one_error(ctx([1]))
    assert err["field"] == "params"
    r = ctx({"endpoint": "read_sensor", "api_params": {"device": "P-1"}, "custom": 3})
    assert r.status_code == 200, r.text
    # wrong types in events are 422 too (they used to reach the lifecycle and come back 409)
    for event, field in (
        ({"type": "tool_call", "name": 5, "result": 1}, "event.tool_call.name"),
        ({"type": "tool_call", "name": "t", "args": [1], "result": 1}, "event.tool_call.args"),
        ({"type": "context_overflow", "keep_pairs": "x"}, "event.context_overflow.keep_pairs"),
        ({"type": "user_correction", "fields": "goal"}, "event.user_correction.fields"),
        (
            {"type": "goal_achieved", "answers": [{"text": ""}]},
            "event.goal_achieved.answers.0.text",
        ),
        (
            {"type": "tool_call", "name": "t", "result": 1, "series": {"a:b": [[1, 2]]}},
            "event.tool_call.series.a:b.[key]",
        ),
    ):
        r = ca.post(f"/v1/sessions/{session_id}/events", json={"state": state, "event": event})
        assert _one_error(r)["field"] == field, r.text


def test_tool_call_without_result_is_422_naming_it(ca: httpx.Client, session_id: str) -> None:
    state = _start(ca, session_id)["state"]
    event: dict[str, Any] = {"type": "tool_call", "name": "t", "args": {}}
    r = ca.post(f"/v1/sessions/{session_id}/events", json={"state": state, "event": event})
    err = _one_error(r)  # was 409 state_conflict
    assert err["loc"] == ["body", "event", "tool_call", "result"] and err["type"] == "missing"
    r = ca.post(
        f"/v1/sessions/{session_id}/events",
        json={"state": state, "event": {**event, "result": None}},
    )
    assert r.status_code == 200, r.text  # an explicit null is a result


def test_session_id_outside_the_pattern_is_422_with_the_pattern(ca: httpx.Client) -> None:
    r = ca.post("/v1/sessions", json={"session_id": "a:b", "user_id": "u", "user_query": "q"})
    err = _one_error(r)  # was 409: L2 refused the colon after the route had started
    assert err["field"] == "session_id" and err["pattern"] == "^[A-Za-z0-9._-]+$"
    r = ca.get("/v1/sessions/a:b/contract")
    err = _one_error(r)
    assert err["loc"] == ["path", "session_id"] and "pattern" in err
    r = ca.post("/v1/sessions", json={"session_id": "x" * 129, "user_id": "u", "user_query": "q"})
    assert _one_error(r)["limit"] == 128


# --- B: one mapping by class, no session-id leak ---------------------------------------------


def _error_classes() -> list[type[ContextError]]:
    seen: list[type[ContextError]] = []
    todo: list[type[ContextError]] = [ContextError]
    while todo:
        cls = todo.pop()
        if cls.__module__ == errors_mod.__name__ and cls not in seen:
            seen.append(cls)
        todo.extend(cls.__subclasses__())
    return seen


def test_every_error_class_maps_to_a_deliberate_status() -> None:
    """Each class in context_core.errors states its own status and code; a new class that
    only inherits them fails here and must choose."""
    from context_app.service.errors_map import error_response

    classes = _error_classes()
    public = {getattr(errors_mod, n) for n in errors_mod.__all__}
    assert set(classes) <= public | {ContextError}
    assert len(classes) >= 26
    for cls in classes:
        assert "http_status" in cls.__dict__, f"{cls.__name__} has no http_status of its own"
        assert "error_code" in cls.__dict__, f"{cls.__name__} has no error_code of its own"
        assert cls.http_status in {403, 404, 409, 413, 415, 422, 423, 429, 500, 503}, cls
        assert cls.error_code.replace("_", "").isalpha() and cls.error_code.islower(), cls
    expected = {
        "ContextError": 409,
        "UnknownSessionError": 404,
        "StaleStateError": 409,
        "AccessDeniedError": 403,
        "PayloadTooLargeError": 413,
        "StateTooLargeError": 413,
        "QuotaExceededError": 429,
        "InputTooDeepError": 422,
        "BackendUnavailableError": 503,
        "UnknownEventError": 422,
        "ContractLockedError": 423,
    }
    assert {c.__name__: c.http_status for c in classes if c.__name__ in expected} == expected
    resp = error_response(PayloadTooLargeError("too big (CTX_X)", limit_bytes=7))
    assert resp.status_code == 413
    assert json.loads(bytes(resp.body)) == {
        "error": "payload_too_large",
        "detail": "too big (CTX_X)",
        "limit_bytes": 7,
    }


def test_an_unmapped_state_error_keeps_its_deliberate_409(
    ca: httpx.Client, session_id: str
) -> None:
    state = _start(ca, session_id)["state"]
    state = _tool(ca, session_id, state, type="tool_call", name="t", result=1, call_id="c1")[
        "state"
    ]
    r = ca.post(
        f"/v1/sessions/{session_id}/events",
        json={
            "state": state,
            "event": {"type": "tool_call", "name": "t", "result": 2, "call_id": "c1"},
        },
    )
    assert r.status_code == 409 and r.json()["error"] == "state_conflict"
    _still_serves(ca, session_id, state)  # the failed event released the state


def test_another_agents_session_answers_like_a_missing_one(
    ca: httpx.Client, cb: httpx.Client, session_id: str
) -> None:
    mine = _start(ca, session_id)["state"]
    gone = f"{session_id}-gone"
    gone_state = _start(cb, gone)["state"]  # b's own, validly signed, then closed
    assert cb.delete(f"/v1/sessions/{gone}").status_code == 200

    def probes(sid: str, state: Any) -> list[httpx.Response]:
        body = {"session_id": sid, "step_intent": "default", "state": state}
        event = {"type": "tool_call", "name": "t", "result": 1}
        return [
            cb.post("/v1/context", json=body),
            cb.post(f"/v1/sessions/{sid}/events", json={"state": state, "event": event}),
            cb.post(
                f"/v1/sessions/{sid}/outputs",
                json={"state": state, "trace_id": "t1", "output": "o"},
            ),
            cb.get(f"/v1/sessions/{sid}/contract"),
            cb.get(f"/v1/sessions/{sid}/state"),
            cb.get(f"/v1/sessions/{sid}/results/c1"),
            cb.delete(f"/v1/sessions/{sid}"),
        ]

    for other, missing in zip(probes(session_id, mine), probes(gone, gone_state), strict=True):
        assert other.status_code == missing.status_code == 404, (other.text, missing.text)
        a, b = other.json(), missing.json()
        assert a["error"] == b["error"] == "unknown_session"
        assert set(a) == set(b) == {"error", "detail", "session_id"}
        assert a["detail"].replace(session_id, "X") == b["detail"].replace(gone, "X")
    # the owner is still told when its own (sealed) state is edited
    head, data = mine.rsplit(".", 1)
    forged = f"{head}.{data[:30]}{'B' if data[30] == 'A' else 'A'}{data[31:]}"
    r = _ctx(ca, session_id, forged)
    assert r.status_code == 403 and r.json()["error"] == "state_refused"
    _still_serves(ca, session_id, mine)


# --- C: L1 keeps pointers; its size is capped at write time ----------------------------------


def _big_result(kb: int) -> dict[str, Any]:
    rows = [{"i": i, "text": "lorem ipsum dolor sit amet " * 7} for i in range(kb * 1000 // 213)]
    return {"rows": rows, "status": "complete"}


def test_216kb_result_goes_to_l2_and_the_session_stays_usable(
    ca: httpx.Client, session_id: str, hard: dict[str, Any]
) -> None:
    state = _start(ca, session_id, device_id="PUMP-0042")["state"]
    big = _big_result(216)
    assert 210_000 < len(json.dumps(big)) < 225_000
    out = _tool(ca, session_id, state, type="tool_call", name="dump", result=big, call_id="big1")
    state = out["state"]
    cap = hard["settings"].l1_max_state_bytes
    assert len(state) < 4096 < cap  # was 337 KB
    inside = opened(hard["settings"], state, session_id)
    (result_item,) = [t for t in inside["trace"] if t["kind"] == "tool_result"]
    pointer = json.loads(result_item["payload"])
    assert pointer["l2_key"] == f"wm:{{{session_id}}}:result:big1"
    assert (
        result_item["status"] == "ok"
        and pointer["sha256"] == inside["last_api_result"]["data_sha256"]
    )
    assert out["info"]["step_key"] == f"wm:{{{session_id}}}:step:0"

    # the normal route path: the next step loads step 0, which points at the L2 copy ...
    r = _ctx(ca, session_id, state, "generate_report")
    assert r.status_code == 200, r.text
    (step,) = [f for f in r.json()["fragments"] if f["source"].endswith(":step:0")]
    assert step["content"]["result_ref"] == pointer["l2_key"]
    assert step["content"]["result_sha256"] == pointer["sha256"]
    # ... and the copy itself reads back whole, with the hash L1 keeps
    r = ca.get(f"/v1/sessions/{session_id}/results/big1")
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert data == big
    canon = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert hashlib.sha256(canon.encode()).hexdigest() == pointer["sha256"]

    for i in range(5):  # every later call works (each used to be a 413)
        call = {"type": "tool_call", "name": "read", "args": {"i": i}, "result": {"v": i}}
        done = _tool(ca, session_id, state, **call)
        state = done["state"]
        assert len(state) < cap
    assert done["session"]["step"] == 6
    _still_serves(ca, session_id, state)


def test_medium_result_stays_whole_in_the_step_and_as_a_pointer_in_l1(
    ca: httpx.Client, session_id: str, hard: dict[str, Any]
) -> None:
    state = _start(ca, session_id)["state"]
    medium = _big_result(6)
    call = {"type": "tool_call", "name": "m", "result": medium, "call_id": "m1"}
    state = _tool(ca, session_id, state, **call)["state"]
    inside = opened(hard["settings"], state, session_id)
    (item,) = [t for t in inside["trace"] if t["kind"] == "tool_result"]
    assert json.loads(item["payload"])["l2_key"].endswith(":result:m1")
    r = _ctx(ca, session_id, state, "generate_report")
    (step,) = [f for f in r.json()["fragments"] if f["source"].endswith(":step:0")]
    assert step["content"]["rows"] == medium["rows"]


def test_state_over_the_cap_is_refused_at_write_and_the_old_one_stays_valid(
    tight: dict[str, Any], session_id: str
) -> None:
    with _client(tight, tight["general"]) as c:
        state = _start(c, session_id)["state"]
        refused = None
        for i in range(12):
            event = {"type": "tool_call", "name": "t", "result": {"blob": f"{i}" * 1500}}
            r = c.post(f"/v1/sessions/{session_id}/events", json={"state": state, "event": event})
            if r.status_code == 413:
                refused = r.json()
                break
            assert r.status_code == 200, r.text
            state = r.json()["state"]
            assert len(state) <= 8192
        assert refused is not None, "the 8 KB state cap was never reached"
        assert refused["error"] == "state_too_large" and refused["limit_bytes"] == 8192
        assert "CTX_L1_MAX_STATE_BYTES" in refused["detail"] and "still valid" in refused["detail"]
        _still_serves(c, session_id, state)
        trimmed = _tool(c, session_id, state, type="context_overflow", keep_pairs=1)["state"]
        _tool(c, session_id, trimmed, type="tool_call", name="t", result={"blob": "z" * 1500})
        assert c.delete(f"/v1/sessions/{session_id}").status_code == 200


# --- D: replay protection ----------------------------------------------------------------------


def test_a_stale_state_is_refused_and_the_latest_can_be_refetched(
    ca: httpx.Client, session_id: str, hard: dict[str, Any]
) -> None:
    s0 = _start(ca, session_id)["state"]
    o0 = opened(hard["settings"], s0, session_id)
    assert o0["version"] == 0 and len(o0["nonce"]) == 32
    s1 = _tool(ca, session_id, s0, type="tool_call", name="t", result=1)["state"]
    o1 = opened(hard["settings"], s1, session_id)
    assert o1["version"] == 1 and o1["nonce"] == o0["nonce"]
    event = {"type": "tool_call", "name": "t", "result": 2}
    for r in (
        ca.post(f"/v1/sessions/{session_id}/events", json={"state": s0, "event": event}),
        ca.post(
            "/v1/context", json={"session_id": session_id, "step_intent": "default", "state": s0}
        ),
        ca.post(
            f"/v1/sessions/{session_id}/outputs", json={"state": s0, "trace_id": "t", "output": "o"}
        ),
    ):
        assert r.status_code == 409, r.text
        body = r.json()
        assert body["error"] == "stale_state" and body["current_version"] == 1
        assert "re-fetch" in body["detail"]
    latest = ca.get(f"/v1/sessions/{session_id}/state")
    assert latest.status_code == 200  # the same state, sealed again (a fresh nonce)
    assert opened(hard["settings"], latest.json()["state"], session_id) == o1
    assert latest.json()["info"]["version"] == latest.json()["session"]["version"] == 1
    _tool(ca, session_id, s1, type="tool_call", name="t", result=3)


def test_a_state_of_an_earlier_incarnation_never_applies(
    ca: httpx.Client, session_id: str, hard: dict[str, Any]
) -> None:
    old = _start(ca, session_id)["state"]
    assert ca.delete(f"/v1/sessions/{session_id}").status_code == 200
    r = _ctx(ca, session_id, old)
    assert r.status_code == 404  # closed: gone
    new = _start(ca, session_id)["state"]
    o_new, o_old = (opened(hard["settings"], s, session_id) for s in (new, old))
    assert o_new["version"] == o_old["version"] == 0 and o_new["nonce"] != o_old["nonce"]
    event = {"type": "tool_call", "name": "t", "result": 1}
    r = ca.post(f"/v1/sessions/{session_id}/events", json={"state": old, "event": event})
    assert r.status_code == 409 and r.json()["error"] == "stale_state"
    assert "earlier incarnation" in r.json()["detail"]
    _tool(ca, session_id, new, **event)


def test_concurrent_requests_with_one_state_cannot_both_win(
    hard: dict[str, Any], session_id: str
) -> None:
    with _client(hard, hard["a"]) as c:
        state = _start(c, session_id)["state"]
    n = 6
    barrier = threading.Barrier(n)
    codes: list[int] = []
    lock = threading.Lock()

    def post(i: int) -> None:
        event = {"type": "tool_call", "name": "t", "result": {"i": i}}
        with _client(hard, hard["a"]) as c:
            barrier.wait()
            r = c.post(f"/v1/sessions/{session_id}/events", json={"state": state, "event": event})
        with lock:
            codes.append(r.status_code)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(codes) == [200] + [409] * (n - 1), codes
    with _client(hard, hard["a"]) as c:
        latest = c.get(f"/v1/sessions/{session_id}/state").json()["state"]
        inside = opened(hard["settings"], latest, session_id)
        assert inside["version"] == 1 and inside["current_step"] == 1


def test_a_failed_event_keeps_the_sent_state_valid(ca: httpx.Client, session_id: str) -> None:
    state = _start(ca, session_id)["state"]
    state = _tool(ca, session_id, state, type="error_recovery")["state"]  # locks the contract
    r = ca.post(
        f"/v1/sessions/{session_id}/events",
        json={"state": state, "event": {"type": "user_correction", "fields": {"goal": "x"}}},
    )
    assert r.status_code == 423 and r.json()["error"] == "contract_locked"
    _tool(ca, session_id, state, type="tool_call", name="t", result=1)  # lease was given back


# --- E: bounded writes ---------------------------------------------------------------------------


def test_step_results_are_capped(tight: dict[str, Any], session_id: str, redis_url: str) -> None:
    from context_core.gateway.sanitize import Gateway
    from context_core.working_memory import WorkingMemory

    client = redis_lib.Redis.from_url(redis_url, decode_responses=True)
    try:
        sm = WorkingMemory(client, Gateway()).session(f"{session_id}-lib")
        with pytest.raises(PayloadTooLargeError, match="CTX_MAX_STEP_RESULT_BYTES") as e:
            sm.put_step_result("s1", {"blob": "x" * 250_000})
        assert e.value.limit_bytes == 16 * 1024
        sm.put_step_result("s1", {"blob": "x" * 10_000})
        sm.clear()
    finally:
        client.close()
    with _client(tight, tight["general"]) as c:
        state = _start(c, session_id)["state"]
        event = {"type": "tool_call", "name": "t", "result": {"blob": "y" * 5000}}
        r = c.post(f"/v1/sessions/{session_id}/events", json={"state": state, "event": event})
        assert r.status_code == 413, r.text  # stored inline in L1 (20 KB threshold), too big a step
        assert r.json()["limit_bytes"] == 4096
        assert "CTX_MAX_STEP_RESULT_BYTES" in r.json()["detail"]
        _tool(c, session_id, state, **{**event, "store_step": False})  # the state stayed valid
        assert c.delete(f"/v1/sessions/{session_id}").status_code == 200


def test_live_sessions_per_agent_are_capped(tight: dict[str, Any]) -> None:
    with _client(tight, tight["sessions"]) as c:
        sids = [f"t-q{uuid.uuid4().hex[:10]}" for _ in range(4)]
        for sid in sids[:3]:
            _start(c, sid)
        r = c.post("/v1/sessions", json={"session_id": sids[3], "user_id": "u", "user_query": "q"})
        assert r.status_code == 429, r.text
        assert r.json()["quota"] == "live_sessions" and r.json()["limit"] == 3
        assert int(r.headers["Retry-After"]) >= 1
        assert "CTX_MAX_LIVE_SESSIONS_PER_AGENT" in r.json()["detail"]
        assert c.get(f"/v1/sessions/{sids[3]}/contract").status_code == 404  # nothing kept
        assert c.delete(f"/v1/sessions/{sids[0]}").status_code == 200
        _start(c, sids[3])
        for sid in sids[1:]:
            assert c.delete(f"/v1/sessions/{sid}").status_code == 200


def test_write_bytes_per_agent_per_minute_are_capped(
    tight: dict[str, Any], session_id: str
) -> None:
    with _client(tight, tight["bytes"]) as c:
        state = _start(c, session_id)["state"]
        body = {"state": state, "trace_id": "t1", "output": "o" * 30_000}
        codes = []
        for _ in range(10):  # at most one minute boundary passes: a 429 within 4 + 4 posts
            r = c.post(f"/v1/sessions/{session_id}/outputs", json=body)
            codes.append(r.status_code)
            if r.status_code == 429:
                break
        assert codes[-1] == 429, codes
        assert r.json()["quota"] == "write_bytes_per_min" and r.json()["limit"] == 100_000
        assert 1 <= int(r.headers["Retry-After"]) <= 60
        _still_serves(c, session_id, state)  # reads are not charged
        assert c.delete(f"/v1/sessions/{session_id}").status_code == 200


# --- F: sessions made by library code ---------------------------------------------------------


def test_an_ownerless_library_session_is_not_claimable(
    ca: httpx.Client, session_id: str, hard: dict[str, Any], redis_url: str
) -> None:
    from context_app.service.deps import load_state_key
    from context_app.service.owners import OwnerBinding
    from context_core.gateway.identity import DEFAULT_ORG
    from context_core.gateway.sanitize import Gateway
    from context_core.lifecycle.manager import LifecycleManager
    from context_core.session.seal import seal_state
    from context_core.session.wire import WireState
    from context_core.working_memory import WorkingMemory

    client = redis_lib.Redis.from_url(redis_url, decode_responses=True)
    try:
        gw = Gateway()
        lib = LifecycleManager(wm=WorkingMemory(client, gw), gateway=gw)
        started = lib.apply(
            "session_start", None, session_id=session_id, user_id="u", user_query="library run"
        )
        body = {"session_id": session_id, "user_id": "u", "user_query": "mine now"}
        r = ca.post("/v1/sessions", json=body)
        assert r.status_code == 409 and "not available" in r.json()["detail"]
        other = f"{session_id}-o"
        _start(ca, other)
        with _client(hard, hard["b"]) as cb:  # same answer as for another agent's live id
            r2 = cb.post("/v1/sessions", json={**body, "session_id": other})
        assert r2.status_code == 409
        assert r2.json()["detail"].replace(other, "X") == r.json()["detail"].replace(
            session_id, "X"
        )
        assert ca.get(f"/v1/sessions/{session_id}/contract").status_code == 404
        # library code that wants an agent to continue through the service binds it explicitly
        owners = OwnerBinding(client, ttl_s=600)
        nonce = owners.adopt(session_id, hard["a"])
        wire = WireState.of(started.state, load_state_key(client), nonce=nonce)
        sealed = seal_state(wire, keyring_of(hard["settings"]), org=DEFAULT_ORG)
        r = _ctx(ca, session_id, sealed)
        assert r.status_code == 200, r.text
        assert (
            ca.get(f"/v1/sessions/{session_id}/contract").json()["fields"]["goal"] == "library run"
        )
    finally:
        client.close()


def test_the_body_guard_is_linear_on_adversarial_bodies() -> None:
    """No recursion, no backtracking: 200 KB of escaped or unterminated strings, brackets
    inside strings, or plain deep nesting are all judged in well under a second."""
    from context_app.service.limits import MAX_BODY_DEPTH, raw_body_problem, text_json_depth

    n = 100_000
    opened = b'{"a": ' + b"[" * (MAX_BODY_DEPTH + 5)
    cases = {
        "escaped quotes, unterminated": opened + b'"' + b'\\"' * n,
        "many short strings": b'{"a": [' + b'"x",' * n + b'"y"]}',
        "brackets inside strings": b'{"a": "' + b"[" * 2 * n + b'"}',
        "backslash runs": b'{"a": "' + b"\\\\" * n + b'"}',
        "deep": b"[" * n + b"]" * n,
    }
    for what, body in cases.items():
        t0 = time.perf_counter()
        problem = raw_body_problem(body)
        assert time.perf_counter() - t0 < 1.0, what
        deep = what in ("escaped quotes, unterminated", "deep")
        assert (problem is not None and problem["type"] == "json_too_deep") == deep, what
    t0 = time.perf_counter()
    assert text_json_depth("[" * 4 + '"' + '\\"' * n, 32) == 4
    # a string inside one array, holding three more: 1 + 3, as check_json counts it
    assert text_json_depth(json.dumps([json.dumps([[["x"]]])] * 5000), 32) == 4
    assert time.perf_counter() - t0 < 1.0
