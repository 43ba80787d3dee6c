"""The hot endpoints' direct handler (context_app.service.direct_route) against FastAPI's own.

Two real services (uvicorn over HTTP, the real Redis, Qdrant Edge, the encoder): the service
as it ships, whose hot routes skip FastAPI's dependency solver, and the same app whose routes
all keep FastAPI's standard handler (no route qualifies for the direct path). Every refused
request must be answered byte for byte alike (status, body, ``WWW-Authenticate``); a request
that passes must take the direct path (FastAPI's solver is never called for it) and one that
fails must reach FastAPI's handler.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import fastapi.routing
import httpx
import pytest
from fastapi.routing import APIRoute
from test_service import cleanup_service_keys, running_service, service_settings

import context_app.service.app as app_module
import context_app.service.direct_route as direct_route_module
from context_app.service.direct_route import DirectRoute, direct_plan

HOT = {
    ("POST", "/v1/sessions"),
    ("PUT", "/v1/sessions/{session_id}/plan"),
    ("POST", "/v1/sessions/{session_id}/events"),
    ("POST", "/v1/context"),
    ("POST", "/v1/sessions/{session_id}/outputs"),
    ("DELETE", "/v1/sessions/{session_id}"),
}


def _never_direct(route: APIRoute) -> None:
    """No route qualifies: each keeps FastAPI's own handler, as a plain APIRoute would."""
    return None


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[dict[str, Any]]:
    """The shipped service ("direct") and one whose routes keep FastAPI's handler ("standard")."""
    out: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        for name in ("direct", "standard"):
            settings, keys = service_settings(tmp_path_factory.mktemp(name), redis_url)
            with pytest.MonkeyPatch.context() as mp:
                if name == "standard":  # only while create_app runs
                    mp.setattr(direct_route_module, "direct_plan", _never_direct)
                url = stack.enter_context(running_service(settings))
            out[name] = {"url": url, "key": keys["agent-a"]}
        yield out
    cleanup_service_keys(redis_url)


def test_the_hot_routes_and_only_simple_ones_take_the_direct_path() -> None:
    app = app_module.create_app()
    direct = {
        (m, r.path)
        for r in app.routes
        if isinstance(r, DirectRoute) and direct_plan(r) is not None
        for m in r.methods
    }
    assert direct >= HOT
    # routes with query parameters or a return value FastAPI must serialise keep its handler
    assert ("GET", "/v1/sessions/{session_id}/contract") not in direct
    assert ("GET", "/v1/sessions/{session_id}/contract/history") not in direct
    assert ("GET", "/v1/intents") not in direct


def _ask(base: str, key: str | None, method: str, path: str, **kw: Any) -> tuple[Any, ...]:
    headers = dict(kw.pop("headers", {}))
    if key is not None:
        headers["X-API-Key"] = key
    with httpx.Client(base_url=base, timeout=30) as c:
        r = c.request(method, path, headers=headers, **kw)
    try:
        body: Any = r.json()
    except ValueError:
        body = r.text
    return r.status_code, body, r.headers.get("www-authenticate")


_JSON = {"Content-Type": "application/json"}
_TEXT = {"Content-Type": "text/plain"}
_VALID_START = {"session_id": "t-never-created", "user_id": "u-1", "user_query": "q"}
_STATE = {"session_id": "t-x", "user_id": "u", "start_time": 1.0, "user_query": "q"}

