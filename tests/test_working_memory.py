"""L2 working memory on real servers: every test runs on Redis 7 (DB 13) and embedded Valkey."""

from __future__ import annotations

import random
import socket
import string
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import TESTS_DIR, CrowdedRedis, redis_client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from context_core.config import get_settings
from context_core.errors import (
    AccessDeniedError,
    BackendUnavailableError,
    ConfigError,
    ContextError,
    ContextMissError,
    ContractLockedError,
    VersionConflictError,
)
from context_core.gateway.sanitize import Gateway
from context_core.redis.connection import RedisProvider
from context_core.working_memory import (
    AnchoredPlan,
    PlannedStep,
    SessionMemory,
    StepPlan,
    WorkingMemory,
    ttl_from_plan,
)


def _sid() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


class _Clock:
    """A settable clock for ``WorkingMemory(now=...)``: plans age without sleeping."""

    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class _Env:
    """A WorkingMemory on one server plus bookkeeping so every test cleans up after itself."""

    def __init__(self, url: str) -> None:
        self.url = url
        # Any: redis-py's stubs type replies as bytes | str whatever decode_responses says.
        self.client: Any = redis_client(url, decode_responses=True)
        self.gateway = Gateway()
        self.clock = _Clock()
        self.wm = WorkingMemory(self.client, self.gateway, now=self.clock)
        self.sessions: list[SessionMemory] = []
        self.users: list[str] = []

    def session(self, sid: str | None = None) -> SessionMemory:
        s = self.wm.session(sid or _sid())
        self.sessions.append(s)
        return s

    def user(self) -> str:
        uid = f"u-{uuid.uuid4().hex[:12]}"
        self.users.append(uid)
        return uid

    def close(self) -> None:
        for s in self.sessions:
            s.clear()
        for uid in self.users:
            for k in self.client.scan_iter(match=f"pref:\\{{{uid}\\}}:*"):
                self.client.delete(k)
        self.client.close()


@pytest.fixture
def env(any_redis: str) -> Iterator[_Env]:
    e = _Env(any_redis)
    try:
        yield e
    finally:
        e.close()


# ---- keys and validation -----------------------------------------------------------------


def test_key_layout_and_hash_tag(env: _Env) -> None:
    s = env.session("abc-1")
    assert s.key("step", "s1") == "wm:{abc-1}:step:s1"
    k = s.api_key("/v1/pumps", {"b": 2, "a": [1, {"y": 1, "x": 2}]})
    assert k == s.api_key("/v1/pumps", {"a": [1, {"x": 2, "y": 1}], "b": 2})  # canonical
    assert k != s.api_key("/v1/pumps", {"b": 3, "a": [1, {"y": 1, "x": 2}]})
    assert k.startswith("wm:{abc-1}:api:") and len(k.rsplit(":", 1)[1]) == 64


@pytest.mark.parametrize(
    "bad", ["", "a}b", "a{b", "x}:step:s1", "a:b", "a b", "a\nb", "a*", "abc\n", "ab\r\n"]
)
def test_bad_session_ids_rejected(env: _Env, bad: str) -> None:
    with pytest.raises(ContextError, match="invalid session id"):
        env.wm.session(bad)


@pytest.mark.parametrize("bad", ["s1}:x", "a:b", "{s}", "x y", "*", "", "s1\n"])
def test_bad_idents_and_kinds_rejected(env: _Env, bad: str) -> None:
    s = env.session()
    s.put_step_result("s1", {"v": 1})  # a valid ident first: what passed once is remembered
    with pytest.raises(ContextError, match="invalid ident"):
        s.put_step_result(bad, {"v": 1})
    with pytest.raises(ContextError, match="invalid ident"):
        s.load("step", bad)
    with pytest.raises(ContextError, match="invalid kind"):
        s.load(bad or "Step:", "s1")


def test_an_id_valid_for_one_pattern_is_not_taken_for_another(env: _Env) -> None:
    """Ids a pattern passed are remembered per pattern: an ident seen before is still no
    session id or kind."""
    s = env.session()
    s.put_step_result("Step-7.x", {"v": 1})
    with pytest.raises(ContextError, match="invalid kind"):
        s.load("Step-7.x", "s1")
    with pytest.raises(ContextError, match="invalid session id"):
        env.wm.session("a" * 200)
    s.put_step_result("a" * 200, {"v": 1})  # fine as an ident (up to 256)
    with pytest.raises(ContextError, match="invalid session id"):
        env.wm.session("a" * 200)


def test_client_must_decode(any_redis: str) -> None:
    raw = redis_client(any_redis)
    try:
        with pytest.raises(ConfigError, match="decode_responses"):
            WorkingMemory(raw, Gateway())
    finally:
        raw.close()


def test_backend_errors_name_the_server() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = redis.Redis(
        host="127.0.0.1", port=port, decode_responses=True, socket_connect_timeout=0.5
    )
    s = WorkingMemory(dead, Gateway()).session("s-dead")
    with pytest.raises(BackendUnavailableError, match=f"127.0.0.1:{port}.*HSET") as ei:
        s.put_step_result("s1", {"v": 1})
    assert isinstance(ei.value.__cause__, redis.RedisError)


# ---- round trips and misses --------------------------------------------------------------


