"""Lifecycle events on real Redis (and real Qdrant Edge + MiniLM for goal_achieved).

Every L2 test runs on both server kinds (``any_redis``: Redis 7 and embedded Valkey). The
platform-computed triggers (user_message, overflow, idle sweep, recovery_complete) are in
test_lifecycle_triggers.py.
"""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from conftest import CrowdedRedis, cleanup_keys, redis_client

from context_core.config import Settings, get_settings
from context_core.errors import ContextError, ContractLockedError, UnknownEventError
from context_core.gateway.sanitize import Gateway
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.embedding import load_encoder
from context_core.knowledge.memory import KnowledgeMemory
from context_core.lifecycle import manager as lifecycle
from context_core.lifecycle.manager import EFFECTS, EventResult, LifecycleEvent, LifecycleManager
from context_core.session.state import SessionState
from context_core.working_memory import SessionMemory, WorkingMemory
from context_core.working_memory.lifetime import ACTIVITY_KEY


@dataclass
class Env:
    mgr: LifecycleManager
    wm: WorkingMemory
    client: redis.Redis
    session_id: str
    user_id: str = "u-1"

    def sm(self) -> SessionMemory:
        return self.wm.session(self.session_id)

    def ttl(self, key: str) -> int:
        return int(self.client.ttl(key))

    def session_keys(self) -> list[str]:
        """Every key of the session on the server (a SCAN, for assertions only)."""
        return sorted(self.client.scan_iter(match=f"wm:{{{self.session_id}}}:*", count=1000))


def _teardown(url: str, client: redis.Redis, session_id: str, user_id: str) -> None:
    cleanup_keys(url, f"wm:{{{session_id}}}:*")
    cleanup_keys(url, f"pref:{{default:{user_id}}}:*")
    client.zrem(ACTIVITY_KEY, session_id)


@pytest.fixture
def env(any_redis: str, session_id: str) -> Iterator[Env]:
    client = redis_client(any_redis, decode_responses=True)
    gw = Gateway()
    wm = WorkingMemory(client, gw, default_ttl_s=900)
    mgr = LifecycleManager(wm=wm, gateway=gw, low_priority_ttl_s=30)
    e = Env(mgr, wm, client, session_id, f"u-{uuid.uuid4().hex[:10]}")
    yield e
    _teardown(any_redis, client, session_id, e.user_id)
    client.close()


@pytest.fixture
def knowledge_env(tmp_path: Path) -> Iterator[KnowledgeMemory]:
    settings = get_settings(data_dir=tmp_path / "ctx")
    store = EdgeStore(settings.qdrant_dir)
    km = KnowledgeMemory(store, load_encoder(settings), settings, Gateway())
    km.ensure_collections()
    yield km
    store.close()


def _start(env: Env) -> SessionState:
    return env.mgr.handle(
        "session_start",
        None,
        session_id=env.session_id,
        user_id=env.user_id,
        user_query="Why is PUMP-0042 vibrating? Keep the report under 1 page.",
        contract={"max_pages": 1},
        device_id="PUMP-0042",
    )


def _calls(env: Env, state: SessionState, n: int) -> SessionState:
    for i in range(n):
        state = env.mgr.handle(
            "tool_call",
            state,
            name="sensor_api",
            args={"device": "PUMP-0042", "page": i},
            result={"rms_mm_s": 2.0 + i},
            call_id=f"c{i}",
        )
    return state


def test_effects_table_covers_every_event() -> None:
    assert set(EFFECTS) == set(LifecycleEvent)
    assert [e.value for e in LifecycleEvent] == [
        "session_start",
        "tool_call",
        "user_correction",
        "context_overflow",
        "session_timeout",
        "goal_achieved",
        "error_recovery",
        "user_message",
        "recovery_complete",
    ]
    for ev, row in EFFECTS.items():
        assert row.event is ev and row.l1 and row.l2 and row.l3
    # the rows state the design's semantics the handlers implement (README renders them)
    assert "expired" in EFFECTS[LifecycleEvent.SESSION_TIMEOUT].l2
    assert EFFECTS[LifecycleEvent.SESSION_TIMEOUT].l1 == "trace cleared"
    assert "last_completed_task" in EFFECTS[LifecycleEvent.GOAL_ACHIEVED].l2
    assert "unlocked" in EFFECTS[LifecycleEvent.RECOVERY_COMPLETE].l2


