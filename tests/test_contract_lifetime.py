"""Task-contract lifetime, session activity, timeout, expired keys and preference index, on
real servers: every test runs on Redis 7 (DB 13) and embedded Valkey (``any_redis``).

The issue's acceptance test is here in compressed form: a "47-minute session" is 10 s of
activity against a 2 s L2 default and a 5 s contract TTL; the step data written early
decays while the contract and its whole version history survive, because activity keeps
refreshing the contract.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import TESTS_DIR, CrowdedRedis, redis_client
from redis.cluster import RedisCluster
from redis.crc import key_slot
from test_working_memory import _Clock

from context_core.config import get_settings
from context_core.errors import AccessDeniedError, ConfigError, ContextError
from context_core.gateway.sanitize import Gateway
from context_core.lifecycle.manager import LifecycleManager
from context_core.redis.connection import RedisProvider, split_cluster_url
from context_core.session.state import SessionState
from context_core.working_memory import WorkingMemory
from context_core.working_memory.keys import check_kind

REPO = Path(__file__).resolve().parents[1]


class _Env:
    """WorkingMemory factory on one server; cleans every session, user and activity Set."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client: Any = redis_client(url, decode_responses=True)
        self.gateway = Gateway()
        self.sessions: list[str] = []
        self.users: list[str] = []
        self.activity = f"t-activity:{uuid.uuid4().hex[:10]}"

    def wm(self, **kw: Any) -> WorkingMemory:
        kw.setdefault("activity_key", self.activity)
        return WorkingMemory(self.client, self.gateway, **kw)

    def sid(self) -> str:
        sid = f"t-{uuid.uuid4().hex[:12]}"
        self.sessions.append(sid)
        return sid

    def user(self) -> str:
        uid = f"u-{uuid.uuid4().hex[:12]}"
        self.users.append(uid)
        return uid

    def close(self) -> None:
        wm = self.wm()
        for sid in self.sessions:
            wm.session(sid).clear()
        for uid in self.users:
            prefs = wm.preferences("default", uid)
            for t in prefs.all():
                prefs.delete(t)
        self.client.delete(self.activity)
        self.client.close()


@pytest.fixture
def env(any_redis: str) -> Iterator[_Env]:
    e = _Env(any_redis)
    try:
        yield e
    finally:
        e.close()


def _pttl(env: _Env, key: str) -> int:
    return int(env.client.pttl(key))


# ---- defaults come from the settings, not the 900 s L2 default ----------------------------


def test_default_contract_lifetime_is_two_hours_and_history_thirty_days(
    env: _Env, tmp_path: Path
) -> None:
    settings = get_settings(data_dir=tmp_path / "ctx", redis_url=env.url)
    assert (settings.wm_contract_ttl_s, settings.wm_contract_history_ttl_s) == (7200, 30 * 86400)
    assert settings.session_idle_s == 90
    provider = RedisProvider(settings)
    try:
        wm = WorkingMemory.from_settings(settings, provider, env.gateway)
        assert (wm.contract_ttl_s, wm.contract_history_ttl_s, wm.idle_s) == (7200, 2_592_000, 90)
        assert wm.default_ttl_s == 900
        sm = wm.session(env.sid())
        sm.put_step_result("s1", {"v": 1})
        sm.update_contract({"goal": "inspect line 3"}, expected_version=0)
        current, history = sm.key("contract", "current"), sm.key("contract", "history")
        assert 7_195_000 <= _pttl(env, current) <= 7_200_000
        assert 2_591_995_000 <= _pttl(env, history) <= 2_592_000_000
        assert 895_000 <= _pttl(env, sm.key("step", "s1")) <= 900_000  # data keeps 15 min
        assert 7_195_000 <= _pttl(env, sm.index_key) <= 7_200_000  # lives as the contract
        sm.lock_contract()  # the lock script uses the contract TTL too
        assert 7_195_000 <= _pttl(env, current) <= 7_200_000
    finally:
        provider.close()
    short = get_settings(
        data_dir=tmp_path / "ctx2",
        redis_url=env.url,
        wm_contract_ttl_s=600,
        wm_contract_history_ttl_s=3600,
        session_idle_s=30,
    )
    assert WorkingMemory.settings_kwargs(short)["contract_ttl_s"] == 600
    wm2 = env.wm(**WorkingMemory.settings_kwargs(short))
    sm2 = wm2.session(env.sid())
    sm2.update_contract({"goal": "g"}, expected_version=0)
    assert 595_000 <= _pttl(env, sm2.key("contract", "current")) <= 600_000
    assert 3_595_000 <= _pttl(env, sm2.key("contract", "history")) <= 3_600_000
    assert wm2.idle_s == 30