def test_step_and_api_round_trip(env: _Env) -> None:
    s = env.session()
    key = s.put_step_result("diagnose", {"status": "ok", "readings": [1.5, 2.0], "n": 3})
    got = s.get_step_result("diagnose")
    assert got.key == key
    assert got.value == {"status": "ok", "readings": [1.5, 2.0], "n": 3}
    assert got.stored_at == env.clock.t  # stamped by the injected clock
    assert got.ttl_s is not None and 895 <= got.ttl_s <= 900
    assert env.client.type(key) == "hash"

    akey = s.put_api_response("/pumps", {"id": "pump-0042"}, {"pressure": 4.2})
    api = s.get_api_response("/pumps", {"id": "pump-0042"})
    assert (api.key, api.value) == (akey, {"pressure": 4.2})
    assert api.stored_at == env.clock.t
    assert env.client.type(akey) == "string"
    bundle = s.fetch_bundle(["diagnose"], [("/pumps", {"id": "pump-0042"})])
    assert bundle[key].value == got.value and bundle[akey].value == {"pressure": 4.2}


def test_miss_names_the_key(env: _Env) -> None:
    s = env.session()
    with pytest.raises(ContextMissError) as ei:
        s.get_step_result("never")
    assert ei.value.key == s.key("step", "never")
    assert s.key("step", "never") in str(ei.value)
    with pytest.raises(ContextMissError) as ei2:
        s.get_api_response("/x", {"q": 1})
    assert ei2.value.key == s.api_key("/x", {"q": 1})
    with pytest.raises(ContextMissError, match="api:"):
        s.fetch_bundle([], [("/x", {"q": 1})])
    assert s.fetch_bundle(["never"], missing_ok=True) == {}
    with pytest.raises(ContextMissError, match="step:gone"):
        s.load("step", "gone")


def test_oversize_response_is_capped(env: _Env) -> None:
    s = env.session()
    s.put_api_response("/big", {}, {"blob": "x" * 20_000})
    assert s.get_api_response("/big", {}).value == {"error": "response too large"}


# ---- TTL from the dependency graph -------------------------------------------------------


def _plan(s3_start: float) -> StepPlan:
    return StepPlan.of(
        PlannedStep("s1"),
        PlannedStep("s2", ("s1",), 30.0),
        PlannedStep("s3", ("s1", "s2"), s3_start),
        PlannedStep("s4", ("s3",), 12.2),
        PlannedStep("s5", (), 5.0),
    )


def test_ttl_from_plan_arithmetic() -> None:
    plan = _plan(120.0)
    got = {s: ttl_from_plan(s, plan, default_ttl_s=900, min_ttl_s=1) for s in plan.steps}
    assert got == {"s1": 240, "s2": 240, "s3": 25, "s4": 900, "s5": 900}
    assert ttl_from_plan("s1", plan, default_ttl_s=900, factor=3.0) == 360
    # s4 (12.2 s x 2 = 25 s) still waits on s3
    assert ttl_from_plan("s3", _plan(0.0), default_ttl_s=60, min_ttl_s=1) == 25
    due_now = StepPlan.of(PlannedStep("a"), PlannedStep("b", ("a",), 0.0))
    assert ttl_from_plan("a", due_now, default_ttl_s=900, min_ttl_s=1) == 1


def test_ttl_floor_arithmetic() -> None:
    """max(min_ttl, ceil(remaining x factor)): the default floor is 60 s, and configurable."""
    plan = _plan(120.0)
    got = {s: ttl_from_plan(s, plan, default_ttl_s=900) for s in plan.steps}
    assert got == {"s1": 240, "s2": 240, "s3": 60, "s4": 900, "s5": 900}  # 25 s -> floor
    overdue = StepPlan.of(PlannedStep("a"), PlannedStep("b", ("a",), -300.0))
    assert ttl_from_plan("a", overdue, default_ttl_s=900) == 60
    assert ttl_from_plan("a", overdue, default_ttl_s=900, min_ttl_s=7) == 7
    assert ttl_from_plan("s1", plan, default_ttl_s=900, min_ttl_s=300) == 300  # floor > 240
    assert ttl_from_plan("s5", plan, default_ttl_s=900, min_ttl_s=5000) == 900  # no dependent
    with pytest.raises(ContextError, match="unknown step"):
        StepPlan.of(PlannedStep("b", ("nope",), 1.0))


def test_apply_plan_sets_and_extends_ttls(env: _Env) -> None:
    s = env.session()
    for step in ("s1", "s2", "s3"):
        s.put_step_result(step, {"out": step})
    applied = s.apply_plan(_plan(120.0))
    # s4/s5 have no stored output; s3's 12.2 s x 2 = 25 s is raised to the 60 s floor
    assert applied == {"s1": 240, "s2": 240, "s3": 60}
    assert 238 <= _secs(s, s.key("step", "s1")) <= 240
    assert 58 <= _secs(s, s.key("step", "s3")) <= 60
    # The plan slips: s3 now starts in 10 minutes -> s1 and s2 must live 20 minutes.
    applied = s.apply_plan(_plan(600.0))
    assert applied["s1"] == applied["s2"] == 1200
    assert 1198 <= _secs(s, s.key("step", "s1")) <= 1200
    assert 1198 <= _secs(s, s.key("step", "s2")) <= 1200
    # Writes after the plan is known get the plan's TTL, not the default.
    s.put_step_result("s4", {"out": "s4"})
    assert 898 <= _secs(s, s.key("step", "s4")) <= 900
    s.put_step_result("s1", {"out": "again"})
    assert 1198 <= _secs(s, s.key("step", "s1")) <= 1200


