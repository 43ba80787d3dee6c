"""Every endpoint's real answers against the schema the app publishes at ``/openapi.json``.

The hot endpoints encode their JSON themselves (no FastAPI response validation, for speed), so
nothing else would notice a response drifting from its published model. Here the real app
runs on uvicorn with the real Redis and Qdrant Edge; each route has a case that makes it
answer a success and, where it can fail, at least one error, and every answer is validated
with ``jsonschema`` against the published response for its status code (``$ref``s resolved
against the spec's components). The routes are enumerated from the app: a new endpoint without
a case here fails :func:`test_every_route_has_a_contract_case`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import cleanup_keys
from jsonschema import Draft202012Validator
from sealed_state import Held
from starlette.routing import Route
from test_ops_hardening import run_app
from test_service import cleanup_service_keys, service_settings
from test_upload_scan import MARKER, ClamdUnavailable, running_clamd

from context_core.access.auth import hash_key, new_key

Answers = list[httpx.Response]


@dataclass
class Env:
    url: str
    app: Any
    keys: dict[str, str]
    spec: dict[str, Any] = field(default_factory=dict)
    clamd: str | None = None  # a private clamd for POST /v1/uploads (None: not installed)

    def client(self, agent: str | None = "agent-a") -> httpx.Client:
        headers = {"X-API-Key": self.keys[agent]} if agent else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def redis_url(redis_or_cluster: str) -> str:
    """This module runs once on the system Redis (or embedded Valkey), once on a Redis Cluster."""
    return redis_or_cluster


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("contract")
    with ExitStack() as stack:
        try:  # POST /v1/uploads needs a scanner: a private clamd (tests/test_upload_scan.py)
            clamd: str | None = stack.enter_context(running_clamd(tmp / "clamd"))[0]
        except ClamdUnavailable:
            clamd = None
        settings, raw = service_settings(
            tmp, redis_url, max_body_bytes=64 * 1024, clamd_url=clamd, upload_max_bytes=UPLOAD_MAX
        )
        _add_compliance_admin(settings.api_keys_file, raw)
        url, app = stack.enter_context(run_app(settings))
        e = Env(url, app, raw, clamd=clamd)
        with e.client() as c:
            e.spec = c.get("/openapi.json").json()
        yield e
    cleanup_service_keys(redis_url)
    cleanup_keys(redis_url, "cmp:{org:default}:*")
    cleanup_keys(redis_url, "svc:agent:{cmp-admin}:*")


def _add_compliance_admin(keys_file: Path | None, raw: dict[str, str]) -> None:
    """A ``compliance_admin`` agent of the default org (the agents above have no org)."""
    assert keys_file is not None
    doc = json.loads(keys_file.read_text())
    raw["cmp-admin"] = new_key()
    doc["cmp-admin"] = {"key_sha256": hash_key(raw["cmp-admin"]), "purposes": ["compliance_admin"]}
    keys_file.write_text(json.dumps(doc))


# --- helpers ---------------------------------------------------------------------------------


def _sid() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def _start(c: httpx.Client, sid: str | None = None) -> Held:
    body = {"session_id": sid or _sid(), "user_id": "u-1", "user_query": "check PUMP-0042"}
    r = c.post("/v1/sessions", json=body)
    assert r.status_code == 201, r.text
    return Held.of(r.json())


def _event(c: httpx.Client, state: Held, event: dict[str, Any]) -> httpx.Response:
    return c.post(f"/v1/sessions/{state.sid}/events", json={"state": state, "event": event})


def _tool(c: httpx.Client, state: Held, **extra: Any) -> dict[str, Any]:
    event = {"type": "tool_call", "name": "fetch", "args": {"device": "PUMP-0042"}, **extra}
    event.setdefault("result", {"temp_c": 81.5})
    r = _event(c, state, event)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _codes(answers: Answers) -> list[int]:
    return [r.status_code for r in answers]


# --- one case per route: the answers to check ------------------------------------------------


def case_create(e: Env) -> Answers:
    with e.client() as c, e.client(None) as anon:
        sid = _sid()
        ok = c.post("/v1/sessions", json={"session_id": sid, "user_id": "u", "user_query": "q"})
        return [
            ok,
            c.post("/v1/sessions", json={"session_id": sid, "user_id": "u", "user_query": "q"}),
            c.post("/v1/sessions", json={"user_query": "no user"}),
            anon.post("/v1/sessions", json={"user_id": "u", "user_query": "q"}),
        ]


def case_events(e: Env) -> Answers:
    with e.client() as c, e.client("agent-b") as other:
        state = _start(c)
        ok = _event(c, state, {"type": "tool_call", "name": "fetch", "args": {}, "result": [1, 2]})
        new = Held.of(ok.json())
        msg = _event(c, new, {"type": "user_message", "text": "not PUMP-0042 but PUMP-0043"})
        return [
            ok,
            msg,
            _event(c, state, {"type": "session_timeout"}),  # replayed: 409 stale_state
            _event(c, Held.of(msg.json()), {"type": "no_such_event"}),
            _event(other, Held.of(msg.json()), {"type": "session_timeout"}),  # 404
        ]


def case_context(e: Env) -> Answers:
    with e.client() as c:
        state = _start(c)
        sid = state.sid
        ok = c.post(
            "/v1/context",
            json={"session_id": sid, "step_intent": "default", "state": state},
        )
        forged = state[:-8] + ("A" * 8 if state[-8:] != "A" * 8 else "B" * 8)  # 403
        # delta recall: a full delta (no base), a delta against it, since_bundle alone (422)
        step = {"session_id": sid, "step_intent": "default", "state": state}
        first = c.post("/v1/context", json={**step, "delta": True})
        since = first.json()["bundle_id"]
        delta = c.post("/v1/context", json={**step, "delta": True, "since_bundle": since})
        assert first.json()["full"] and not delta.json()["full"], delta.text
        assert delta.json()["base_bundle_id"] == since and delta.json()["unchanged"]
        return [
            ok,
            c.post("/v1/context", json={"session_id": sid, "step_intent": "nope", "state": state}),
            c.post(
                "/v1/context", json={"session_id": sid, "step_intent": "default", "state": forged}
            ),
            first,
            delta,
            c.post("/v1/context", json={**step, "since_bundle": since}),
        ]


def case_outputs(e: Env) -> Answers:
    with e.client() as c:
        state = _start(c)
        url = f"/v1/sessions/{state.sid}/outputs"
        return [
            c.post(url, json={"state": state, "trace_id": "a" * 32, "output": "PUMP-0042 ok"}),
            c.post(url, json={"state": state, "trace_id": "bad id!", "output": "x"}),
        ]


def case_state(e: Env) -> Answers:
    with e.client() as c:
        state = _start(c)
        return [
            c.get(f"/v1/sessions/{state.sid}/state"),
            c.get(f"/v1/sessions/{_sid()}/state"),
        ]


def case_result(e: Env) -> Answers:
    with e.client() as c:
        state = _start(c)
        sid = state.sid
        _tool(c, state, call_id="big-1", result={"text": "x" * 5000})  # over 2 KB: goes to L2
        return [
            c.get(f"/v1/sessions/{sid}/results/big-1"),
            c.get(f"/v1/sessions/{sid}/results/never-made"),
            c.get(f"/v1/sessions/{sid}/results/bad:id"),
        ]


def case_contract(e: Env) -> Answers:
    with e.client() as c:
        sid = _start(c).sid
        url = f"/v1/sessions/{sid}/contract"
        return [
            c.get(url),
            c.get(url, params={"since_version": 1}),  # unchanged: {"changed": false, ...}
            c.get(url, params={"since_version": 0}),  # changed: the contract in full
            c.get(url, params={"since_version": -1}),  # 422 naming since_version
            c.get(f"/v1/sessions/{_sid()}/contract"),
        ]


def case_put_contract(e: Env) -> Answers:
    with e.client() as c:
        sid = _start(c).sid
        url = f"/v1/sessions/{sid}/contract"
        ok = c.put(url, json={"expected_version": 1, "fields": {"device": "PUMP-0043"}})
        return [
            ok,
            c.put(url, json={"expected_version": 1, "fields": {"device": "PUMP-0044"}}),  # 409
            c.put(url, json={"expected_version": 2, "fields": {}}),  # 422
            c.put(
                f"/v1/sessions/{_sid()}/contract", json={"expected_version": 0, "fields": {"a": 1}}
            ),
        ]


def case_contract_history(e: Env) -> Answers:
    with e.client() as c:
        sid = _start(c).sid
        return [
            c.get(f"/v1/sessions/{sid}/contract/history"),
            c.get(f"/v1/sessions/{_sid()}/contract/history"),
        ]


def case_close(e: Env) -> Answers:
    with e.client() as c:
        sid = _start(c).sid
        return [c.delete(f"/v1/sessions/{sid}"), c.delete(f"/v1/sessions/{sid}")]


def case_put_plan(e: Env) -> Answers:
    with e.client() as c:
        sid = _start(c).sid
        plan = {
            "steps": [{"step_id": "a"}, {"step_id": "b", "depends_on": ["a"], "est_start_s": 60}]
        }
        dup = {"steps": [{"step_id": "a"}, {"step_id": "a"}]}
        return [
            c.put(f"/v1/sessions/{sid}/plan", json=plan),
            c.put(f"/v1/sessions/{sid}/plan", json=dup),
        ]


def case_get_plan(e: Env) -> Answers:
    with e.client() as c:
        sid = _start(c).sid
        missing = c.get(f"/v1/sessions/{sid}/plan")  # none sent yet: 409 context_miss
        c.put(f"/v1/sessions/{sid}/plan", json={"steps": [{"step_id": "a"}]})
        return [c.get(f"/v1/sessions/{sid}/plan"), missing]


def case_confirmations(e: Env) -> Answers:
    with e.client() as c:
        state = _start(c)
        url = f"/v1/sessions/{state.sid}/confirmations"
        answer = {"text": "PUMP-0042 seal was replaced in 2026", "section": "PUMP"}
        return [
            c.post(url, json={"state": state, "answers": [answer]}),
            c.post(url, json={"state": state, "answers": []}),
        ]


def case_get_preferences(e: Env) -> Answers:
    with e.client() as c:
        sid = _start(c).sid
        c.put(f"/v1/sessions/{sid}/preferences/units", json={"value": "metric"})
        return [
            c.get(f"/v1/sessions/{sid}/preferences"),
            c.get(f"/v1/sessions/{_sid()}/preferences"),
        ]


def case_put_preference(e: Env) -> Answers:
    with e.client() as c:
        sid = _start(c).sid
        return [
            c.put(
                f"/v1/sessions/{sid}/preferences/units", json={"value": "metric", "confidence": 0.8}
            ),
            c.put(f"/v1/sessions/{sid}/preferences/Bad-Type", json={"value": 1}),
        ]


def case_delete_preference(e: Env) -> Answers:
    with e.client() as c:
        sid = _start(c).sid
        c.put(f"/v1/sessions/{sid}/preferences/units", json={"value": "metric"})
        return [
            c.delete(f"/v1/sessions/{sid}/preferences/units"),
            c.delete(f"/v1/sessions/{_sid()}/preferences/units"),
        ]


def _compliance_put(base: str) -> Callable[[Env], Answers]:
    def case(e: Env) -> Answers:
        with e.client("cmp-admin") as admin, e.client() as agent:
            v = admin.get(base).json()["version"]
            return [
                admin.put(base, json={"expected_version": v, "profile": {"language": "en"}}),
                admin.put(base, json={"expected_version": v, "profile": {"language": "de"}}),
                admin.put(base, json={"expected_version": v + 1, "profile": {"timezone": "X/Y"}}),
                agent.put(base, json={"expected_version": v + 1, "profile": {}}),  # no purpose
            ]

    return case


def _compliance_get(path: str, agent: str = "agent-a") -> Callable[[Env], Answers]:
    def case(e: Env) -> Answers:
        with e.client(agent) as c, e.client("agent-a") as member:
            return [c.get(path), c.get(path.replace("/orgs/default", "/orgs/other-org")),
                    member.get(path.replace("/orgs/default", "/orgs/bad%20org"))]  # fmt: skip

    return case


CMP_ORG = "/v1/compliance/orgs/default"
CMP_USER = CMP_ORG + "/users/u-1"


def case_erasure(e: Env) -> Answers:
    path = CMP_ORG + "/users/u-erase/erasure"
    with e.client("cmp-admin") as admin, e.client() as agent:
        return [
            admin.post(path),
            agent.post(path),  # no compliance_admin purpose: 403
            admin.post(path.replace("/orgs/default", "/orgs/other-org")),
            admin.post(path.replace("/orgs/default", "/orgs/bad%20org")),
        ]


UPLOAD_MAX = 128 * 1024


def case_upload(e: Env) -> Answers:
    if e.clamd is None:
        pytest.skip("no clamd (apt-get install -y clamav-daemon): uploads cannot succeed")
    with e.client() as c, e.client(None) as anon:

        def up(name: str, data: bytes, ctype: str, client: httpx.Client = c) -> httpx.Response:
            return client.post("/v1/uploads", files={"file": (name, data, ctype)})

        return [
            up("notes.txt", b"The gearbox oil is changed every 4000 hours.", "text/plain"),
            up("x.txt", f"a {MARKER} b".encode(), "text/plain"),  # 422 upload_infected
            up("tool.exe", b"MZ", "application/x-msdownload"),  # 415
            up("big.txt", b"x" * (UPLOAD_MAX + 1), "text/plain"),  # 413
            c.post("/v1/uploads", data={"section": "x"}),  # 422 invalid_request: no file
            up("a.txt", b"text", "text/plain", anon),  # 401
        ]


def _gets(path: str) -> Callable[[Env], Answers]:
    def case(e: Env) -> Answers:
        with e.client() as c:
            return [c.get(path)]

    return case


#: (method, path) -> the case. Routes that cannot fail on input have a success only.
CASES: dict[tuple[str, str], Callable[[Env], Answers]] = {
    ("GET", "/healthz"): _gets("/healthz"),
    ("GET", "/readyz"): _gets("/readyz"),
    ("GET", "/metrics"): _gets("/metrics"),
    ("GET", "/v1/intents"): _gets("/v1/intents"),
    ("POST", "/v1/sessions"): case_create,
    ("POST", "/v1/sessions/{session_id}/events"): case_events,
    ("POST", "/v1/context"): case_context,
    ("POST", "/v1/sessions/{session_id}/outputs"): case_outputs,
    ("GET", "/v1/sessions/{session_id}/state"): case_state,
    ("GET", "/v1/sessions/{session_id}/results/{call_id}"): case_result,
    ("GET", "/v1/sessions/{session_id}/contract"): case_contract,
    ("PUT", "/v1/sessions/{session_id}/contract"): case_put_contract,
    ("GET", "/v1/sessions/{session_id}/contract/history"): case_contract_history,
    ("DELETE", "/v1/sessions/{session_id}"): case_close,
    ("PUT", "/v1/sessions/{session_id}/plan"): case_put_plan,
    ("GET", "/v1/sessions/{session_id}/plan"): case_get_plan,
    ("POST", "/v1/sessions/{session_id}/confirmations"): case_confirmations,
    ("GET", "/v1/sessions/{session_id}/preferences"): case_get_preferences,
    ("PUT", "/v1/sessions/{session_id}/preferences/{pref_type}"): case_put_preference,
    ("DELETE", "/v1/sessions/{session_id}/preferences/{pref_type}"): case_delete_preference,
    ("POST", "/v1/uploads"): case_upload,
    ("GET", "/v1/compliance/orgs/{org_id}"): _compliance_get(CMP_ORG),
    ("PUT", "/v1/compliance/orgs/{org_id}"): _compliance_put(CMP_ORG),
    ("GET", "/v1/compliance/orgs/{org_id}/history"): _compliance_get(
        CMP_ORG + "/history", "cmp-admin"
    ),
    ("GET", "/v1/compliance/orgs/{org_id}/users/{user_id}"): _compliance_get(CMP_USER),
    ("PUT", "/v1/compliance/orgs/{org_id}/users/{user_id}"): _compliance_put(CMP_USER),
    ("GET", "/v1/compliance/orgs/{org_id}/users/{user_id}/history"): _compliance_get(
        CMP_USER + "/history", "cmp-admin"
    ),
    ("POST", "/v1/compliance/orgs/{org_id}/users/{user_id}/erasure"): case_erasure,
}

#: FastAPI's own pages: not in the schema they serve; checked for their content type.
DOC_PAGES = {
    ("GET", "/openapi.json"): "application/json",
    ("GET", "/docs"): "text/html",
    ("GET", "/docs/oauth2-redirect"): "text/html",
    ("GET", "/redoc"): "text/html",
}

#: Routes whose answer never depends on the caller's input (no error case required).
NO_ERROR_CASE = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/v1/intents"),
}


def _app_routes(app: Any) -> set[tuple[str, str]]:
    out = set()
    for route in app.routes:
        if isinstance(route, Route):  # APIRoute is a Route too
            out |= {(m, route.path) for m in (route.methods or ()) if m != "HEAD"}
    return out


def check_against_spec(spec: dict[str, Any], method: str, path: str, r: httpx.Response) -> None:
    """``r`` is an answer the spec publishes for ``method path`` and its status, and its
    body validates against the published schema."""
    where = f"{method} {path} -> {r.status_code}"
    published = spec["paths"][path][method.lower()]["responses"].get(str(r.status_code))
    assert published is not None, f"{where}: status not published ({r.text[:300]})"
    ctype = r.headers["content-type"].split(";")[0].strip()
    content = published.get("content", {})
    media = {m.split(";")[0].strip(): v for m, v in content.items()}
    assert ctype in media, f"{where}: answered {ctype}, published {sorted(media)}"
    schema = media[ctype]["schema"]
    if ctype != "application/json":
        assert schema == {"type": "string"} and r.text, where
        return
    assert schema, f"{where}: the published schema is empty (no response model)"
    validator = Draft202012Validator({**schema, "components": spec["components"]})
    errors = sorted(validator.iter_errors(r.json()), key=lambda err: list(err.path))
    assert not errors, f"{where}: " + "; ".join(
        f"{'/'.join(map(str, err.path)) or '<root>'}: {err.message[:200]}" for err in errors
    )


# --- tests -----------------------------------------------------------------------------------


def test_every_route_has_a_contract_case(env: Env) -> None:
    routes = _app_routes(env.app)
    missing = routes - set(CASES) - set(DOC_PAGES)
    assert not missing, f"routes without a contract case in {Path(__file__).name}: {missing}"
    stale = (set(CASES) | set(DOC_PAGES)) - routes
    assert not stale, f"cases for routes the app no longer has: {stale}"
    published = {(m.upper(), p) for p, ops in env.spec["paths"].items() for m in ops}
    assert published == set(CASES), "every case is a published route, and vice versa"


@pytest.mark.parametrize("route", sorted(CASES), ids=lambda r: f"{r[0]} {r[1]}")
def test_answers_match_the_published_schema(env: Env, route: tuple[str, str]) -> None:
    method, path = route
    answers = CASES[route](env)
    codes = _codes(answers)
    assert any(200 <= c < 300 for c in codes), f"{method} {path}: no success among {codes}"
    if route not in NO_ERROR_CASE:
        assert any(c >= 400 for c in codes), f"{method} {path}: no error case among {codes}"
    for r in answers:
        check_against_spec(env.spec, method, path, r)


def test_error_cases_answer_what_they_test(env: Env) -> None:
    """The cases above really reach the error paths they are there for."""
    assert _codes(case_create(env)) == [201, 409, 422, 401]
    assert _codes(case_events(env)) == [200, 200, 409, 422, 404]
    assert _codes(case_context(env)) == [200, 422, 403, 200, 200, 422]
    assert _codes(case_result(env)) == [200, 409, 422]
    assert _codes(case_get_plan(env)) == [200, 409]
    assert _codes(case_close(env)) == [200, 404]
    assert _codes(case_contract(env)) == [200, 200, 200, 422, 404]
    assert _codes(case_put_contract(env)) == [200, 409, 422, 404]
    if env.clamd is not None:
        assert _codes(case_upload(env)) == [201, 422, 415, 413, 422, 401]
    for path in (CMP_ORG, CMP_USER):
        assert _codes(_compliance_put(path)(env)) == [200, 409, 422, 403]
        assert _codes(_compliance_get(path)(env)) == [200, 403, 422]
        assert _codes(_compliance_get(path + "/history", "cmp-admin")(env)) == [200, 403, 422]


@pytest.mark.parametrize("route", sorted(DOC_PAGES), ids=lambda r: f"{r[0]} {r[1]}")
def test_doc_pages_answer(env: Env, route: tuple[str, str]) -> None:
    with env.client(None) as c:
        r = c.request(route[0], route[1])
    assert r.status_code == 200
    assert r.headers["content-type"].startswith(DOC_PAGES[route])


def test_the_checker_refuses_a_drifted_answer(env: Env) -> None:
    """A test that can't fail is a defect: a bundle with an undeclared key, or without a
    declared one, is refused by the same check."""
    with env.client() as c:
        state = _start(c)
        r = c.post(
            "/v1/context",
            json={"session_id": state.sid, "step_intent": "default", "state": state},
        )
    assert r.status_code == 200
    body = r.json()
    assert body["resolved_intent"] == "default"
    for drifted in ({**body, "extra": 1}, {k: v for k, v in body.items() if k != "trace_id"}):
        fake = httpx.Response(200, json=drifted)
        with pytest.raises(AssertionError):
            check_against_spec(env.spec, "POST", "/v1/context", fake)