# (key: "good" | "bad" | None, method, path, raw body or None, headers)
REFUSED: list[tuple[str | None, str, str, bytes | None, dict[str, str]]] = [
    (None, "POST", "/v1/sessions", json.dumps(_VALID_START).encode(), _JSON),
    ("bad", "POST", "/v1/sessions", json.dumps(_VALID_START).encode(), _JSON),
    ("bad", "POST", "/v1/sessions/t-x/events", b"{not json", _JSON),  # 401 before the body
    ("good", "POST", "/v1/sessions", b"{not json", _JSON),
    ("good", "POST", "/v1/sessions", b"null", _JSON),
    ("good", "POST", "/v1/sessions", b"[]", _JSON),
    ("good", "POST", "/v1/sessions", b"{}", _JSON),
    ("good", "POST", "/v1/sessions", b'{"user_id": NaN, "user_query": "q"}', _JSON),
    ("good", "POST", "/v1/sessions", json.dumps(_VALID_START).encode(), _TEXT),
    ("good", "POST", "/v1/sessions", json.dumps(_VALID_START).encode(), {}),
    ("good", "POST", "/v1/sessions", json.dumps({**_VALID_START, "extra": 1}).encode(), _JSON),
    ("good", "POST", "/v1/sessions", b'{"user_id": "\\ud800", "user_query": "q"}', _JSON),
    ("good", "POST", "/v1/sessions", b'\xef\xbb\xbf{"user_id": 1, "user_query": "q"}', _JSON),
    ("good", "POST", "/v1/sessions", b'{"user_id": "u", "user_query": "q", "user_id": 2}', _JSON),
    ("good", "POST", "/v1/sessions/bad%21id/events", b"{}", _JSON),
    ("good", "POST", "/v1/sessions/" + "a" * 129 + "/outputs", b"{}", _JSON),
    ("good", "POST", "/v1/sessions/t-x/events", json.dumps({"state": _STATE}).encode(), _JSON),
    ("good", "POST", "/v1/context", json.dumps({"session_id": "t-x", "state": 1}).encode(), _JSON),
    ("good", "PUT", "/v1/sessions/t-x/plan", b'{"steps": "x"}', _JSON),
    ("good", "DELETE", "/v1/sessions/bad%20id", None, {}),
    (None, "DELETE", "/v1/sessions/t-x", None, {}),
]


@pytest.mark.parametrize("case", range(len(REFUSED)))
def test_a_refused_request_is_answered_as_fastapi_answers_it(
    pair: dict[str, Any], case: int
) -> None:
    key_kind, method, path, body, headers = REFUSED[case]
    answers = []
    for name in ("direct", "standard"):
        s = pair[name]
        key = {"good": s["key"], "bad": "not-a-key", None: None}[key_kind]
        answers.append(_ask(s["url"], key, method, path, content=body, headers=headers))
    direct, standard = answers
    assert direct[0] in (401, 422), direct
    assert direct == standard


@pytest.fixture
def solver_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths FastAPI's dependency solver ran for (the services run in this process)."""
    calls: list[str] = []
    real = fastapi.routing.solve_dependencies

    async def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["request"].url.path)
        return await real(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counting)
    return calls


def test_a_session_that_succeeds_never_reaches_the_dependency_solver(
    pair: dict[str, Any], solver_calls: list[str]
) -> None:
    s = pair["direct"]
    sid = f"t-dr-{uuid.uuid4().hex[:12]}"
    with httpx.Client(base_url=s["url"], headers={"X-API-Key": s["key"]}, timeout=30) as c:
        r = c.post("/v1/sessions", json={"session_id": sid, "user_id": "u-1", "user_query": "q"})
        assert r.status_code == 201, r.text
        state = r.json()["state"]
        plan = {"steps": [{"step_id": "1", "depends_on": [], "est_start_s": 0}]}
        assert c.put(f"/v1/sessions/{sid}/plan", json=plan).status_code == 200
        ev = {"type": "tool_call", "name": "read_sensor", "args": {}, "result": {"rms": 4.2}}
        r = c.post(f"/v1/sessions/{sid}/events", json={"state": state, "event": ev})
        assert r.status_code == 200, r.text
        state = r.json()["state"]
        ctx = {"session_id": sid, "step_intent": "fetch_sensor_data", "state": state}
        r = c.post("/v1/context", json=ctx)
        assert r.status_code == 200, r.text
        out = {"state": state, "trace_id": r.json()["trace_id"], "output": "rms 4.2 mm/s"}
        assert c.post(f"/v1/sessions/{sid}/outputs", json=out).status_code == 200
        assert c.delete(f"/v1/sessions/{sid}").status_code == 200
        assert solver_calls == []
        # a refused one goes through FastAPI's handler (and its solver), which answers it
        r = c.delete(f"/v1/sessions/{sid}", headers={"X-API-Key": "not-a-key"})
        assert r.status_code == 401
        assert solver_calls == [f"/v1/sessions/{sid}"]