def test_contract_lifetime_settings_are_validated(env: _Env) -> None:
    with pytest.raises(ConfigError, match=r"HISTORY_TTL_S.*at least"):
        env.wm(contract_ttl_s=100, contract_history_ttl_s=50)
    with pytest.raises(ConfigError, match="must be positive"):
        env.wm(contract_ttl_s=0)
    with pytest.raises(ConfigError, match="activity_key"):
        env.wm(activity_key="ctx:{x}")


# ---- the 47-minute session, compressed -------------------------------------------------------


def test_compressed_47_minute_session_keeps_contract_and_history(env: _Env) -> None:
    """L2 default 2 s, contract 5 s; ~10 s of activity, one event per second (tool calls,
    a correction every 3 s, routes in between). The early step data expires, the contract
    and every version of it survive, and touch keeps refreshing the contract's PTTL. A
    control session with the same start and no activity loses its contract after 5 s."""
    wm = env.wm(default_ttl_s=2, contract_ttl_s=5, contract_history_ttl_s=60)
    gw = env.gateway
    mgr = LifecycleManager(wm=wm, gateway=gw)
    sid, control_sid = env.sid(), env.sid()
    state = mgr.handle(
        "session_start",
        None,
        session_id=sid,
        user_id="u-47",
        user_query="Diagnose PUMP-0042 and keep the report to 1 page",
        contract={"device": "PUMP-0042", "max_pages": 1},
    )
    control = wm.session(control_sid)
    control.update_contract({"goal": "idle twin"}, expected_version=0)
    sm = wm.session(sid)
    current, history = sm.key("contract", "current"), sm.key("contract", "history")
    state = mgr.handle("tool_call", state, name="sensor_api", args={"t": 0}, result={"rms": 2.0})
    early = [sm.key("step", "0"), sm.api_key("sensor_api", {"t": 0})]
    assert env.client.exists(*early) == 2

    started = time.monotonic()
    refreshed: list[int] = []
    versions = 1
    # ten ticks, however long each takes on a loaded machine: the assertions below count them
    for tick in range(1, 11):
        time.sleep(1.0)
        if tick % 3 == 0:
            versions += 1
            state = mgr.handle("user_correction", state, fields={"max_pages": tick})
        elif tick % 2 == 0:
            sm.touch()  # a route: the router touches the session once per route
        else:
            state = mgr.handle(
                "tool_call", state, name="sensor_api", args={"t": tick}, result={"rms": tick}
            )
        refreshed.append(_pttl(env, current))

    elapsed = time.monotonic() - started
    assert elapsed >= 10.0 > 5  # longer than the contract TTL itself
    assert env.client.exists(*early) == 0  # the 2 s data written at the start is gone
    assert all(sm.key_expired(k) for k in early)
    c = sm.contract()
    assert c.version == versions and c.status == "active"
    assert c.fields["device"] == "PUMP-0042" and c.fields["max_pages"] == 9
    hist = sm.contract_history()
    assert [h.version for h in hist] == list(range(1, versions + 1))  # every version kept
    assert [h.corrected for h in hist] == [False] + [True] * (versions - 1)
    assert all(4_000 <= p <= 5_000 for p in refreshed), refreshed  # refreshed on each tick
    assert 50_000 <= _pttl(env, history) <= 60_000
    assert env.client.exists(current) == 1
    assert control.contract().version == 0  # no activity: the contract died at 5 s
    assert env.client.exists(control.key("contract", "current")) == 0


# ---- touch: sliding refresh, resume, never create ----------------------------------------------