def _secs(s: SessionMemory, key: str) -> float:
    """Seconds left on one of the view's keys; fails on a key without TTL."""
    ttl = s.ttl(key)
    assert ttl is not None, f"{key} has no TTL"
    return ttl


def _step_ttl(env: _Env, sid: str, step: str) -> float:
    """Seconds left on a step key, read by the test's own client (no view involved)."""
    pttl = env.client.pttl(f"wm:{{{sid}}}:step:{step}")
    assert pttl > 0, f"step {step} of {sid} missing or without TTL ({pttl})"
    return pttl / 1000.0


def test_plan_governs_writes_through_fresh_views_and_clients(env: _Env) -> None:
    sid = env.session().session_id
    env.wm.session(sid).apply_plan(_plan(600.0))  # a view used once, as the router does
    # A second, fresh view on the same WorkingMemory knows the plan ...
    env.wm.session(sid).put_step_result("s1", {"out": "fresh view"})
    assert 1198 <= _step_ttl(env, sid, "s1") <= 1200
    # ... and so does a second WorkingMemory on its own client (another service process).
    other_client = redis_client(env.url, decode_responses=True)
    try:
        other = WorkingMemory(other_client, Gateway(), now=env.clock).session(sid)
        other.put_step_result("s2", {"out": "other client"})
        other.put_step_result("s3", {"out": "other client"})
        other.put_step_result("s5", {"out": "nobody waits"})
        other.put_step_result("extra", {"out": "not in plan"})
        other.put_step_result("s4", {"out": "explicit"}, ttl_s=42)
        assert other.current_plan() == env.wm.session(sid).current_plan()
    finally:
        other_client.close()
    assert 1198 <= _step_ttl(env, sid, "s2") <= 1200
    assert 58 <= _step_ttl(env, sid, "s3") <= 60  # s4 at 12.2 s x 2 = 25 -> 60 s floor
    assert 898 <= _step_ttl(env, sid, "s5") <= 900  # no dependent: default
    assert 898 <= _step_ttl(env, sid, "extra") <= 900
    assert 40 <= _step_ttl(env, sid, "s4") <= 42  # an explicit ttl_s wins
    assert env.wm.session(sid).get_step_result("s2").value == {"out": "other client"}


