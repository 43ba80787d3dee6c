"""Lifecycle triggers the platform computes itself, on both Redis kinds (``any_redis``):
user_message (correction rule), recovery_complete, activity on every event, the
token-counted overflow trigger (real MiniLM tokenizer and the heuristic), the idle sweep.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import cleanup_keys, redis_client

from context_core.config import get_settings
from context_core.errors import ConfigError, ContractLockedError
from context_core.gateway.sanitize import Gateway
from context_core.knowledge.embedding import Encoder
from context_core.lifecycle.manager import LifecycleManager
from context_core.lifecycle.tokens import (
    TraceTokenCounter,
    count_trace_tokens,
    heuristic_count_tokens,
    item_text,
)
from context_core.session.state import SessionState
from context_core.working_memory import SessionMemory, WorkingMemory


class _Clock:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


@dataclass
class Env:
    url: str
    client: Any
    gateway: Gateway
    activity: str
    sessions: list[str] = field(default_factory=list)
    users: list[str] = field(default_factory=list)

    def wm(self, **kw: Any) -> WorkingMemory:
        kw.setdefault("activity_key", self.activity)
        return WorkingMemory(self.client, self.gateway, **kw)

    def mgr(self, wm: WorkingMemory | None = None, **kw: Any) -> LifecycleManager:
        kw.setdefault("low_priority_ttl_s", 30)
        return LifecycleManager(wm=wm or self.wm(), gateway=self.gateway, **kw)

    def start(self, mgr: LifecycleManager, **contract: Any) -> SessionState:
        sid, uid = f"t-{uuid.uuid4().hex[:12]}", f"u-{uuid.uuid4().hex[:10]}"
        self.sessions.append(sid)
        self.users.append(uid)
        return mgr.handle(
            "session_start",
            None,
            session_id=sid,
            user_id=uid,
            user_query="Why is PUMP-0042 vibrating?",
            contract={"device": "PUMP-0042", "max_pages": 1, **contract},
        )


@pytest.fixture
def env(any_redis: str) -> Iterator[Env]:
    client = redis_client(any_redis, decode_responses=True)
    e = Env(any_redis, client, Gateway(), f"t-activity:{uuid.uuid4().hex[:10]}")
    try:
        yield e
    finally:
        for sid in e.sessions:
            cleanup_keys(any_redis, f"wm:{{{sid}}}:*")
        for uid in e.users:
            cleanup_keys(any_redis, f"pref:{{default:{uid}}}:*")
        client.delete(e.activity)
        client.close()


def _calls(mgr: LifecycleManager, state: SessionState, n: int, size: int = 10) -> SessionState:
    for i in range(n):
        state = mgr.handle(
            "tool_call",
            state,
            name="sensor_api",
            args={"device": "PUMP-0042", "page": i},
            result={"rms_mm_s": 2.0 + i, "note": "vibration reading " * size},
            call_id=f"c{i}",
        )
    return state


def _sm(mgr: LifecycleManager, state: SessionState) -> SessionMemory:
    return mgr.wm.session(state.session_id)


# ---- user_message: the correction rule -------------------------------------------------------


def test_user_message_applies_a_detected_correction(env: Env) -> None:
    mgr = env.mgr()
    state = _calls(mgr, env.start(mgr), 5)
    res = mgr.apply("user_message", state, text="Not PUMP-0042 but PUMP-0043, please")
    corr = res.effects["correction"]
    assert corr["detected"] is True and corr["fields"] == {"device": "PUMP-0043"}
    assert corr["confidence"] > 0.6 and corr["reasons"]
    assert res.effects["contract_version"] == 2 and res.effects["dropped_pairs"] == 3
    assert res.state.trace_pairs == 2  # user_correction semantics: newest 3 pairs dropped
    c = _sm(mgr, state).contract()
    assert (c.version, c.corrected, c.fields["device"]) == (2, True, "PUMP-0043")
    assert c.fields["max_pages"] == 1


@pytest.mark.parametrize(
    "text",
    [
        "Is it PUMP-0043?",  # a question
        "no problem, thanks",  # no correction cue
        "It should be PUMP-0042",  # agrees with the contract
        "Maybe the device should be PUMP-0043",  # hedged: 0.55
    ],
)
def test_user_message_without_a_correction_changes_nothing(env: Env, text: str) -> None:
    mgr = env.mgr()
    state = _calls(mgr, env.start(mgr), 3)
    res = mgr.apply("user_message", state, text=text)
    assert res.effects["correction"]["detected"] is False
    assert res.effects["correction"]["fields"] == {}
    assert set(res.effects) == {"correction"}
    assert res.state.trace == state.trace
    c = _sm(mgr, state).contract()
    assert (c.version, c.corrected, c.fields["device"]) == (1, False, "PUMP-0042")


def test_user_message_threshold_comes_from_settings(env: Env, tmp_path: Path) -> None:
    settings = get_settings(data_dir=tmp_path / "ctx", correction_min_confidence=0.8)
    wm = env.wm()
    mgr = LifecycleManager.from_settings(settings, wm=wm, gateway=env.gateway)
    assert mgr.correction_min_confidence == 0.8
    assert mgr.max_trace_tokens == settings.l1_max_trace_tokens == 2000
    state = env.start(mgr)
    weak = mgr.apply("user_message", state, text="I meant PUMP-0043")  # scores 0.65
    assert weak.effects["correction"]["detected"] is False
    assert weak.effects["correction"]["confidence"] == pytest.approx(0.65)
    strong = mgr.apply("user_message", state, text="not PUMP-0042 but PUMP-0043")
    assert strong.effects["correction"]["detected"] is True
    assert _sm(mgr, state).contract().fields["device"] == "PUMP-0043"
    with pytest.raises(ConfigError, match="correction_min_confidence"):
        env.mgr(correction_min_confidence=1.5)
    with pytest.raises(ConfigError, match="max_trace_tokens"):
        env.mgr(max_trace_tokens=0)


# ---- recovery_complete ------------------------------------------------------------------------


def test_recovery_complete_unlocks_the_contract(env: Env) -> None:
    mgr = env.mgr()
    state = _calls(mgr, env.start(mgr), 2)
    state = mgr.handle("error_recovery", state)
    assert _sm(mgr, state).contract().locked
    with pytest.raises(ContractLockedError):
        mgr.handle("user_correction", state, fields={"max_pages": 2})
    with pytest.raises(ContractLockedError):  # a detected correction hits the lock as well
        mgr.handle("user_message", state, text="max pages should be 2")
    res = mgr.apply("recovery_complete", state)
    assert res.effects == {"locked": False, "contract_version": 1}
    assert res.state is state
    assert _sm(mgr, state).contract().locked is False
    new = mgr.handle("user_correction", state, fields={"max_pages": 2})
    assert _sm(mgr, new).contract().fields["max_pages"] == 2


# ---- activity: every event touches, the ending ones leave ------------------------------------


def test_every_event_touches_the_session_except_the_ending_ones(env: Env) -> None:
    clock = _Clock()
    wm = env.wm(now=clock, contract_ttl_s=500)
    mgr = env.mgr(wm)
    state = env.start(mgr)
    sm = _sm(mgr, state)
    current = sm.key("contract", "current")
    steps: list[tuple[str, dict[str, Any]]] = [
        ("tool_call", {"name": "api", "args": {"q": 1}, "result": {"v": 1}}),
        ("user_correction", {"fields": {"max_pages": 2}}),
        ("user_message", {"text": "hello"}),
        ("context_overflow", {}),
        ("error_recovery", {}),
        ("recovery_complete", {}),
    ]
    for event, payload in steps:
        clock.t += 7
        env.client.pexpire(current, 2000)
        state = mgr.handle(event, state, **payload)
        assert wm.last_activity(state.session_id) == clock.t, event
        assert env.client.pttl(current) > 495_000, event  # the contract's TTL slid back
    clock.t += 7
    mgr.handle("session_timeout", state)
    assert wm.last_activity(state.session_id) is None  # timed out: not idle-swept again
    assert sm.contract().status == "expired"
    state = mgr.handle("tool_call", state, name="api", args={"q": 2}, result={"v": 2})
    assert sm.contract().status == "active"  # resumed by the next event
    mgr.handle("goal_achieved", state)
    assert wm.last_activity(state.session_id) is None
    assert sm.contract().status == "completed"


# ---- overflow: counted in tokens --------------------------------------------------------------


def test_overflow_trigger_with_the_heuristic(env: Env) -> None:
    mgr = env.mgr(max_trace_tokens=300)
    state = env.start(mgr)
    sm = _sm(mgr, state)
    sm.add_series_point("PUMP-0042.rms", 1.0, 2.0)
    series = sm.key("series", "PUMP-0042.rms")
    below = _calls(mgr, state, 2)
    tokens = mgr.trace_tokens(below)
    assert tokens == sum(heuristic_count_tokens(item_text(i)) for i in below.trace)
    assert 0 < tokens <= 300
    assert env.client.ttl(series) > 800
    res = mgr.apply(
        "tool_call",
        below,
        name="sensor_api",
        args={"device": "PUMP-0042", "page": 9},
        result={"rms_mm_s": 9.0, "note": "vibration reading " * 20},
        call_id="c9",
    )
    over = res.effects["overflow"]
    assert over["triggered"] is True and over["counted_with"] == "heuristic"
    assert over["tokens_before"] > 300 >= over["tokens_after"]
    assert over["tokens_after"] == mgr.trace_tokens(res.state)
    assert over["evicted_pairs"] >= 1
    kept = [i.call_id for i in res.state.trace if i.kind == "tool_call"]
    assert kept == ["c0", "c1", "c9"][over["evicted_pairs"] :]  # oldest evicted first
    assert series in over["shortened"] and 0 < env.client.ttl(series) <= 30
    step = sm.key("step", "0")
    assert env.client.ttl(step) > 800  # the session's own work keeps its TTL
    quiet = mgr.apply("tool_call", res.state, name="x", args={}, result={"v": 1}, call_id="q")
    assert "overflow" not in quiet.effects  # back under the budget: no trigger


def test_overflow_trigger_counts_with_the_embedding_tokenizer(env: Env, encoder: Encoder) -> None:
    calls: list[str] = []

    def count(text: str) -> int:
        calls.append(text)
        return encoder.count_tokens(text)

    mgr = env.mgr(count_tokens=count, max_trace_tokens=400)
    state = env.start(mgr)
    for i in range(12):
        state = mgr.handle(
            "tool_call",
            state,
            name="sensor_api",
            args={"device": "PUMP-0042", "page": i},
            result={"rms_mm_s": 2.0 + i, "note": "bearing wear vibration " * 6},
            call_id=f"c{i}",
        )
        exact = sum(encoder.count_tokens(item_text(t)) for t in state.trace)
        assert exact == mgr.trace_tokens(state) <= 400
    res = mgr.apply(
        "tool_call",
        state,
        name="sensor_api",
        args={"device": "PUMP-0042", "page": 99},
        result={"rms_mm_s": 9.9, "note": "轴承磨损导致振动 " * 30},
        call_id="big",
    )
    over = res.effects.get("overflow")
    assert over is not None and over["counted_with"] == "tokenizer"
    assert over["tokens_before"] > 400 >= over["tokens_after"]
    assert over["tokens_after"] == sum(encoder.count_tokens(item_text(t)) for t in res.state.trace)
    assert res.state.trace_pairs >= 1 and res.state.trace[-1].call_id == "big"
    # the per-text cache: each trace item is tokenized once, however often it is counted
    assert len(calls) == len(set(calls))


def test_token_counter_caches_and_the_heuristic_tracks_the_tokenizer(encoder: Encoder) -> None:
    seen: list[str] = []

    def count(text: str) -> int:
        seen.append(text)
        return len(text.split())

    counter = TraceTokenCounter(count)
    assert counter("a b c") == 3 and counter("a b c") == 3 and seen == ["a b c"]
    with pytest.raises(ConfigError):
        TraceTokenCounter(cache_size=0)
    samples = [
        'sensor_api {"device":"PUMP-0042","page":3}',
        'sensor_api ok {"rms_mm_s":4.7,"status":"alarm","readings":[1.5,2.0,3.25]}',
        'search_docs {"query":"bearing wear 2x running speed above 4.5 mm/s","top_k":5}',
        "https://example.com/api/v1/pumps?id=42&sort=desc",
        "不是PUMP-0042，是PUMP-0043。应该是三页",
    ]
    for s in samples:
        real, guess = encoder.count_tokens(s), heuristic_count_tokens(s)
        assert real * 0.85 <= guess <= real * 1.3, (s, real, guess)
    assert heuristic_count_tokens("") == 0


def test_count_trace_tokens_counts_names_and_payloads(env: Env) -> None:
    mgr = env.mgr()
    state = _calls(mgr, env.start(mgr), 2)
    n = count_trace_tokens(state)
    assert n == sum(heuristic_count_tokens(item_text(i)) for i in state.trace)
    assert count_trace_tokens(state, lambda t: 1) == 4  # 2 pairs = 4 items
    assert count_trace_tokens(state, TraceTokenCounter(lambda t: 2)) == 8
    assert all("sensor_api" in item_text(i) for i in state.trace)


# ---- idle sweep -------------------------------------------------------------------------------


def test_idle_sweep_times_out_untouched_sessions_only(env: Env) -> None:
    """idle_s=1, a real 1.2 s wait: the session nobody touched is timed out with
    session_timeout's L2 semantics; the one with a fresh event is left alone."""
    wm = env.wm(idle_s=1)
    mgr = env.mgr(wm)
    idle, busy = _calls(mgr, env.start(mgr), 2), _calls(mgr, env.start(mgr), 2)
    time.sleep(1.2)
    busy = mgr.handle("tool_call", busy, name="api", args={"q": 1}, result={"v": 1})
    assert wm.idle_sessions() == [idle.session_id]
    assert mgr.sweep_idle() == [idle.session_id]
    sm_idle, sm_busy = _sm(mgr, idle), _sm(mgr, busy)
    assert sm_idle.contract().status == "expired"
    assert sm_idle.keys() == [
        sm_idle.key("contract", "current"),
        sm_idle.key("contract", "history"),
    ]
    assert sm_idle.key_expired(sm_idle.key("step", "0"))
    assert sm_busy.contract().status == "active"
    assert len(sm_busy.keys()) == 2 + 3 * 2  # contract + history, 3 api + 3 step
    assert mgr.sweep_idle() == []  # already timed out: not in the activity Set any more
    assert wm.last_activity(busy.session_id) is not None