def test_touch_refreshes_resumes_and_records_activity(env: _Env) -> None:
    clock = _Clock()
    wm = env.wm(contract_ttl_s=100, contract_history_ttl_s=1000, now=clock)
    sm = wm.session(env.sid())
    current, history = sm.key("contract", "current"), sm.key("contract", "history")

    sm.touch()  # never creates a contract, but is activity
    assert env.client.exists(current, history) == 0
    assert wm.last_activity(sm.session_id) == clock.t

    sm.update_contract({"goal": "g"}, expected_version=0)
    env.client.pexpire(current, 3000)
    env.client.pexpire(history, 3000)
    env.client.pexpire(sm.index_key, 3000)
    clock.t += 42
    sm.touch()
    assert 99_000 <= _pttl(env, current) <= 100_000
    assert 999_000 <= _pttl(env, history) <= 1_000_000
    assert _pttl(env, sm.index_key) >= 99_000  # the index lives as long as the contract
    assert wm.last_activity(sm.session_id) == clock.t

    assert sm.expire_contract().status == "expired"
    assert sm.contract().status == "expired"
    sm.touch()
    assert sm.contract().status == "active"  # resumed by activity

    done = sm.complete_contract()
    assert done.status == "completed"
    env.client.pexpire(current, 3000)
    sm.touch()
    assert _pttl(env, current) <= 3000  # a completed task is not kept alive
    assert sm.contract().status == "completed"  # nor resumed


def test_touch_reloads_its_script_after_a_flush(embedded_valkey_url: str) -> None:
    """SCRIPT FLUSH (or a restart) between two touches: the pipelined EVALSHA reloads the
    script once. On the private embedded server only: the system Redis is shared."""
    env = _Env(embedded_valkey_url)
    try:
        wm = env.wm(contract_ttl_s=100)
        sm = wm.session(env.sid())
        sm.update_contract({"goal": "g"}, expected_version=0)
        env.client.script_flush()
        env.client.pexpire(sm.key("contract", "current"), 2000)
        sm.touch()
        assert _pttl(env, sm.key("contract", "current")) > 90_000
        assert wm.last_activity(sm.session_id) is not None
    finally:
        env.close()


# ---- statuses ---------------------------------------------------------------------------------


def test_contract_statuses_expire_complete_and_restart(env: _Env) -> None:
    sm = env.wm().session(env.sid())
    assert sm.expire_contract().version == 0 and sm.complete_contract().version == 0
    assert env.client.exists(sm.key("contract", "current")) == 0  # nothing created
    c1 = sm.update_contract({"goal": "g", "n": 1}, expected_version=0)
    assert c1.status == "active"
    assert sm.expire_contract().status == "expired"
    c2 = sm.update_contract({"n": 2}, expected_version=1)  # a new version is active work
    assert c2.status == "active"
    done = sm.complete_contract()
    assert (done.status, done.version, done.fields) == ("completed", 2, {"goal": "g", "n": 2})
    assert sm.complete_contract().status == "completed"  # idempotent: archived once
    assert sm.expire_contract().status == "completed"  # a timeout does not undo the goal
    hist = sm.contract_history()
    assert [(h.version, h.status) for h in hist] == [(1, "active"), (2, "active"), (2, "completed")]


# ---- timeout ----------------------------------------------------------------------------------


def test_timeout_keeps_only_the_contract_and_its_history(env: _Env) -> None:
    wm = env.wm()
    sm = wm.session(env.sid())
    sm.put_api_response("/pumps", {"id": 1}, {"p": 1})
    sm.put_step_result("s1", {"v": 1})
    sm.add_series_point("rms", 1.0, 2.0)
    sm.add_pending("task-1")
    sm.update_contract({"goal": "g"}, expected_version=0)
    sm.touch()
    listed = sm.keys()
    data = [k for k in listed if ":contract:" not in k]
    assert len(data) == 4
    out = sm.timeout()
    assert out == {"deleted": 4, "contract_version": 1, "contract_status": "expired"}
    assert env.client.exists(*data) == 0
    assert sm.keys() == [sm.key("contract", "current"), sm.key("contract", "history")]
    assert set(env.client.smembers(sm.index_key)) == {sm.key("contract", "current")}
    assert set(env.client.smembers(sm.expired_key)) == set(data)
    assert 0 < _pttl(env, sm.expired_key) <= wm.contract_ttl_s * 1000  # bounded
    assert _pttl(env, sm.index_key) > 0  # the pending Set is gone: the index has a TTL again
    assert wm.last_activity(sm.session_id) is None
    assert all(sm.key_expired(k) for k in data)
    empty = wm.session(env.sid())
    assert empty.timeout() == {"deleted": 0, "contract_version": 0, "contract_status": "none"}