def test_plan_governs_a_write_from_another_process(env: _Env) -> None:
    """The real deployment: plan applied here, step written by a separate interpreter."""
    s = env.session()
    env.clock.t = time.time()  # the other process uses the real clock
    s.apply_plan(_plan(600.0))
    code = (
        "import sys, redis\n"
        "from context_core.gateway.sanitize import Gateway\n"
        "from context_core.working_memory import WorkingMemory\n"
        f"sys.path.insert(0, {TESTS_DIR!r})\n"
        "from redis_cluster import redis_client\n"
        "c = redis_client(sys.argv[1], decode_responses=True)\n"
        "WorkingMemory(c, Gateway()).session(sys.argv[2]).put_step_result('s1', {'by': 'p2'})\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, env.url, s.session_id],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert s.get_step_result("s1").value == {"by": "p2"}
    # 1200 s minus however long the subprocess took to start; far from the 900 s default.
    assert 1100 <= _step_ttl(env, s.session_id, "s1") <= 1200


def test_plan_starts_shift_as_time_passes(env: _Env) -> None:
    s = env.session()
    t0 = env.clock.t
    s.apply_plan(_plan(120.0), factor=3.0)
    stored = s.current_plan()
    assert stored is not None
    assert (stored.applied_at, stored.factor) == (t0, 3.0)
    assert stored.start_at["s3"] == t0 + 120.0  # absolute, not "120 s from whenever"
    assert stored.until("s1") == t0 + 120.0 and stored.until("s5") is None

    env.clock.t = t0 + 30.0
    later = env.wm.session(s.session_id)
    rel = later.current_plan().relative(env.clock())  # type: ignore[union-attr]
    assert rel.steps["s3"].est_start_s == 90.0 and rel.steps["s2"].est_start_s == 0.0
    assert rel.steps["s3"].depends_on == ("s1", "s2")
    later.put_step_result("s1", {"v": 1})
    assert 268 <= _step_ttl(env, s.session_id, "s1") <= 270  # (120 - 30) x 3

    env.clock.t = t0 + 119.9  # s3 is nearly due: ceil(0.1 x 3) = 1 s -> the 60 s floor
    env.wm.session(s.session_id).put_step_result("s2", {"v": 2})
    assert 58 <= _step_ttl(env, s.session_id, "s2") <= 60
    env.clock.t = t0 + 500.0  # overdue: the late s3 still finds s1 for a minute
    env.wm.session(s.session_id).put_step_result("s1", {"v": 3})
    assert 58 <= _step_ttl(env, s.session_id, "s1") <= 60

    # Re-planning from the later time re-anchors it, and re-EXPIREs what exists.
    env.clock.t = t0 + 1000.0
    assert later.apply_plan(_plan(60.0)) == {"s1": 120, "s2": 120}
    assert 118 <= _step_ttl(env, s.session_id, "s1") <= 120
    assert s.current_plan().start_at["s3"] == t0 + 1060.0  # type: ignore[union-attr]


@pytest.mark.parametrize(("env_value", "floor"), [(None, 60), ("7", 7)])
def test_ttl_floor_from_settings_keeps_an_overdue_input(
    any_redis: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    env_value: str | None,
    floor: int,
) -> None:
    """CTX_WM_MIN_TTL_S reaches both copies of the rule (Lua write, Python apply_plan)."""
    if env_value is None:
        monkeypatch.delenv("CTX_WM_MIN_TTL_S", raising=False)
    else:
        monkeypatch.setenv("CTX_WM_MIN_TTL_S", env_value)
    settings = get_settings(data_dir=tmp_path / "ctx", redis_url=any_redis)
    assert settings.wm_min_ttl_s == floor
    with RedisProvider(settings) as provider:
        wm = WorkingMemory.from_settings(settings, provider, Gateway())
        assert wm.min_ttl_s == floor
        s = wm.session(_sid())
        try:
            # "report" was due 5 minutes ago and has not run yet: its input must survive.
            overdue = StepPlan.of(PlannedStep("fetch"), PlannedStep("report", ("fetch",), -300.0))
            s.apply_plan(overdue)
            s.put_step_result("fetch", {"rms": 4.7})  # Lua copy of the rule
            ttl = s.ttl(s.key("step", "fetch"))
            assert ttl is not None and floor - 2 <= ttl <= floor
            assert s.apply_plan(overdue) == {"fetch": floor}  # Python copy of the rule
            s.put_step_result("other", {"v": 1})  # no dependent: default TTL, not the floor
            assert 898 <= _secs(s, s.key("step", "other")) <= 900
        finally:
            s.clear()


def test_min_ttl_must_be_positive(any_redis: str) -> None:
    c = redis_client(any_redis, decode_responses=True)
    try:
        with pytest.raises(ConfigError, match="CTX_WM_MIN_TTL_S"):
            WorkingMemory(c, Gateway(), min_ttl_s=0)
    finally:
        c.close()
    with pytest.raises(ConfigError, match="CTX_WM_MIN_TTL_S"):
        get_settings(wm_min_ttl_s=0)


def test_plan_key_lifetime_and_clear(env: _Env) -> None:
    s = env.session()
    plan_key = s.key("plan", "current")
    s.apply_plan(_plan(120.0))  # longest TTL handed out 240 s < default: keep 900 s
    assert env.client.type(plan_key) == "hash"
    assert 898 <= _secs(s, plan_key) <= 900
    s.apply_plan(_plan(3600.0))  # s1/s2 wait 2 h -> plan kept as long as their outputs
    assert 7198 <= _secs(s, plan_key) <= 7200
    s.put_step_result("s1", {"v": 1})
    assert s.clear() == 2
    assert env.client.exists(plan_key) == 0
    assert s.current_plan() is None
    s.put_step_result("s1", {"v": 1})  # no plan any more: default TTL
    assert 898 <= _step_ttl(env, s.session_id, "s1") <= 900


def test_plan_refuses_secret_looking_step_ids(env: _Env) -> None:
    s = env.session()
    for bad in ("sk_live_" + "a" * 24, "13812341234"):
        plan = StepPlan.of(PlannedStep("s1"), PlannedStep(bad, ("s1",), 10.0))
        with pytest.raises(ContextError, match="looks like a secret"):
            s.apply_plan(plan)
        assert s.current_plan() is None
    with pytest.raises(ContextError, match="factor"):
        s.apply_plan(_plan(10.0), factor=0.0)


def test_anchored_plan_round_trip() -> None:
    a = AnchoredPlan.anchor(_plan(120.0), now=1_800_000_000.5, factor=2.0)
    h = a.to_hash()
    assert h["until:s1"] == repr(1_800_000_120.5) and "until:s4" not in h
    assert AnchoredPlan.from_hash(h) == a
    assert AnchoredPlan.from_hash({}) is None
    rel, orig = a.relative(1_800_000_000.5).steps, _plan(120.0).steps
    assert {k: v.depends_on for k, v in rel.items()} == {k: v.depends_on for k, v in orig.items()}
    # absolute epoch floats keep starts to within a microsecond (12.2 -> 12.20000005)
    for k in orig:
        assert rel[k].est_start_s == pytest.approx(orig[k].est_start_s, abs=1e-6)
    at_now = {s: a.ttl(s, now=1_800_000_000.5, default_ttl_s=900) for s in a.start_at}
    assert at_now == {s: ttl_from_plan(s, _plan(120.0), default_ttl_s=900) for s in a.start_at}


# ---- series window -----------------------------------------------------------------------


def test_series_points_of_one_event_go_in_one_round_trip_and_trim_the_same(env: _Env) -> None:
    s = env.session()
    stamps = list(range(1200))
    random.Random(3).shuffle(stamps)
    s.add_series_points("fan-3.rms", [(1_700_000_000 + t, t * 0.25) for t in stamps[:700]])
    s.add_series_points("fan-3.rms", [(1_700_000_000 + t, t * 0.25) for t in stamps[700:]])
    key = s.key("series", "fan-3.rms")
    assert env.client.zcard(key) == 1000  # the newest 1,000, as point by point
    pts = s.series("fan-3.rms")
    assert [p[0] for p in pts] == [1_700_000_000 + t for t in range(200, 1200)]
    assert 0 < _secs(s, key) <= 900
    with pytest.raises(ContextError, match="must be finite"):
        s.add_series_points("fan-3.temp", [(1.0, 2.0), (2.0, float("nan"))])
    assert env.client.exists(s.key("series", "fan-3.temp")) == 0  # nothing of a bad batch
    s.add_series_points("fan-3.temp", [])  # nothing to add is not an error
    assert env.client.exists(s.key("series", "fan-3.temp")) == 0


def test_series_keeps_exactly_newest_1000(env: _Env) -> None:
    s = env.session()
    assert env.wm.series_window == 1000
    stamps = list(range(1500))
    random.Random(7).shuffle(stamps)
    for ts in stamps:
        s.add_series_point("pump-0042.pressure", 1_700_000_000 + ts, ts * 0.5)
    key = s.key("series", "pump-0042.pressure")
    assert env.client.zcard(key) == 1000
    pts = s.series("pump-0042.pressure")
    assert [p[0] for p in pts] == [1_700_000_000 + t for t in range(500, 1500)]
    assert pts[0][1] == 250.0 and pts[-1][1] == 749.5
    assert len(s.series("pump-0042.pressure", since=1_700_000_000 + 1400)) == 100
    assert 0 < _secs(s, key) <= 900


# ---- pending tasks -----------------------------------------------------------------------


def test_pending_set_has_no_ttl(env: _Env) -> None:
    s = env.session()
    s.add_pending("task-1")
    s.add_pending("task-2")
    key = s.key("pending", "tasks")
    assert env.client.pttl(key) == -1
    assert s.ttl(key) is None
    assert s.pending() == {"task-1", "task-2"}
    assert s.remove_pending("task-1") is True
    assert s.remove_pending("task-1") is False
    assert s.load("pending", "tasks").value == {"task-2"}
    assert s.load("pending", "tasks").ttl_s is None


# ---- task contract -----------------------------------------------------------------------


def test_contract_versions_lock_and_history(env: _Env) -> None:
    s = env.session()
    assert s.contract().version == 0
    c1 = s.update_contract({"goal": "fix pump", "budget": 100}, expected_version=0)
    assert (c1.version, c1.fields) == (1, {"goal": "fix pump", "budget": 100})
    c2 = s.update_contract({"budget": 80}, expected_version=1, corrected=True)
    assert c2.version == 2 and c2.corrected and c2.fields == {"goal": "fix pump", "budget": 80}
    with pytest.raises(VersionConflictError, match=r"version 2, expected 1"):
        s.update_contract({"budget": 1}, expected_version=1)
    s.lock_contract()
    assert s.contract().locked
    with pytest.raises(ContractLockedError, match="locked"):
        s.update_contract({"budget": 1}, expected_version=2)
    s.unlock_contract()
    c3 = s.update_contract({"deadline": "friday"}, expected_version=2)
    hist = s.contract_history()
    assert [h.version for h in hist] == [1, 2, 3]
    assert [h.corrected for h in hist] == [False, True, False]
    assert hist[0].fields == {"goal": "fix pump", "budget": 100}  # old versions kept
    assert c3.fields == {"goal": "fix pump", "budget": 80, "deadline": "friday"}
    hist_key, cur_key = s.key("contract", "history"), s.key("contract", "current")
    # The contract lives for the task (2 h), its history for the audit (30 d): neither
    # takes the 15-minute L2 default.
    assert 7190 <= _secs(s, cur_key) <= 7200
    assert 30 * 86_400 - 10 <= _secs(s, hist_key) <= 30 * 86_400
    assert {h.status for h in hist} == {"active"} and c3.status == "active"


def test_fifty_concurrent_writers_lose_nothing(env: _Env) -> None:
    s = env.session()
    s.update_contract({"goal": "inspect line 3"}, expected_version=0)
    initial = s.contract().version
    conflicts = [0] * 50
    start = threading.Barrier(50)

    def writer(i: int) -> None:
        client = redis_client(env.url, decode_responses=True)  # own connection
        try:
            # 51 versions: over the default bound of 50, so this history keeps 100
            mine = WorkingMemory(client, env.gateway, contract_history_versions=100).session(
                s.session_id
            )
            start.wait(timeout=30)
            while True:
                seen = mine.contract().version
                try:
                    mine.update_contract({f"w{i}": i}, expected_version=seen)
                    return
                except VersionConflictError:
                    conflicts[i] += 1
        finally:
            client.close()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    final = s.contract()
    assert final.version == initial + 50
    assert final.fields == {"goal": "inspect line 3", **{f"w{i}": i for i in range(50)}}
    versions = [h.version for h in s.contract_history()]
    assert versions == list(range(1, initial + 51))  # strictly increasing and complete
    # every version adds exactly one writer's field to the previous one: nothing lost
    sizes = [len(h.fields) for h in s.contract_history()]
    assert sizes == list(range(1, 52))
    assert sum(conflicts) > 0  # the writers really did race


# ---- isolation ---------------------------------------------------------------------------


def test_cross_session_read_impossible(env: _Env) -> None:
    a, b = env.session(), env.session()
    a.put_step_result("s1", {"owner": "A"})
    b.put_step_result("s1", {"owner": "B"})
    b.put_api_response("/pumps", {"id": 1}, {"owner": "B"})
    assert a.get_step_result("s1").value == {"owner": "A"}
    assert b.get_step_result("s1").value == {"owner": "B"}
    with pytest.raises(ContextMissError):
        a.get_api_response("/pumps", {"id": 1})  # same endpoint+params, other session
    with pytest.raises(AccessDeniedError, match="does not belong"):
        a.ttl(b.key("step", "s1"))
    # Crafted ids cannot climb out of A's hash tag.
    for crafted in (f"{a.session_id}}}:step:s1", f"x}}:step:{b.session_id}"):
        with pytest.raises(ContextError):
            env.wm.session(crafted)
    with pytest.raises(ContextError):
        a.load("step", f"{{{b.session_id}}}:step:s1")
    assert not hasattr(a, "get") and not hasattr(env.wm, "get")  # no raw-key read door
    with pytest.raises(AttributeError):
        a.session_id = b.session_id  # type: ignore[misc]  # a view never changes session
    assert a.clear() == 1
    assert b.get_step_result("s1").value == {"owner": "B"}  # A's clear left B alone


# ---- preferences -------------------------------------------------------------------------


def test_preferences_round_trip(env: _Env) -> None:
    uid = env.user()
    prefs = env.wm.preferences("default", uid)
    p = prefs.set("units", {"pressure": "bar"}, confidence=0.8)
    got = prefs.get("units")
    assert (got.value, got.confidence) == ({"pressure": "bar"}, 0.8)
    assert got.last_updated == pytest.approx(p.last_updated)
    prefs.set("language", "zh", confidence=1.0)
    assert {k: v.value for k, v in prefs.all().items()} == {
        "language": "zh",
        "units": {"pressure": "bar"},
    }
    assert env.client.hgetall(prefs.key("units"))["confidence"] == "0.8"
    assert env.client.pttl(prefs.key("units")) == -1
    with pytest.raises(ContextMissError) as ei:
        prefs.get("tone")
    assert ei.value.key == f"pref:{{default:{uid}}}:tone"
    with pytest.raises(ContextError, match="confidence"):
        prefs.set("units", "psi", confidence=1.5)


# ---- secrets never reach Redis -----------------------------------------------------------


def _raw_dump(url: str, patterns: list[str]) -> str:
    """Every byte stored under ``patterns``, read by a separate, non-decoding client."""
    c: Any = redis_client(url)  # stubs type replies bytes | str
    out: list[bytes] = []
    try:
        for pat in patterns:
            for k in c.scan_iter(match=pat, count=500):
                t = c.type(k)
                out.append(k)
                if t == b"string":
                    out.append(c.get(k) or b"")
                elif t == b"hash":
                    for f, v in c.hgetall(k).items():
                        out += [f, v]
                elif t == b"list":
                    out += c.lrange(k, 0, -1)
                elif t == b"set":
                    out += list(c.smembers(k))
                elif t == b"zset":
                    out += [m for m, _ in c.zrange(k, 0, -1, withscores=True)]
    finally:
        c.close()
    return b"\n".join(out).decode("utf-8", "replace")


def _write_everywhere(
    s: SessionMemory, prefs_user: str, wm: WorkingMemory, payload: object
) -> None:
    s.put_api_response("/tool", {"q": 1}, payload)
    s.put_step_result("step", {"result": payload})
    version = s.contract().version
    s.update_contract({"spec": payload}, expected_version=version)
    wm.preferences("default", prefs_user).set("style", payload, confidence=0.5)
    s.add_series_point("temp", 1.0, 2.0)


def test_fixed_secrets_never_reach_redis(env: _Env) -> None:
    s, uid = env.session(), env.user()
    live = "sk_live_" + "k" * 24
    pw = "hunter-" + "9" * 12
    payload = {
        "Authorization": "Bearer " + "t" * 30,
        "config": {"API_KEY": live, "Password": pw, "note": f"use {live} now"},
        "items": [{"token": pw}, f"call 13812341234 with {live}"],
    }
    _write_everywhere(s, uid, env.wm, payload)
    s.add_pending(live)
    raw = _raw_dump(env.url, [f"wm:\\{{{s.session_id}\\}}:*", f"pref:\\{{{uid}\\}}:*"])
    assert "[REDACTED]" in raw
    for secret in (live, pw, "t" * 30, "13812341234"):
        assert secret not in raw
    assert "138****1234" in raw


_ALNUM = string.ascii_letters + string.digits
_secret_value = st.text(_ALNUM, min_size=24, max_size=24).map(lambda s: "sk_live_" + s)
_secret_key = st.sampled_from(["api_key", "token", "password", "secret", "authorization"]).flatmap(
    lambda k: st.sampled_from([k, k.upper(), k.title(), f"x_{k}", f"{k.capitalize()}Value"])
)
_plain_key = st.text(string.ascii_lowercase, min_size=1, max_size=8).filter(
    lambda k: not any(w in k for w in ("key", "token", "pass", "secret", "auth", "cookie"))
)
_marker = st.text(_ALNUM, min_size=16, max_size=16).map(lambda s: "pv-" + s)
_leaf = st.one_of(
    st.integers(),
    st.text(string.ascii_letters + " ", max_size=20),
    _secret_value,
    st.tuples(st.text(string.ascii_letters, max_size=10), _secret_value).map(
        lambda t: f"{t[0]} {t[1]} tail"
    ),
)
_tree = st.recursive(
    _leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(_plain_key, children, max_size=4),
        st.tuples(_secret_key, _marker, st.dictionaries(_plain_key, children, max_size=3)).map(
            lambda t: {**t[2], t[0]: t[1]}
        ),
    ),
    max_leaves=12,
)