def test_unknown_event_lists_valid_names(env: Env) -> None:
    state = _start(env)
    with pytest.raises(UnknownEventError, match="valid events: session_start, tool_call"):
        env.mgr.handle("session_paused", state)
    with pytest.raises(ContextError, match="accepted: fields, user_query"):
        env.mgr.handle("user_correction", state, field={"x": 1})
    with pytest.raises(ContextError, match="only session_start starts one"):
        env.mgr.handle("tool_call", None, name="x", args={}, result={})


def test_session_start_creates_l1_and_contract_v1(env: Env) -> None:
    state = _start(env)
    assert state.session_id == env.session_id
    assert state.current_step == 0
    assert state.last_device_id == "PUMP-0042"
    assert state.device_prefix == "PUMP"
    c = env.sm().contract()
    assert c.version == 1
    assert c.fields == {"goal": state.user_query, "max_pages": 1}
    assert c.corrected is False
    assert state.shared_state_ref == 1  # the L1 names the contract version it acted on


def test_tool_call_records_trace_and_stores_response(env: Env) -> None:
    state = _start(env)
    res = env.mgr.apply(
        "tool_call",
        state,
        name="sensor_api",
        args={"device": "PUMP-0042"},
        result={"rms_mm_s": 4.7, "status": "alarm"},
        call_id="c1",
        series={"PUMP-0042.vibration": [(1000.0, 4.1), (1001.0, 4.7)]},
    )
    new = res.state
    assert [(i.kind, i.call_id) for i in new.trace] == [("tool_call", "c1"), ("tool_result", "c1")]
    assert new.current_step == 1
    assert new.last_api_result is not None and new.last_api_result.status == "ok"
    sm = env.sm()
    assert sm.get_api_response("sensor_api", {"device": "PUMP-0042"}).value == {
        "rms_mm_s": 4.7,
        "status": "alarm",
    }
    assert res.effects["api_key"] == sm.api_key("sensor_api", {"device": "PUMP-0042"})
    assert res.effects["step_key"] == sm.key("step", "0")
    assert sm.get_step_result("0").value == {
        "rms_mm_s": 4.7,
        "status": "alarm",
        "tool": "sensor_api",
    }
    assert sm.series("PUMP-0042.vibration") == [(1000.0, 4.1), (1001.0, 4.7)]
    assert state.trace == ()  # the old snapshot is untouched


def test_user_correction_new_corrected_version_and_drops_three_pairs(env: Env) -> None:
    state = _calls(env, _start(env), 5)
    assert state.trace_pairs == 5
    new = env.mgr.handle("user_correction", state, fields={"device": "PUMP-0043"})
    assert new.trace_pairs == 2
    assert [i.call_id for i in new.trace if i.kind == "tool_call"] == ["c0", "c1"]
    c = env.sm().contract()
    assert c.version == 2
    assert c.corrected is True
    assert c.fields["device"] == "PUMP-0043"
    assert state.shared_state_ref == 1 and new.shared_state_ref == 2
    assert [v.corrected for v in env.sm().contract_history()] == [False, True]


def test_context_overflow_trims_trace_and_shortens_low_priority_ttls(env: Env) -> None:
    state = _calls(env, _start(env), 6)
    sm = env.sm()
    sm.add_series_point("PUMP-0042.vibration", 1.0, 2.0)
    api_key = sm.api_key("sensor_api", {"device": "PUMP-0042", "page": 0})
    step_key, series_key = sm.key("step", "0"), sm.key("series", "PUMP-0042.vibration")
    contract_key = sm.key("contract", "current")
    assert env.ttl(api_key) > 800 and env.ttl(step_key) > 800

    res = env.mgr.apply("context_overflow", state, keep_pairs=2)
    assert res.state.trace_pairs == 2
    assert [i.call_id for i in res.state.trace if i.kind == "tool_call"] == ["c4", "c5"]
    assert api_key in res.effects["shortened"] and series_key in res.effects["shortened"]
    assert 0 < env.ttl(api_key) <= 30
    assert 0 < env.ttl(series_key) <= 30
    assert env.ttl(step_key) > 800  # the session's own work keeps its TTL
    assert env.ttl(contract_key) > 800