def _bodies() -> list[bytes]:
    """Bodies of every hot route, as sent and bent: duplicate keys, numbers JSON parsers
    disagree on, escapes, a byte-order mark, nesting in the free-form tool result."""
    from loadtests import agent_steps as agent

    state = {
        **_STATE,
        "session_id": "t-x",
        "current_step": 1,
        "trace": [],
        "version": 1,
        "nonce": "ab" * 16,
        "sig": "0" * 64,
    }
    event = agent.event_body(state, agent.sensor_event("PUMP-0042", 4.2, 1.7e9))
    docs: list[Any] = [
        agent.create_body("t-x", "u-1", "why is it hot?", "PUMP-0042"),
        agent.plan_body(2, 2.0),
        event,
        agent.context_body("t-x", "generate_report", state, "PUMP-0042"),
        agent.output_body(state, "a" * 32, "generate_report", "PUMP-0042", 4.2),
    ]
    raw = [json.dumps(d).encode() for d in docs]
    result = json.dumps(event).replace(
        '"result": {', '"result": {"r": 1e400, "b": ' + str(2**70) + ", "
    )
    return [
        *raw,
        result.encode(),
        json.dumps(event).replace('"name": ', '"name": "x", "name": ', 1).encode(),
        json.dumps(docs[0]).replace('"why', '"\\u00e9\\u2028 why').encode(),
        json.dumps(docs[0]).replace('"why', '"\\ud83d\\ude00 why').encode(),
        json.dumps(docs[0]).replace('"why', '"\\udc80 why').encode(),
        b"\xef\xbb\xbf" + raw[0],
        json.dumps(docs[1]).replace("2.0", "NaN").encode(),
        json.dumps(docs[4]).replace("4.2", "4.2000000000000001776").encode(),
        b" " + raw[3] + b"\n",
        b"null",
        b"[]",
    ]


@pytest.mark.parametrize("route_key", sorted(HOT - {("DELETE", "/v1/sessions/{session_id}")}))
def test_the_body_reader_agrees_with_fastapis_two_steps(route_key: tuple[str, str]) -> None:
    from context_app.service.direct_route import _json_validator

    app = app_module.create_app()
    (route,) = [
        r
        for r in app.routes
        if isinstance(r, APIRoute)
        and (route_key[0], r.path) in {(m, r.path) for m in r.methods}
        and r.path == route_key[1]
    ]
    field = route.body_field
    assert field is not None
    read = _json_validator(field)
    assert read is not None
    agreed = 0
    for raw in _bodies():
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        standard, errors = (
            field.validate(doc, {}, loc=("body",)) if doc is not None else (None, [1])
        )
        try:
            direct = read(raw)
        except ValueError:  # refused: FastAPI's handler answers (the fallback)
            continue
        assert not errors, f"direct path took a body FastAPI refuses: {raw[:120]!r}"
        assert direct == standard, raw[:120]
        agreed += 1
    assert agreed >= 1  # the route's own body passes both ways


def test_no_request_reaches_two_routes_so_the_search_order_is_free() -> None:
    """The router tries the direct routes first; that is only safe while no request path
    matches two routes (method included), checked here on every route's own path."""
    import re

    from starlette.routing import Match

    app = app_module.create_app()
    routes = list(app.router.routes)
    assert [getattr(r, "direct", False) for r in routes][:6] == [True] * 6  # hot ones first
    checked = 0
    for route in routes:
        path = getattr(route, "path", None)
        if path is None:
            continue
        concrete = re.sub(r"\{[^}]+\}", "p1", path)
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            scope = {"type": "http", "method": method, "path": concrete, "root_path": ""}
            full = [r for r in routes if r.matches(scope)[0] is Match.FULL]
            assert full == [route], (method, concrete, [getattr(r, "path", r) for r in full])
            checked += 1
    assert checked >= 25


def test_the_openapi_document_keeps_the_declared_path_order() -> None:
    shipped = app_module.create_app().openapi()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(direct_route_module, "direct_plan", _never_direct)
        standard = app_module.create_app().openapi()
    assert list(shipped["paths"]) == list(standard["paths"])
    assert shipped == standard


def test_event_info_skips_fastapis_encoder_only_when_it_would_change_nothing() -> None:
    import datetime
    import enum

    from fastapi.encoders import jsonable_encoder

    from context_app.service.routes._common import plain_json as _plain_json
    from context_core.session.wire import encode_json

    class Kind(enum.StrEnum):
        a = "a"

    plain = {"event": "tool_call", "x": (1, 2.5, None, True), "n": float("nan"), "b": 2**70}
    assert _plain_json(plain)
    assert encode_json(plain) == encode_json(jsonable_encoder(plain))
    for other in ({"k": Kind.a}, {1: 2}, {"t": datetime.datetime(2024, 1, 1)}, {"s": {1}}):
        assert not _plain_json(other)  # FastAPI's encoder decides their JSON, as before