def _secrets_in(value: object) -> set[str]:
    found: set[str] = set()
    if isinstance(value, str):
        found |= {w for w in value.split() if w.startswith(("sk_live_", "pv-"))}
    elif isinstance(value, dict):
        for v in value.values():
            found |= _secrets_in(v)
    elif isinstance(value, list):
        for v in value:
            found |= _secrets_in(v)
    return found


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(tree=st.dictionaries(_plain_key, _tree, min_size=1, max_size=4))
def test_property_no_generated_secret_reaches_redis(env: _Env, tree: dict) -> None:
    s, uid = env.session(), env.user()
    _write_everywhere(s, uid, env.wm, tree)
    raw = _raw_dump(env.url, [f"wm:\\{{{s.session_id}\\}}:*", f"pref:\\{{{uid}\\}}:*"])
    leaked = {secret for secret in _secrets_in(tree) if secret in raw}
    assert not leaked
    s.clear()


# ---- key index ---------------------------------------------------------------------------


def _members(env: _Env, s: SessionMemory) -> set[str]:
    return set(env.client.smembers(s.index_key))


def _assert_index_outlives_members(env: _Env, s: SessionMemory) -> None:
    """The index TTL is >= every member's (none while a member never expires)."""
    idx = env.client.pttl(s.index_key)
    ttls = {m: env.client.pttl(m) for m in _members(env, s)}
    if any(t == -1 for t in ttls.values()):
        assert idx == -1, ttls
    else:
        assert idx > 0 and all(idx >= t - 5 for t in ttls.values()), (idx, ttls)