def test_session_timeout_clears_trace_keeps_expired_contract(env: Env) -> None:
    """Design: clear the L1 trace, mark the contract expired and keep it (with its history),
    delete the other L2 keys; the session's next activity resumes the contract."""
    state = _calls(env, _start(env), 2)
    sm = env.sm()
    sm.add_pending("task-1")
    contract_key, history_key = sm.key("contract", "current"), sm.key("contract", "history")
    listed = sm.keys()
    data_keys = [k for k in listed if k not in (contract_key, history_key)]
    assert len(data_keys) == 5  # 2 api + 2 step + pending
    assert env.client.zscore(ACTIVITY_KEY, env.session_id) is not None  # events touched it
    contract_ttl = env.ttl(contract_key)

    res = env.mgr.apply("session_timeout", state)
    assert res.state.trace == () and state.trace_pairs == 2  # new state, old one untouched
    assert res.effects == {"deleted": 5, "contract_version": 1, "contract_status": "expired"}
    assert env.client.exists(*data_keys) == 0
    assert env.session_keys() == sorted([contract_key, history_key, sm.index_key, sm.expired_key])
    c = sm.contract()
    assert (c.status, c.version, c.fields["max_pages"]) == ("expired", 1, 1)
    assert contract_ttl - 5 <= env.ttl(contract_key) <= contract_ttl  # kept, not shortened
    assert [h.version for h in sm.contract_history()] == [1]
    assert all(sm.key_expired(k) for k in data_keys)  # gone, and known to be gone
    assert env.client.zscore(ACTIVITY_KEY, env.session_id) is None  # no longer idle-swept
    assert sm.keys() == sorted([contract_key, history_key])

    # the session comes back: any event resumes the contract
    back = env.mgr.apply("tool_call", res.state, name="sensor_api", args={}, result={"v": 1})
    assert sm.contract().status == "active"
    assert back.state.trace_pairs == 1
    assert env.client.zscore(ACTIVITY_KEY, env.session_id) is not None


def test_error_recovery_keeps_last_pair_and_locks_contract(env: Env) -> None:
    state = _calls(env, _start(env), 3)
    new = env.mgr.handle("error_recovery", state)
    assert [(i.kind, i.call_id) for i in new.trace] == [("tool_call", "c2"), ("tool_result", "c2")]
    assert env.sm().contract().locked is True
    with pytest.raises(ContractLockedError):
        env.mgr.handle("user_correction", new, fields={"x": 1})


def test_goal_achieved_archives_contract_and_records_last_task(env: Env) -> None:
    """Design: clear the trace, archive the contract version to history (completed), record
    last_completed_task in the user's long-term profile; other L2 keys expire after grace."""
    state = _calls(env, _start(env), 1)
    sm = env.sm()
    v2 = sm.update_contract({"max_pages": 2}, expected_version=1, corrected=True)
    sm.add_pending("task-1")  # no TTL until the goal is reached
    pending_key = sm.key("pending", "tasks")
    history_key = sm.key("contract", "history")
    assert env.ttl(pending_key) == -1
    res = env.mgr.apply("goal_achieved", state, grace_s=20)
    assert res.state.trace == ()
    assert res.effects["hot_ids"] == [] and res.effects["hot_scopes"] == []
    assert (res.effects["contract_version"], res.effects["contract_status"]) == (2, "completed")
    assert pending_key in res.effects["expiring"]
    assert history_key not in res.effects["expiring"]
    for key in env.session_keys():
        if key == history_key:
            assert env.ttl(key) > 29 * 86_400  # the audit history keeps its 30 days
        elif key != sm.expired_key:
            assert 0 < env.ttl(key) <= 20, key
    hist = sm.contract_history()
    assert [(h.version, h.status) for h in hist] == [(1, "active"), (2, "active"), (2, "completed")]
    assert hist[-1].fields == v2.fields
    assert sm.contract().status == "completed"
    assert env.client.zscore(ACTIVITY_KEY, env.session_id) is None

    pref = env.wm.preferences("default", env.user_id).get("last_completed_task")
    assert pref.value == res.effects["last_completed_task"]
    assert pref.value["session_id"] == env.session_id
    assert pref.value["goal"] == state.user_query
    assert pref.value["contract"] == {"max_pages": 2}
    assert pref.value["version"] == 2
    assert pref.value["completed_at"] == pytest.approx(time.time(), abs=30)
    assert env.client.pttl(f"pref:{{default:{env.user_id}}}:last_completed_task") == -1
    assert "last_completed_task" in env.wm.preferences("default", env.user_id).all()