# ---- expired keys, answered by Redis ----------------------------------------------------------


def _wait_gone(client: Any, key: str) -> None:
    client.pexpire(key, 1)
    deadline = time.monotonic() + 5
    while client.exists(key) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not client.exists(key)


def test_key_expired_across_instances_processes_and_sweeps(env: _Env) -> None:
    sid = env.sid()
    a = env.wm().session(sid)
    other = redis_client(env.url, decode_responses=True)  # a second client
    try:
        b = WorkingMemory(other, Gateway()).session(sid)
        gone = a.put_api_response("/blip", {}, {"v": 1})
        kept = a.put_step_result("s1", {"v": 1})
        never = a.key("step", "never-written")
        assert not b.key_expired(gone) and not b.key_expired(kept) and not b.key_expired(never)
        _wait_gone(env.client, gone)
        assert b.key_expired(gone) and a.key_expired(gone)  # listed, now missing
        assert not b.key_expired(never)  # a miss is not an expiry

        code = (
            "import redis, sys\n"
            "from context_core.gateway.sanitize import Gateway\n"
            "from context_core.working_memory import WorkingMemory\n"
            f"sys.path.insert(0, {TESTS_DIR!r})\n"
            "from redis_cluster import redis_client\n"
            "c = redis_client(sys.argv[1], decode_responses=True)\n"
            "sm = WorkingMemory(c, Gateway()).session(sys.argv[2])\n"
            "print(sm.key_expired(sys.argv[3]), sm.key_expired(sys.argv[4]))\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code, env.url, sid, gone, kept],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["True", "False"]  # another process, same answer

        assert a.keys() == [kept]  # a sweep prunes the dead member from the index ...
        assert gone not in env.client.smembers(a.index_key)
        assert gone in env.client.smembers(a.expired_key)
        assert b.key_expired(gone)  # ... and the answer survives it
        assert 0 < _pttl(env, a.expired_key) <= 7_200_000

        a.put_api_response("/blip", {}, {"v": 2})  # written again: not expired
        assert not b.key_expired(gone)
        _wait_gone(env.client, gone)
        a.clear()
        assert not b.key_expired(gone) and not b.key_expired(kept)  # clear forgets
        assert env.client.exists(a.expired_key) == 0
        with pytest.raises(AccessDeniedError):
            a.key_expired(f"wm:{{{env.sid()}}}:step:s1")
    finally:
        other.close()


# ---- idle detection ---------------------------------------------------------------------------


def test_idle_sessions_and_forget_activity(env: _Env) -> None:
    clock = _Clock()
    wm = env.wm(now=clock, idle_s=90)
    a, b, c = (wm.session(env.sid()) for _ in range(3))
    a.touch()
    clock.t += 10
    b.touch()
    c.touch()
    clock.t += 60
    c.touch()
    t0 = clock.t
    assert wm.idle_sessions(now=t0) == []
    assert wm.idle_sessions(now=t0 + 21) == [a.session_id]  # a idle 91 s, b 81 s, c 21 s
    assert wm.idle_sessions(now=t0 + 35) == [a.session_id, b.session_id]  # oldest first
    assert wm.idle_sessions(now=t0 + 35, limit=1) == [a.session_id]
    assert wm.idle_sessions(now=t0 + 35, limit=0) == []
    clock.t = t0 + 35
    assert wm.idle_sessions() == [a.session_id, b.session_id]  # the store's clock by default
    wm.forget_activity(a.session_id)
    assert wm.idle_sessions(now=t0 + 1000) == [b.session_id, c.session_id]
    assert wm.last_activity(a.session_id) is None
    assert wm.last_activity(c.session_id) == t0


# ---- preferences: a per-user index, no SCAN ---------------------------------------------------


def test_preferences_all_reads_the_user_index_and_never_scans(
    any_redis: str, crowded_redis: CrowdedRedis
) -> None:
    env = _Env(any_redis)
    try:
        wm = env.wm()
        prefs = wm.preferences("default", env.user())
        prefs.set("units", {"pressure": "bar"}, confidence=0.8)
        prefs.set("language", "zh")
        prefs.set("tone", "brief", confidence=0.5)
        assert prefs.index_key == f"pref:{{default:{prefs.user_id}}}:_index"
        assert set(env.client.smembers(prefs.index_key)) == {"units", "language", "tone"}
        assert env.client.pttl(prefs.index_key) == -1
        with pytest.raises(ContextError):
            check_kind("_index")  # the index can never collide with a preference type
        got = crowded_redis.run_without_scan(lambda: prefs.all)
        assert {k: (v.value, v.confidence) for k, v in got.items()} == {
            "language": ("zh", 1.0),
            "tone": ("brief", 0.5),
            "units": ({"pressure": "bar"}, 0.8),
        }
        assert prefs.delete("tone") is True and prefs.delete("tone") is False
        assert set(env.client.smembers(prefs.index_key)) == {"units", "language"}
        assert set(prefs.all()) == {"units", "language"}
        env.client.delete(prefs.key("units"))  # a hash gone behind the index's back
        assert set(prefs.all()) == {"language"}
        other = wm.preferences("default", env.user())
        assert other.all() == {}
    finally:
        env.close()


def test_preferences_of_any_user_id_stay_in_their_own_slot(env: _Env) -> None:
    wm = env.wm()
    mail = wm.preferences("default", "alice@example.com")
    mail.set("language", "en")
    try:
        key = mail.key("language")
        assert key.startswith("pref:{default:h~") and "alice" not in key
        assert (
            key == f"pref:{{default:{mail.key_id}}}:language"
            and mail.user_id == "alice@example.com"
        )
        assert wm.preferences("default", "alice@example.com").get("language").value == "en"
        assert key_slot(key.encode()) == key_slot(mail.index_key.encode())
        assert wm.preferences("default", "bob@example.com").all() == {}
        with pytest.raises(ContextError, match="invalid user_id"):
            wm.preferences("default", "")
    finally:
        mail.delete("language")


# ---- cluster rule: every script's keys in one slot, the activity Set never inside ------------


class _SlotCheckingPipeline(redis.client.Pipeline):
    def execute(self, raise_on_error: bool = True) -> Any:
        for args, _ in self.command_stack:
            _check_script_call(args)
        return super().execute(raise_on_error=raise_on_error)


class _SlotCheckingRedis(redis.Redis):
    def execute_command(self, *args: Any, **options: Any) -> Any:
        _check_script_call(args)
        return super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        return _SlotCheckingPipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )


class _SlotCheckingCluster(RedisCluster):
    """The same check on the cluster client (its pipeline refuses scripts outright)."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        _check_script_call(args)
        return super().execute_command(*args, **options)


_SCRIPT_CALLS: list[tuple[str, list[str]]] = []


def _check_script_call(args: Any) -> None:
    name = str(args[0]).upper()
    if name not in ("EVALSHA", "EVAL"):
        return
    keys = [str(k) for k in args[3 : 3 + int(args[2])]]
    slots = {key_slot(k.encode()) for k in keys}
    assert len(slots) <= 1, f"{name} declares keys in {len(slots)} slots: {keys}"
    assert not any(k.startswith("ctx:") or "activity" in k for k in keys), keys
    _SCRIPT_CALLS.append((name, keys))


def test_every_script_keeps_to_one_slot_over_a_whole_session(env: _Env) -> None:
    """Redis Cluster comes later, but nothing here may stop it: each Lua call declares keys
    of one hash slot only (the session's or the user's), and the global activity Set is
    written by a plain command, never inside a script. On the cluster param the server
    enforces it as well (a cross-slot script is refused with CROSSSLOT)."""
    plain, cluster = split_cluster_url(env.url)
    checking = _SlotCheckingCluster if cluster else _SlotCheckingRedis
    client: Any = checking.from_url(plain, decode_responses=True)
    _SCRIPT_CALLS.clear()
    try:
        gw = Gateway()
        wm = WorkingMemory(client, gw, activity_key=env.activity, idle_s=1)
        mgr = LifecycleManager(wm=wm, gateway=gw, max_trace_tokens=60)
        sid = env.sid()
        uid = env.user()
        state = mgr.handle("session_start", None, session_id=sid, user_id=uid, user_query="q")
        for i in range(3):
            state = mgr.handle(
                "tool_call", state, name="api", args={"i": i}, result={"v": "x" * 40}
            )
        sm = wm.session(sid)
        sm.add_pending("t1")
        sm.remove_pending("t1")
        sm.key_expired(sm.key("step", "0"))
        state = mgr.handle("user_message", state, text="not 1 but 2")
        state = mgr.handle("error_recovery", state)
        state = mgr.handle("recovery_complete", state)
        assert isinstance(state, SessionState)
        mgr.sweep_idle(now=time.time() + 10)  # times the session out
        wm.preferences("default", uid).set("x", 1)
        mgr.handle("goal_achieved", state)
        assert len(_SCRIPT_CALLS) >= 15  # the check really saw the scripts
        assert env.client.zscore(env.activity, sid) is None
    finally:
        client.close()


# ---- bounded history: versions and days, trimmed in the write script, archived as digests ----


def test_contract_history_is_bounded_and_archived_as_digests(env: _Env, tmp_path: Path) -> None:
    """3 versions kept, 1 day: the sixth write leaves versions 4-6; two days later (an
    injected clock) the next write drops every older one but itself; the dropped versions are
    in the audit log as digests (version, time, SHA-256, changed field names), never values,
    and the session only as its SHA-256. The retention job bounds a list written before."""
    import hashlib
    import json

    clock = _Clock(1_800_000_000.0)
    audit = tmp_path / "audit" / "audit.jsonl"
    wm = env.wm(
        now=clock,
        contract_history_versions=3,
        contract_history_days=1,
        history_audit_path=audit,
    )
    sid = env.sid()
    sm = wm.session(sid)
    for v in range(6):
        sm.update_contract({"goal": f"secret-goal-{v}", "step": v}, expected_version=v)
        clock.t += 60
    assert [c.version for c in sm.contract_history()] == [4, 5, 6]
    assert sm.contract_history()[-1].fields == {"goal": "secret-goal-5", "step": 5}
    lines = [json.loads(x) for x in audit.read_text().splitlines()]
    assert [x["kind"] for x in lines] == ["contract_history_archive"] * 3
    archived = [e for x in lines for e in x["entries"]]
    assert [e["version"] for e in archived] == [1, 2, 3]
    assert all(e["changed"] == ["goal", "step"] and len(e["sha256"]) == 64 for e in archived)
    assert lines[0]["session_sha256"] == hashlib.sha256(sid.encode()).hexdigest()
    assert "secret-goal" not in audit.read_text() and sid not in audit.read_text()

    clock.t += 2 * 86_400  # every kept version is now older than a day
    sm.update_contract({"step": 7}, expected_version=6)
    assert [c.version for c in sm.contract_history()] == [7]  # the newest always stays
    last = json.loads(audit.read_text().splitlines()[-1])
    assert [e["version"] for e in last["entries"]] == [4, 5, 6]
    assert last["entries"][-1]["changed"] == ["goal", "step"]
    sm.complete_contract()  # the completed snapshot is appended and bounded the same way
    assert [c.status for c in sm.contract_history()] == ["active", "completed"]

    # a list written before the bound (or by an older release): the retention job's trim
    old = env.sid()
    sm_old = env.wm(now=clock, contract_history_versions=50).session(old)
    for v in range(5):
        sm_old.update_contract({"goal": f"g{v}"}, expected_version=v)
    bounded = wm.session(old)
    assert bounded.trim_contract_history(dry_run=True) == 2
    assert len(bounded.contract_history()) == 5  # a dry run changes nothing
    assert bounded.trim_contract_history() == 2
    assert [c.version for c in bounded.contract_history()] == [3, 4, 5]
    assert bounded.trim_contract_history() == 0  # idempotent
    later = clock() + 3 * 86_400
    assert bounded.trim_contract_history(now=later) == 2  # age, from the job's clock
    assert [c.version for c in bounded.contract_history()] == [5]


def test_contract_history_bounds_are_settings(env: _Env, tmp_path: Path) -> None:
    settings = get_settings(data_dir=tmp_path / "ctx", redis_url=env.url)
    assert (settings.wm_contract_history_versions, settings.wm_contract_history_days) == (50, 7)
    kw = WorkingMemory.settings_kwargs(settings)
    assert kw["history_audit_path"] == tmp_path / "ctx" / "audit" / "audit.jsonl"
    with pytest.raises(ConfigError, match="CTX_WM_CONTRACT_HISTORY_VERSIONS"):
        env.wm(contract_history_versions=0)
    with pytest.raises(ConfigError, match="CTX_WM_CONTRACT_HISTORY_DAYS"):
        get_settings(data_dir=tmp_path / "ctx", wm_contract_history_days=0)