def test_index_lists_every_write_kind(env: _Env) -> None:
    s = env.session()
    k = s.key
    assert s.index_key == f"wm:{{{s.session_id}}}:index"
    assert s.keys() == [] and env.client.exists(s.index_key) == 0

    api = s.put_api_response("/pumps", {"id": 7}, {"p": 4.2})
    assert _members(env, s) == {api}
    assert 898_000 <= env.client.pttl(s.index_key) <= 900_000  # created with the key's TTL

    step = s.put_step_result("diagnose", {"v": 1}, ttl_s=2000)  # longer: index follows
    assert _members(env, s) == {api, step}
    assert 1_998_000 <= env.client.pttl(s.index_key) <= 2_000_000
    s.put_api_response("/short", {}, {"p": 1}, ttl_s=5)  # shorter: index keeps 2000 s
    assert 1_990_000 <= env.client.pttl(s.index_key) <= 2_000_000
    short = s.api_key("/short", {})

    s.add_series_point("PUMP-7.rms", 1.0, 2.0)
    s.update_contract({"goal": "g"}, expected_version=0)
    s.lock_contract()
    s.apply_plan(_plan(3600.0))  # s1/s2 wait 2 h: plan kept (and index raised to) 7200 s
    expected = {
        api,
        step,
        short,
        k("series", "PUMP-7.rms"),
        k("contract", "current"),
        k("plan", "current"),
    }
    # The contract history (30-day audit record) is found by its fixed name, never listed:
    # listing it would keep the index alive for 30 days.
    assert _members(env, s) == expected
    assert env.client.exists(k("contract", "history")) == 1
    assert 7_198_000 <= env.client.pttl(s.index_key) <= 7_200_000
    _assert_index_outlives_members(env, s)

    s.add_pending("task-1")  # a member without TTL: the index loses its TTL too
    s.add_pending("task-2")
    assert _members(env, s) == expected | {k("pending", "tasks")}
    assert env.client.pttl(s.index_key) == -1
    s.put_api_response("/later", {}, {"p": 2})  # a TTL write does not re-arm it
    assert env.client.pttl(s.index_key) == -1
    assert s.remove_pending("task-1") is True
    assert env.client.pttl(s.index_key) == -1  # task-2 still pending
    assert s.remove_pending("task-2") is True  # the Set is gone: refit to the longest member
    assert 7_190_000 <= env.client.pttl(s.index_key) <= 7_200_000
    _assert_index_outlives_members(env, s)

    # keys(): the members plus the fixed-name history; the index itself not listed
    assert s.keys() == sorted(expected | {s.api_key("/later", {}), k("contract", "history")})