def test_goal_achieved_profile_write_passes_the_gateway(env: Env) -> None:
    """The last_completed_task record is written through the gateway like every value."""
    secret = "sk_live_" + "q" * 24
    state = env.mgr.handle(
        "session_start",
        None,
        session_id=env.session_id,
        user_id="alice@example.com",  # outside the key alphabet: hashed into a key id
        user_query=f"rotate the key {secret}",
        contract={"ticket": "INC-7"},
    )
    try:
        res = env.mgr.apply("goal_achieved", state)
        task = env.wm.preferences("default", "alice@example.com").get("last_completed_task").value
        assert task == res.effects["last_completed_task"]
        assert secret not in str(task) and "[REDACTED]" in task["goal"]
        assert task["contract"] == {"ticket": "INC-7"}
    finally:
        env.wm.preferences("default", "alice@example.com").delete("last_completed_task")


def test_goal_achieved_promotes_confirmed_answers_to_hot(env: Env, knowledge_env: object) -> None:
    from context_core.knowledge.memory import KnowledgeMemory

    assert isinstance(knowledge_env, KnowledgeMemory)
    mgr = LifecycleManager(wm=env.wm, gateway=Gateway(), knowledge=knowledge_env)
    state = _calls(env, _start(env), 1)
    answer = "PUMP bearing wear shows as rising 2x running-speed vibration above 4.5 mm/s."
    res = mgr.apply(
        "goal_achieved",
        state,
        answers=[{"text": answer, "source": "case-PUMP-0042", "title": "Resolved case"}],
    )
    (hot_id,) = res.effects["hot_ids"]
    assert res.effects["contract_status"] == "completed"  # L2 and L3 effects together
    settings = knowledge_env.settings
    (point,) = knowledge_env.store.retrieve(settings.collection_hot, [hot_id])
    assert point.payload["text"] == answer
    assert point.payload["confirmed"] is True
    assert point.payload["section"] == "PUMP"
    assert point.payload["expires_at"] > time.time() + 71 * 3600
    assert env.session_id not in str(point.payload)


def test_scripted_demo_session_runs_every_layer(settings: Settings, redis_url: str) -> None:
    """The README's session-demo, on an empty knowledge base: L1+L2+NS still flow, traces exist."""
    from context_app.demo import AGENT, run_demo
    from context_core.traces import read_traces

    starts: list[int | None] = []
    result = run_demo(settings, on_start=starts.append)
    sid = result.session_id
    try:
        assert starts == [0]  # empty knowledge_main is reported before the first step
        assert [s.intent for s in result.steps] == [
            "fetch_sensor_data",
            "compare_vibration",
            "call_api",
            "generate_report",
        ]
        assert [e for e, _ in result.events] == [
            "session_start",
            "tool_call",
            "tool_call",
            "tool_call",
            "user_correction",
            "goal_achieved",
        ]
        compare = result.steps[1].bundle
        assert f"L2:wm:{{{sid}}}:series:PUMP-0042.vibration" in compare.sources
        assert "NS:ns:{fleet}:kv:baseline:PUMP" in compare.sources
        report = result.steps[3].bundle
        step2, contract = f"L2:wm:{{{sid}}}:step:2", f"L2:wm:{{{sid}}}:contract:current"
        assert {step2, contract} <= set(report.sources)  # kept within the bundle budget
        (current,) = [f for f in report.fragments if f.source == contract]
        assert current.content["version"] == 2  # the user's correction
        assert current.content["corrected"] is True
        assert current.content["status"] == "active"
        routes = list(read_traces(settings.traces_dir, kind="route"))
        outputs = list(read_traces(settings.traces_dir, kind="step_output"))
        assert [r["trace_id"] for r in routes] == [s.bundle.trace_id for s in result.steps]
        assert [o["trace_id"] for o in outputs] == [r["trace_id"] for r in routes]
        assert all(r["agent_id"] == AGENT for r in routes)
        (hot_id,) = result.events[-1][1]["hot_ids"]
        assert hot_id
    finally:
        cleanup_keys(redis_url, f"wm:{{{sid}}}:*")
        cleanup_keys(redis_url, "pref:{default:demo-user}:*")  # goal_achieved's last_completed_task
        c = redis_client(redis_url)
        c.zrem(ACTIVITY_KEY, sid)
        c.delete("ns:{fleet}:kv:baseline:PUMP")
        c.hdel("ns:{fleet}:acl", AGENT, "fleet-etl")
        c.close()


