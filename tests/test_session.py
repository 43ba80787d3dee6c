"""L1 session state: immutability, persistence refusal, bounded trace, cleaning, isolation."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import json
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from context_core.errors import ContextError, PersistenceRefusedError
from context_core.gateway.sanitize import Gateway
from context_core.session.state import (
    TRACE_PAIRS,
    ApiResultPointer,
    AuthContext,
    SessionState,
    TraceItem,
    bind_session,
    current_session,
    normalize_url,
    strip_emoji,
    update_current,
)


@pytest.fixture
def gw() -> Gateway:
    return Gateway()


@pytest.fixture
def state(gw: Gateway) -> SessionState:
    auth = AuthContext.from_token("agent-7", "tok-" + "x" * 20, scopes=("read",))
    return SessionState.start("s-1", "u-1", "check pump-0042 pressure", gateway=gw, auth=auth)


# ---- immutability ----------------------------------------------------------------------


def test_frozen_and_slotted(state: SessionState) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.current_step = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.trace = ()  # type: ignore[misc]
    assert not hasattr(state, "__dict__")
    with pytest.raises((AttributeError, TypeError)):
        object.__setattr__(state, "surprise", 1)


def test_advance_returns_new_instance_and_keeps_old(state: SessionState) -> None:
    nxt = state.advance(current_step=2, last_device_id="pump-0042")
    assert nxt is not state
    assert (state.current_step, state.last_device_id) == (0, None)
    assert (nxt.current_step, nxt.last_device_id) == (2, "pump-0042")
    assert nxt.session_id == state.session_id and nxt.start_time == state.start_time
    assert nxt.auth_context is state.auth_context
    assert nxt.device_prefix == "PUMP"
    assert state.device_prefix is None


@pytest.mark.parametrize(
    ("device", "prefix"),
    [("pump-0042", "PUMP"), ("FAN_12", "FAN"), ("comp7", "COMP"), ("42-x", None), ("", None)],
)
def test_device_prefix(state: SessionState, device: str, prefix: str | None) -> None:
    assert state.advance(last_device_id=device).device_prefix == prefix


def test_advance_refuses_identity_and_trace(state: SessionState) -> None:
    with pytest.raises(ContextError, match="session_id"):
        state.advance(session_id="other")
    with pytest.raises(ContextError, match="record_tool_call"):
        state.advance(trace=())
    with pytest.raises(ContextError, match="current_step"):
        state.advance(current_step=-1)


def test_auth_context_kept_apart(state: SessionState, gw: Gateway) -> None:
    token_hash = hashlib.sha256(("tok-" + "x" * 20).encode()).hexdigest()
    assert state.auth_context.token_sha256 == token_hash
    assert "auth" not in repr(state) and "agent-7" not in repr(state)
    assert token_hash not in repr(state.auth_context)
    other = SessionState.start(
        "s-1",
        "u-1",
        "check pump-0042 pressure",
        gateway=gw,
        auth=AuthContext("someone-else"),
        start_time=state.start_time,
    )
    assert other == state  # equality ignores auth and gateway


def test_gateway_required(gw: Gateway) -> None:
    with pytest.raises(ContextError, match="Gateway"):
        SessionState("s", "u", 0.0, "q", gateway=None)  # type: ignore[arg-type]


def test_outside_replace_is_cleaned_too(state: SessionState) -> None:
    secret = "sk_live_" + "Q" * 24
    sneaky = dataclasses.replace(state, user_query=f"use key {secret} please")
    assert secret not in sneaky.user_query
    assert "[REDACTED]" in sneaky.user_query
    direct = SessionState("s-2", "u", 0.0, f"token {secret}", gateway=state.gateway)
    assert secret not in direct.user_query
    with pytest.raises(ContextError, match="TraceItem"):
        dataclasses.replace(state, trace=("not an item",))
    forged = TraceItem("tool_call", "t", f'{{"k":"{secret}"}}', 0.0, "c1")
    assert secret not in dataclasses.replace(state, trace=(forged,)).trace[0].payload


@pytest.mark.parametrize(
    "text",
    [
        '{"rms_mm_s": 4.1, "status": "running"}',
        "call 13812341234 at https://Example.COM:443/a?utm_source=x&b=1 now",
        "pump \U0001f525 hot",
        "13812341234",
    ],
)
def test_clean_trace_text_remembers_only_text_it_leaves_alone(text: str) -> None:
    import context_core.session.state as session_mod

    fresh = session_mod.mask_mobile(session_mod._normalize_urls(session_mod.strip_emoji(text)))
    for _ in range(3):  # the second and third calls may come from the memo
        assert session_mod.clean_trace_text(text) == fresh
    assert (text in session_mod._TRACE_TEXT_UNCHANGED) == (fresh == text)


def test_a_trace_item_cleaned_on_the_way_in_is_cleaned_every_time(gw: Gateway) -> None:
    dirty = TraceItem("tool_result", "read", '{"phone":"13812341234"}', 1.0, "c1", "ok")
    clean = TraceItem("tool_result", "read", '{"rms":4.1}', 1.0, "c2", "ok")
    for _ in range(2):
        s = SessionState("s-9", "u", 0.0, "q", trace=(clean, dirty), gateway=gw)
        assert s.trace[0] is clean  # nothing to change: the item itself is kept
        assert "13812341234" not in s.trace[1].payload and "138****1234" in s.trace[1].payload


# ---- persistence refusal -----------------------------------------------------------------


def test_pickle_refused(state: SessionState) -> None:
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        with pytest.raises(PersistenceRefusedError, match="never pickled"):
            pickle.dumps(state, protocol=proto)
    with pytest.raises(PersistenceRefusedError):
        pickle.dumps(state.auth_context)


def test_deepcopy_refused_shallow_copy_is_identity(state: SessionState) -> None:
    with pytest.raises(PersistenceRefusedError):
        copy.deepcopy(state)
    with pytest.raises(PersistenceRefusedError):
        copy.deepcopy({"nested": [state]})
    assert copy.copy(state) is state


def test_refusal_is_a_type_error_for_generic_callers(state: SessionState) -> None:
    with pytest.raises(TypeError):
        state.__reduce_ex__(2)
    with pytest.raises(TypeError):
        state.__getstate__()
    with pytest.raises(TypeError):
        state.__setstate__({})
    with pytest.raises(TypeError):
        state.auth_context.__getstate__()


# ---- trace -------------------------------------------------------------------------------


def _pairs(trace: tuple) -> list[tuple[str, tuple[str, ...]]]:
    out: dict[str, list[str]] = {}
    for item in trace:
        out.setdefault(item.call_id, []).append(item.kind)
    return [(k, tuple(v)) for k, v in out.items()]


def test_trace_bounded_to_ten_pairs(state: SessionState) -> None:
    s = state
    for i in range(25):
        s = s.record_tool_call("read_sensor", {"i": i}, call_id=f"c{i}")
        s = s.record_tool_result(f"c{i}", {"v": i * 1.5}, status="ok")
        assert s.trace_pairs == min(i + 1, TRACE_PAIRS)
    assert len(s.trace) == 2 * TRACE_PAIRS
    assert [c for c, _ in _pairs(s.trace)] == [f"c{i}" for i in range(15, 25)]
    assert all(kinds == ("tool_call", "tool_result") for _, kinds in _pairs(s.trace))
    assert json.loads(s.trace[-1].payload) == {"v": 36.0}
    assert s.trace[-1].status == "ok"
    expected = hashlib.sha256(s.trace[-1].payload.encode()).hexdigest()
    assert s.last_api_result == ApiResultPointer("ok", expected)


def test_interleaved_and_open_pairs_never_split(state: SessionState) -> None:
    s = state
    # c0 stays open the whole time; others close out of order.
    s = s.record_tool_call("slow_job", {}, call_id="c0")
    for i in range(1, 10):
        s = s.record_tool_call("t", {"i": i}, call_id=f"c{i}")
    for i in range(9, 0, -1):
        s = s.record_tool_result(f"c{i}", i, status="ok")
    assert s.open_calls == ("c0",)
    assert s.trace_pairs == 10
    # An 11th pair evicts the oldest pair (the open c0) as a whole.
    s = s.record_tool_call("t", {"i": 10}, call_id="c10")
    assert s.trace_pairs == 10
    assert "c0" not in {i.call_id for i in s.trace}
    assert s.open_calls == ("c10",)
    for _, kinds in _pairs(s.trace):
        assert kinds[0] == "tool_call" and len(kinds) <= 2
    with pytest.raises(ContextError, match="evicted while open"):
        s.record_tool_result("c0", "late", status="ok")
    with pytest.raises(ContextError, match="already has a result"):
        s.record_tool_result("c5", 1, status="ok")
    with pytest.raises(ContextError, match="already in the trace"):
        s.record_tool_call("t", {}, call_id="c5")


def test_drop_and_keep_count_pairs(state: SessionState) -> None:
    s = state
    for i in range(6):
        s = s.record_tool_call("t", {"i": i}, call_id=f"c{i}")
        if i != 4:
            s = s.record_tool_result(f"c{i}", i, status="ok")
    dropped = s.drop_last_trace_items(2)
    assert [c for c, _ in _pairs(dropped.trace)] == ["c0", "c1", "c2", "c3"]
    kept = s.keep_last_trace_items(3)
    assert [c for c, _ in _pairs(kept.trace)] == ["c3", "c4", "c5"]
    assert kept.open_calls == ("c4",)
    assert s.keep_last_trace_items(0).trace == ()
    assert s.drop_last_trace_items(100).trace == ()
    assert s.trace_pairs == 6  # the original is untouched


def test_trace_input_cleaning(state: SessionState) -> None:
    secret = "sk_live_" + "Z" * 24
    args = {
        "note": "pump hot 🔥🔥 call 13812341234 👍🏽 now",
        "url": "HTTPS://Docs.Example.COM:443/a/b?z=1&utm_source=x&a=2&UTM_Medium=y#frag",
        "nested": [{"api_key": secret}, f"text with {secret}"],
    }
    s = state.record_tool_call("fetch_doc 📄", args, call_id="c1")
    item = s.trace[0]
    payload = json.loads(item.payload)
    assert item.name == "fetch_doc"
    assert payload["note"] == "pump hot call 138****1234 now"
    assert payload["url"] == "https://docs.example.com/a/b?a=2&z=1"
    assert secret not in item.payload
    assert payload["nested"][0]["api_key"] == "[REDACTED]"


def test_url_normalisation_rules() -> None:
    assert normalize_url("HTTP://Example.com:80/x?b=2&a=1&a=0&fbclid=zz") == (
        "http://example.com/x?a=0&a=1&b=2"
    )
    assert normalize_url("https://user:pw@Host.io:8443/p#top") == "https://user@host.io:8443/p"
    assert strip_emoji("ok ✅ done 🇨🇳!") == "ok done !"
    assert strip_emoji("plain ascii") == "plain ascii"


# ---- isolation ---------------------------------------------------------------------------


def test_current_session_needs_binding() -> None:
    with pytest.raises(ContextError, match="bind_session"):
        current_session()


def test_update_current_refuses_other_session(state: SessionState, gw: Gateway) -> None:
    other = SessionState.start("s-other", "u", "q", gateway=gw)
    with bind_session(state):
        update_current(state.advance(current_step=1))
        assert current_session().current_step == 1
        with pytest.raises(ContextError, match="s-other"):
            update_current(other)
    with pytest.raises(ContextError):
        current_session()


def test_thread_isolation(gw: Gateway) -> None:
    barrier = threading.Barrier(8)

    def work(i: int) -> tuple[str, int, int]:
        with bind_session(SessionState.start(f"s-{i}", f"u-{i}", f"q{i}", gateway=gw)):
            barrier.wait(timeout=10)  # every thread has bound its own session by now
            for step in range(1, 51):
                update_current(current_session().advance(current_step=step + i))
                update_current(
                    current_session().record_tool_call("t", {"i": i}, call_id=f"{i}-{step}")
                )
            s = current_session()
            return s.session_id, s.current_step, s.trace_pairs

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(work, range(8)))
    assert results == [(f"s-{i}", 50 + i, 10) for i in range(8)]


def test_asyncio_task_isolation(gw: Gateway) -> None:
    async def agent(i: int) -> tuple[str, int]:
        with bind_session(SessionState.start(f"a-{i}", "u", f"q{i}", gateway=gw)):
            for step in range(1, 21):
                update_current(current_session().advance(current_step=step * (i + 1)))
                await asyncio.sleep(0)  # let the other tasks run in between
            return current_session().session_id, current_session().current_step

    async def main() -> list[tuple[str, int]]:
        with bind_session(SessionState.start("parent", "u", "q", gateway=gw)):
            results = await asyncio.gather(*(agent(i) for i in range(10)))
            assert current_session().session_id == "parent"  # children did not leak back
            return list(results)

    assert asyncio.run(main()) == [(f"a-{i}", 20 * (i + 1)) for i in range(10)]