def test_index_prunes_expired_members_lazily(env: _Env) -> None:
    s = env.session()
    keep = s.put_step_result("s1", {"v": 1})
    gone = s.put_api_response("/blip", {}, {"v": 2}, ttl_s=60)
    env.client.pexpire(gone, 1)  # let Redis expire it for real
    deadline = time.monotonic() + 5
    while env.client.exists(gone) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert _members(env, s) == {keep, gone}  # still listed: nothing pruned it yet
    assert s.keys() == [keep]
    assert _members(env, s) == {keep}  # keys() dropped the dead member


def test_expire_all_shortens_or_sets_and_refits_the_index(env: _Env) -> None:
    s = env.session()
    api = s.put_api_response("/a", {}, {"v": 1})
    step = s.put_step_result("s1", {"v": 1}, ttl_s=3000)
    s.add_series_point("x", 1.0, 1.0)
    series = s.key("series", "x")
    s.add_pending("t1")
    pending = s.key("pending", "tasks")

    assert s.expire_all(100, only_shorten=True, kinds=["api", "series"]) == sorted([api, series])
    assert 98 <= _secs(s, api) <= 100 and 2990 <= _secs(s, step) <= 3000
    assert s.ttl(pending) is None and env.client.pttl(s.index_key) == -1
    assert s.expire_all(200, only_shorten=True, kinds=["api"]) == []  # LT: never lengthens
    assert s.expire_all(1, only_shorten=True, kinds=[]) == []  # no kinds: nothing to do

    assert s.expire_all(500, only_shorten=True) == sorted([step, pending])  # api/series < 500
    assert 490 <= _secs(s, step) <= 500 and 490 <= _secs(s, pending) <= 500
    assert 98 <= _secs(s, api) <= 100  # already shorter than 500
    assert 498_000 <= env.client.pttl(s.index_key) <= 500_000  # refit: longest member
    _assert_index_outlives_members(env, s)

    assert s.expire_all(4000, only_shorten=False, kinds=["api"]) == [api]  # may lengthen
    assert 3990 <= _secs(s, api) <= 4000
    assert 3_990_000 <= env.client.pttl(s.index_key) <= 4_000_000
    with pytest.raises(ContextError, match="ttl_s must be positive"):
        s.expire_all(0, only_shorten=True)
    with pytest.raises(ContextError, match="invalid kind"):
        s.expire_all(10, only_shorten=True, kinds=["api:*"])