@pytest.mark.parametrize("event", ["context_overflow", "goal_achieved", "session_timeout"])
def test_ttl_events_touch_only_the_session_and_never_scan(
    crowded_redis: CrowdedRedis, event: str
) -> None:
    """Among 20k unrelated keys, each TTL-changing event works from the session's key index
    (and goal_achieved's profile write from the user's preference index): zero SCAN calls
    (INFO commandstats) and the same effects as before."""
    client = redis_client(crowded_redis.url, decode_responses=True)
    gw = Gateway()
    wm = WorkingMemory(client, gw, default_ttl_s=900)
    mgr = LifecycleManager(wm=wm, gateway=gw, low_priority_ttl_s=30, goal_grace_s=20)
    started: list[SessionMemory] = []
    users: list[str] = []

    def prepare() -> Callable[[], tuple[SessionMemory, list[str], EventResult]]:
        env = Env(mgr, wm, client, f"t-{uuid.uuid4().hex[:12]}", f"u-{uuid.uuid4().hex[:10]}")
        users.append(env.user_id)
        state = _calls(env, _start(env), 2)
        sm = env.sm()
        started.append(sm)
        sm.add_series_point("PUMP-0042.vibration", 1.0, 2.0)
        sm.add_pending("task-1")
        before = sm.keys()
        return lambda: (sm, before, mgr.apply(event, state))

    try:
        sm, before, res = crowded_redis.run_without_scan(prepare)
        # 2 api + 2 step + series + pending + contract current/history
        assert len(before) == 8 and all(k.startswith(f"wm:{{{sm.session_id}}}:") for k in before)
        contract = [sm.key("contract", "current"), sm.key("contract", "history")]
        data = [k for k in before if k not in contract]
        if event == "session_timeout":
            assert res.effects["deleted"] == 6
            assert client.exists(*data) == 0
            assert client.exists(*contract) == 2  # the contract stays, marked expired
            assert sm.contract().status == "expired"
        elif event == "goal_achieved":
            assert res.effects["expiring"] == [k for k in before if k != contract[1]]
            assert all(0 < client.ttl(k) <= 20 for k in [*data, contract[0], sm.index_key])
            assert client.ttl(contract[1]) > 29 * 86_400  # the history is kept for audit
        else:
            low = [k for k in before if ":api:" in k or ":series:" in k]
            assert len(low) == 3 and res.effects["shortened"] == low
            assert all(0 < client.ttl(k) <= 30 for k in low)
            assert all(client.ttl(k) > 800 or client.ttl(k) == -1 for k in set(before) - set(low))
            assert client.ttl(sm.index_key) == -1  # the pending Set still has no TTL
        assert client.exists(crowded_redis.prefix + "0", crowded_redis.prefix + "19999") == 2
    finally:
        for s in started:
            s.clear()
            client.zrem(ACTIVITY_KEY, s.session_id)
        for uid in users:
            wm.preferences("default", uid).delete("last_completed_task")
        client.close()


def test_lifecycle_builds_no_key_pattern() -> None:
    """The manager reaches L2 only through SessionMemory: no SCAN, no glob, no raw client."""
    src = inspect.getsource(lifecycle)
    for needle in ("scan_iter", ".scan(", "match=", "wm:{", "wm:\\{", "._r.", "pipeline("):
        assert needle not in src, needle