def test_idle_sweep_with_an_injected_clock_limit_and_bad_ids(env: Env) -> None:
    wm = env.wm(idle_s=90)
    mgr = env.mgr(wm)
    states = [env.start(mgr) for _ in range(3)]
    now = time.time()
    env.client.zadd(env.activity, {"bad}:id": now - 1000})  # a hand edit: dropped, not swept
    assert mgr.sweep_idle(now=now) == []  # nobody idle for 90 s yet
    first = mgr.sweep_idle(now=now + 91, limit=2)
    assert first == [s.session_id for s in states[:2]]
    assert env.client.zscore(env.activity, "bad}:id") is None
    assert mgr.sweep_idle(now=now + 91) == [states[2].session_id]
    out = mgr.timeout_session(states[0].session_id)  # again: nothing left to delete
    assert out == {
        "session_id": states[0].session_id,
        "deleted": 0,
        "contract_version": 1,
        "contract_status": "expired",
    }


def test_idle_sweep_spares_a_session_touched_after_listing(env: Env) -> None:
    wm = env.wm(idle_s=90)
    mgr = env.mgr(wm)
    state = env.start(mgr)
    now = time.time()
    listed = wm.idle_sessions(now=now + 91)
    assert listed == [state.session_id]
    env.client.zadd(env.activity, {state.session_id: now + 90})  # touched meanwhile

    class _Stale(WorkingMemory):
        def idle_sessions(self, now: float | None = None, limit: int = 500) -> list[str]:
            return listed  # what a racing sweep read a moment earlier

    stale = _Stale(env.client, env.gateway, activity_key=env.activity, idle_s=90)
    racing = LifecycleManager(wm=stale, gateway=env.gateway)
    assert racing.sweep_idle(now=now + 91) == []
    assert _sm(mgr, state).contract().status == "active"