def test_clear_removes_exactly_the_session_and_never_scans(
    any_redis: str, crowded_redis: CrowdedRedis
) -> None:
    """20k unrelated keys in the DB; clear() must delete exactly one session's keys with
    no SCAN (INFO commandstats), while sessions with look-alike ids keep all of theirs."""
    env = _Env(any_redis)
    base = _sid()
    try:
        # The probe counts real SCANs: a pattern scan over the crowd costs >= 40 calls.
        before = crowded_redis.scan_calls()
        found = sum(1 for _ in env.client.scan_iter(match=crowded_redis.prefix + "*", count=500))
        assert found == crowded_redis.n_keys
        assert crowded_redis.scan_calls() - before >= crowded_redis.n_keys // 500

        neighbours = [env.session(base + suffix) for suffix in ("x", "-2", "0")]
        neighbours.append(env.session(base[:-1]))

        def fill(s: SessionMemory) -> None:
            s.put_api_response("/pumps", {"id": 1}, {"p": 1})
            s.put_step_result("s1", {"v": 1})
            s.add_series_point("rms", 1.0, 2.0)
            s.add_pending("task-1")
            s.update_contract({"goal": "g"}, expected_version=s.contract().version)
            s.apply_plan(_plan(120.0))

        for s in neighbours:
            fill(s)
        kept = {s.session_id: s.keys() for s in neighbours}
        assert all(len(v) == 7 for v in kept.values())

        def prepare() -> Callable[[], int]:
            target = env.session(f"{base}-{uuid.uuid4().hex[:4]}")
            fill(target)
            listed = target.keys()
            assert len(listed) == 7

            def act() -> int:
                n = target.clear()
                assert n == len(listed)
                assert env.client.exists(*listed, target.index_key) == 0
                assert target.keys() == []
                return n

            return act

        assert crowded_redis.run_without_scan(prepare) == 7
        for s in neighbours:
            assert s.keys() == kept[s.session_id]
            assert env.client.exists(*kept[s.session_id]) == 7
            assert s.get_step_result("s1").value == {"v": 1}
        assert env.client.exists(crowded_redis.prefix + "0", crowded_redis.prefix + "19999") == 2
    finally:
        env.close()


def test_clear_ignores_foreign_members_of_a_tampered_index(env: _Env) -> None:
    a, b = env.session(), env.session()
    a.put_step_result("s1", {"v": "A"})
    b_key = b.put_step_result("s1", {"v": "B"})
    env.client.sadd(a.index_key, b_key, "unrelated:key")  # hand-edited: not a's keys
    assert a.keys() == [a.key("step", "s1")]
    assert a.clear() == 1
    assert b.get_step_result("s1").value == {"v": "B"}
    assert env.client.exists(a.index_key) == 0


def test_clear_finds_fixed_name_keys_of_a_session_without_index(env: _Env) -> None:
    """Sessions written before the index: the never-expiring pending Set and the contract
    are found by name (so no SCAN fallback is needed); other keys expire on their TTLs."""
    s = env.session()
    pending, contract = s.key("pending", "tasks"), s.key("contract", "current")
    env.client.sadd(pending, "task-1")  # as the old code wrote them: no index
    env.client.hset(contract, mapping={"_version": "1", "f:goal": '"g"'})
    assert env.client.exists(s.index_key) == 0
    assert s.keys() == sorted([pending, contract])
    assert s.expire_all(30, only_shorten=True) == sorted([pending, contract])
    assert 0 < _secs(s, pending) <= 30
    assert s.clear() == 2
    assert env.client.exists(pending, contract) == 0


def test_writes_racing_clear_leave_no_unlisted_key(env: _Env) -> None:
    """Writers keep adding keys while clear() runs: every key left is in the index."""
    s = env.session()
    stop = threading.Event()
    errors: list[BaseException] = []
    writing = threading.Semaphore(0)  # one release per writer, after its first write

    def writer(i: int) -> None:
        client = redis_client(env.url, decode_responses=True)
        try:
            # 51 versions: over the default bound of 50, so this history keeps 100
            mine = WorkingMemory(client, env.gateway, contract_history_versions=100).session(
                s.session_id
            )
            n = 0
            while not stop.is_set():
                mine.put_api_response("/w", {"w": i, "n": n}, {"v": n})
                if n == 0:
                    writing.release()
                n += 1
        except BaseException as e:  # surfaced below
            errors.append(e)
            writing.release()
        finally:
            client.close()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for _ in threads:  # a cluster client takes a moment to learn the slot map
        assert writing.acquire(timeout=30), "a writer never wrote"
    cleared = 0
    try:
        for _ in range(30):
            cleared += s.clear()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not errors and cleared > 0
    on_server = set(env.client.scan_iter(match=f"wm:\\{{{s.session_id}\\}}:*", count=1000))
    assert on_server - {s.index_key} <= _members(env, s)
    assert s.clear() == len(on_server - {s.index_key})
