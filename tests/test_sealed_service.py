"""The sealed L1 state on the running service (issue 37): what a client, proxy or log sees of
the state string reveals nothing, and a state opens only unchanged, for its own organisation
and session, with a key the service still holds; signed states are accepted until the
migration window ends. Two real services (uvicorn, the real Redis, Qdrant Edge on a temp dir)
share one Redis: ``old`` seals with k1 and still takes signed states; ``new`` has k2
prepended (rotation) and its migration window is over. gRPC runs on ``old``."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from conftest import cleanup_keys
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from redis_cluster import redis_client
from sealed_state import opened
from test_service import cleanup_service_keys, free_port, running_service

from context_app.rpc.v1 import context_pb2 as pb
from context_app.rpc.v1 import context_pb2_grpc as pb_grpc
from context_app.service.deps import STATE_KEY
from context_core.access.auth import hash_key, new_key
from context_core.config import Settings, get_settings
from context_core.session.seal import StateKeyring
from context_core.session.wire import WireState, _signature, encode_json

K1 = StateKeyring.new_entry("k1")
K2 = StateKeyring.new_entry("k2")
AGENTS = {"a-agent": "A", "b-agent": "B"}
PLANTED_USER = "u-planted-qx7"
PLANTED_QUERY = "zebrafinch bearing overheats"
PLANTED_DEVICE = "DEV-planted-4242"


@pytest.fixture(scope="module")
def redis_url(default_redis_url: str) -> str:
    return default_redis_url


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("sealed")
    tag = uuid.uuid4().hex[:8]
    orgs = {"A": f"seal-a-{tag}", "B": f"seal-b-{tag}"}
    raw = {a: new_key() for a in AGENTS}
    doc = {a: {"key_sha256": hash_key(raw[a]), "org": orgs[o]} for a, o in AGENTS.items()}
    keys_file = tmp / "api_keys.json"
    keys_file.write_text(json.dumps(doc))
    grpc_port = free_port()

    def settings(name: str, **extra: Any) -> Settings:
        return get_settings(
            data_dir=tmp / name,
            reports_dir=tmp / f"{name}-reports",
            redis_url=redis_url,
            api_keys_file=keys_file,
            l3_timeout_ms=5000,
            **extra,
        )

    old = settings("old", state_keys=K1, grpc_port=grpc_port)
    past = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    new = settings("new", state_keys=f"{K2},{K1}", state_legacy_until=past)
    try:
        with running_service(old) as old_url, running_service(new) as new_url:
            channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
            grpc.channel_ready_future(channel).result(timeout=30)
            yield {
                "old": old_url,
                "new": new_url,
                "old_settings": old,
                "keys": raw,
                "orgs": orgs,
                "channel": channel,
            }
            channel.close()
    finally:
        cleanup_service_keys(redis_url)
        cleanup_keys(redis_url, "svc:{seal-*")
        cleanup_keys(redis_url, "wm:{seal-*")
        for agent in AGENTS:
            cleanup_keys(redis_url, f"svc:agent:{{{agent}}}:*")


def _client(sealed: dict[str, Any], agent: str = "a-agent", which: str = "old") -> httpx.Client:
    return httpx.Client(
        base_url=sealed[which], headers={"X-API-Key": sealed["keys"][agent]}, timeout=60
    )


def _start(c: httpx.Client) -> tuple[str, dict[str, Any]]:
    sid = f"seal-{uuid.uuid4().hex[:12]}"
    body = {
        "session_id": sid,
        "user_id": PLANTED_USER,
        "user_query": PLANTED_QUERY,
        "device_id": PLANTED_DEVICE,
    }
    r = c.post("/v1/sessions", json=body)
    assert r.status_code == 201, r.text
    return sid, r.json()


def _event(c: httpx.Client, sid: str, state: Any) -> httpx.Response:
    ev = {"type": "tool_call", "name": "search", "args": {"q": "x"}, "result": {"ok": 1}}
    return c.post(f"/v1/sessions/{sid}/events", json={"state": state, "event": ev})


def _refused(r: httpx.Response, *words: str) -> str:
    assert r.status_code == 403, r.text
    body = r.json()
    assert body["error"] == "state_refused", body
    for w in words:
        assert w in body["detail"], body["detail"]
    return str(body["detail"])


def _decodings(state: str) -> list[bytes]:
    """Every segment of ``state`` (and the whole) base64-decoded, urlsafe and standard,
    padded; what cannot be decoded is taken as it is."""
    out = [state.encode()]
    for seg in [state, *state.split(".")]:
        padded = seg + "=" * (-len(seg) % 4)
        for decode in (base64.urlsafe_b64decode, base64.b64decode):
            try:
                out.append(decode(padded))
            except (binascii.Error, ValueError):
                out.append(seg.encode())
    return out


def test_the_state_string_reveals_nothing(sealed: dict[str, Any]) -> None:
    with _client(sealed) as c:
        sid, started = _start(c)
        state = started["state"]
        assert isinstance(state, str) and state.startswith("ctx1.k1.")
        assert started["session"] == {"session_id": sid, "step": 0, "version": 0}
        org = sealed["orgs"]["A"]
        planted = [PLANTED_USER, PLANTED_QUERY, PLANTED_DEVICE, org, "zebrafinch", "a-agent"]
        for blob in _decodings(state):
            for word in planted:
                assert word.encode().lower() not in blob.lower(), (word, blob[:80])
        # the service itself opens it: the planted values are inside
        inside = opened(sealed["old_settings"], state, sid, org)
        assert inside["user_query"] == PLANTED_QUERY and inside["last_device_id"] == PLANTED_DEVICE
        # GET .../state answers the latest state sealed too
        got = c.get(f"/v1/sessions/{sid}/state").json()
        assert got["state"].startswith("ctx1.k1.") and got["session"]["version"] == 0
        assert PLANTED_QUERY.encode() not in b"".join(_decodings(got["state"]))


def test_round_trip_and_an_edited_byte_is_refused(sealed: dict[str, Any]) -> None:
    with _client(sealed) as c:
        sid, started = _start(c)
        state = started["state"]
        head, data = state.rsplit(".", 1)
        i = len(data) // 2
        edited = f"{head}.{data[:i]}{'A' if data[i] != 'A' else 'B'}{data[i + 1 :]}"
        _refused(_event(c, sid, edited), "does not open")
        r = _event(c, sid, state)  # the untouched one still works: nothing was applied
        assert r.status_code == 200, r.text
        after = r.json()
        assert after["session"] == {"session_id": sid, "step": 1, "version": 1}
        assert after["state"] != state and after["state"].startswith("ctx1.k1.")
        ctx = {"session_id": sid, "step_intent": "default", "state": after["state"]}
        assert c.post("/v1/context", json=ctx).status_code == 200
        out = c.post(
            f"/v1/sessions/{sid}/outputs",
            json={"state": after["state"], "trace_id": "t-1", "output": "done"},
        )
        assert out.status_code == 200, out.text
        assert out.json()["session"] == after["session"]
        assert out.json()["state"] == after["state"]  # unchanged: the same string back


def test_a_state_moved_to_another_org_or_session_is_refused(sealed: dict[str, Any]) -> None:
    with _client(sealed, "a-agent") as a, _client(sealed, "b-agent") as b:
        sid, started = _start(a)
        state = started["state"]
        # org B's agent replays org A's state on org A's session id: sealed for org A, 403
        _refused(_event(b, sid, state), "another session or organisation")
        ctx = {"session_id": sid, "step_intent": "default", "state": state}
        _refused(b.post("/v1/context", json=ctx))
        # session X's state sent to session Y (both the caller's): 403
        other, _ = _start(a)
        _refused(_event(a, other, state), "another session or organisation")
        # too long: refused before anything is decoded
        too_long = "ctx1.k1." + "A" * sealed["old_settings"].l1_max_state_bytes
        _refused(_event(a, sid, too_long), "characters, over the")
        _refused(_event(a, sid, "not-a-state"), "not a sealed state")


def _legacy(sealed: dict[str, Any], sid: str, state: str) -> dict[str, Any]:
    """The same state in the old signed form, as a client holding one from before sends it."""
    settings = sealed["old_settings"]
    inside = opened(settings, state, sid, sealed["orgs"]["A"])
    client = redis_client(settings.redis_url)
    try:
        key = client.get(STATE_KEY)
    finally:
        client.close()
    wire = WireState.model_validate(inside)
    signed = wire.model_copy(update={"sig": _signature(key, wire.signed_part())})
    assert signed.verify(key)
    return json.loads(encode_json(signed))


def test_signed_states_open_inside_the_window_only(sealed: dict[str, Any]) -> None:
    with _client(sealed) as old, _client(sealed, which="new") as new:
        sid, started = _start(old)
        legacy = _legacy(sealed, sid, started["state"])
        _refused(_event(new, sid, legacy), "accepted until 2026-01-01", "CTX_STATE_LEGACY_UNTIL")
        forged = {**legacy, "current_step": 7}
        _refused(_event(old, sid, forged), "signature does not match")
        r = _event(old, sid, legacy)  # inside the window: accepted, answered sealed
        assert r.status_code == 200, r.text
        assert r.json()["state"].startswith("ctx1.k1.")


def test_rotation_old_key_opens_current_key_seals(sealed: dict[str, Any]) -> None:
    with _client(sealed) as old, _client(sealed, which="new") as new:
        sid, started = _start(old)
        r = _event(new, sid, started["state"])  # sealed with k1; k2 prepended: opens
        assert r.status_code == 200, r.text
        rotated = r.json()["state"]
        assert rotated.startswith("ctx1.k2.")
        # the old service never had k2: the refusal names the key id
        _refused(_event(old, sid, rotated), "key id 'k2'")


def _grpc_refusal(fn: Any, *args: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.RpcError) as info:
        fn(*args, **kwargs)
    status = rpc_status.from_call(info.value)
    assert status is not None
    reason = ""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            ei = error_details_pb2.ErrorInfo()
            detail.Unpack(ei)
            reason = ei.reason
    return info.value.code(), reason, status.message


def test_grpc_round_trip_and_refusals(sealed: dict[str, Any]) -> None:
    stub = pb_grpc.ContextServiceStub(sealed["channel"])
    md_a = (("authorization", f"Bearer {sealed['keys']['a-agent']}"),)
    md_b = (("authorization", f"Bearer {sealed['keys']['b-agent']}"),)
    sid = f"seal-g-{uuid.uuid4().hex[:12]}"
    created = stub.CreateSession(
        pb.CreateSessionRequest(session_id=sid, user_id=PLANTED_USER, user_query=PLANTED_QUERY),
        metadata=md_a,
        timeout=60,
    )
    assert created.state.startswith("ctx1.k1.")
    assert (created.session.session_id, created.session.version) == (sid, 0)
    assert PLANTED_QUERY.encode() not in b"".join(_decodings(created.state))
    event = pb.Event(context_overflow=pb.ContextOverflow())
    after = stub.PostEvent(
        pb.EventRequest(session_id=sid, state=created.state, event=event),
        metadata=md_a,
        timeout=60,
    )
    assert after.state.startswith("ctx1.k1.") and after.session.version == 1
    got = stub.GetState(pb.SessionRef(session_id=sid), metadata=md_a, timeout=60)
    assert got.session.version == 1 and got.state.startswith("ctx1.")
    # org B replays org A's state: PERMISSION_DENIED, state_refused, the same message as HTTP
    code, reason, message = _grpc_refusal(
        stub.PostEvent,
        pb.EventRequest(session_id=sid, state=after.state, event=event),
        metadata=md_b,
        timeout=60,
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED and reason == "state_refused"
    assert "another session or organisation" in message
    with _client(sealed, "b-agent") as b:
        assert _refused(_event(b, sid, after.state)) == message


def test_without_keys_one_random_key_is_shared_through_redis_and_never_logged(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import context_app.service.deps as deps

    monkeypatch.setattr(deps, "_warned_auto_key", False)
    settings = get_settings(redis_url=redis_url)
    assert settings.state_keys is None
    first, second = redis_client(redis_url, decode_responses=True), redis_client(redis_url)
    try:
        with caplog.at_level("WARNING", logger="context_app.service.deps"):
            ring_a = deps.load_seal_keyring(first, settings)  # two instances, one Redis
            ring_b = deps.load_seal_keyring(second, settings)
        stored = first.get(deps.SEAL_KEY)
    finally:
        first.close()
        second.close()
    assert ring_a.current == ring_b.current == "auto"
    assert ring_a.keys["auto"] == ring_b.keys["auto"] and len(ring_a.keys["auto"]) == 32
    warnings = [r for r in caplog.records if "CTX_STATE_KEYS is not set" in r.getMessage()]
    assert len(warnings) == 1  # once per process
    assert stored and stored not in caplog.text and "auto:" not in caplog.text
