"""Shared-state sync between cooperating agents (planner, executor, verifier) on one task
contract, on real servers: the library part runs on Redis 7, the embedded Valkey and a Redis
Cluster (``any_redis``); the HTTP part on the real service (uvicorn) and Redis.

* three agents, each with its own poller, see a new version within one poll interval of the
  write (measured from just before the write to each agent's callback);
* concurrent read-modify-write agents lose no update (every id once, version = initial +
  writes), through :func:`update_shared`'s retry on a version conflict;
* a write based on a stale version is refused (library: VersionConflictError naming both
  versions; HTTP: 409 ``version_conflict`` naming ``current_version``), nothing is written;
* ``GET .../contract?since_version=N`` answers ``{"changed": false}`` with one HGET while the
  contract is at N, and the contract in full once it moved;
* L1's ``shared_state_ref`` survives the signed wire round trip, and a state signed before
  the field existed still verifies.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import RoundTrips, redis_client
from pydantic import ValidationError
from test_ops_hardening import run_app
from test_service import cleanup_service_keys, service_settings

from context_app.contract_client import HttpContractSource, put_contract
from context_core.errors import ContextError, VersionConflictError
from context_core.gateway.sanitize import Gateway
from context_core.session.state import AuthContext, SessionState
from context_core.session.wire import WireState, _signature, encode_json
from context_core.working_memory import WorkingMemory
from context_core.working_memory.contract import TaskContract
from context_core.working_memory.contract_sync import (
    DEFAULT_POLL_INTERVAL_S,
    ContractPoller,
    contract_since,
    read_shared,
    update_shared,
    write_shared,
)

KEY = b"k" * 32
INTERVAL_S = DEFAULT_POLL_INTERVAL_S  # the default, 500 ms, is what is measured
SLACK_S = 0.3  # one Redis round trip + thread scheduling on a loaded 2-core box
ROLES = ("planner", "executor", "verifier")


# --- fixtures --------------------------------------------------------------------------------


class _Env:
    """One server; each agent gets its own client (as separate processes would)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.gateway = Gateway()
        self.activity = f"t-activity:{uuid.uuid4().hex[:10]}"
        self.clients: list[Any] = []
        self.sid = f"t-{uuid.uuid4().hex[:12]}"

    def wm(self) -> WorkingMemory:
        client = redis_client(self.url, decode_responses=True)
        self.clients.append(client)
        return WorkingMemory(client, self.gateway, activity_key=self.activity)

    def state(self, role: str) -> SessionState:
        return SessionState.start(self.sid, f"u-{role}", "inspect PUMP-0042", gateway=self.gateway)

    def close(self) -> None:
        wm = self.wm()
        wm.session(self.sid).clear()
        wm._client.delete(self.activity)
        for c in self.clients:
            c.close()


@pytest.fixture
def env(any_redis: str) -> Iterator[_Env]:
    e = _Env(any_redis)
    try:
        yield e
    finally:
        e.close()


@dataclass
class Agent:
    """An agent: its L1 state and what its poller saw, (version, monotonic time)."""

    role: str
    state: SessionState
    seen: list[tuple[int, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    arrived: dict[int, threading.Event] = field(default_factory=dict)

    def event(self, version: int) -> threading.Event:
        with self.lock:
            return self.arrived.setdefault(version, threading.Event())

    def on_change(self, c: TaskContract) -> None:
        now = time.monotonic()
        with self.lock:
            self.seen.append((c.version, now))
            self.state = self.state.advance(shared_state_ref=c.version)
        self.event(c.version).set()


# --- convergence -----------------------------------------------------------------------------


def test_three_agents_converge_within_one_poll_interval(env: _Env) -> None:
    """Each round one agent writes a new version; every agent's own poller (own thread, own
    Redis client) reports it at most one interval (+ slack) after the write started."""
    first = env.wm().session(env.sid)
    first.update_contract({"goal": "inspect PUMP-0042", "steps": []}, expected_version=0)
    agents = [Agent(role, env.state(role)) for role in ROLES]
    pollers = []
    for a in agents:
        sm = env.wm().session(env.sid)
        _, a.state = read_shared(sm, a.state)
        assert a.state.shared_state_ref == 1
        pollers.append(ContractPoller(sm, since_version=1, on_change=a.on_change).start())
    writers = {a.role: env.wm().session(env.sid) for a in agents}
    latencies: list[float] = []
    try:
        for rnd, writer in enumerate(agents * 2):  # 6 rounds, each agent writes twice
            with writer.lock:
                state = writer.state
            t0 = time.monotonic()
            written, new_state = write_shared(
                writers[writer.role], state, {"steps": [f"{writer.role}-{rnd}"]}
            )
            assert written.version == rnd + 2
            for a in agents:
                assert a.event(written.version).wait(INTERVAL_S * 4), (a.role, written.version)
                with a.lock:
                    t_seen = next(t for v, t in a.seen if v == written.version)
                latencies.append(t_seen - t0)
            with writer.lock:
                writer.state = new_state
    finally:
        for p in pollers:
            p.stop()
    print(
        f"\nconvergence over {len(latencies)} (agent, version) pairs: "
        f"max {max(latencies) * 1000:.0f} ms, mean {sum(latencies) / len(latencies) * 1000:.0f} "
        f"ms (interval {INTERVAL_S * 1000:.0f} ms)"
    )
    assert max(latencies) <= INTERVAL_S + SLACK_S, latencies
    final = first.contract()
    assert final.version == 7
    for a, p in zip(agents, pollers, strict=True):
        assert [v for v, _ in a.seen] == list(range(2, 8))  # every version, in order, once
        assert a.state.shared_state_ref == 7 and p.seen_version == 7
        assert not p.running and p.errors == 0


class _FakeSource:
    """A :class:`ContractSource` whose version the test sets."""

    session_id = "t-fake"

    def __init__(self) -> None:
        self.version = 1

    def changed_since(self, since_version: int | None) -> TaskContract | None:
        return None if since_version == self.version else TaskContract(self.version, {})


def test_a_poller_with_a_long_interval_misses_the_bound() -> None:
    """The bound above can fail: with a 2 s interval the change is not seen within 0.8 s
    (no server needed: a fake reader that changes version at once)."""

    reader = _FakeSource()
    seen = threading.Event()
    p = ContractPoller(reader, interval_s=2.0, since_version=1, on_change=lambda c: seen.set())
    p.start()
    try:
        assert not seen.wait(0.3)  # the first poll ran at start and found version 1
        reader.version = 2
        assert not seen.wait(INTERVAL_S + SLACK_S)
        assert seen.wait(3.0)  # the next poll, 2 s after the first, does see it
    finally:
        p.stop()


# --- no lost update --------------------------------------------------------------------------


def test_no_update_is_lost_under_concurrent_writes(env: _Env) -> None:
    """N agents x K appends each, all started together, read-modify-write with retry on
    conflict: the list holds every id exactly once and the version counts every write."""
    n_agents, per_agent = 6, 5
    sm0 = env.wm().session(env.sid)
    initial = sm0.update_contract({"goal": "g", "log": []}, expected_version=0).version
    start = threading.Barrier(n_agents)
    calls = [0] * n_agents
    errors: list[BaseException] = []
    finals: list[SessionState] = []

    def agent(i: int) -> None:
        try:
            sm = env.wm().session(env.sid)
            state = env.state(f"a{i}")
            start.wait(timeout=30)
            for k in range(per_agent):
                ident = f"a{i}-{k}"

                def append(c: TaskContract, ident: str = ident) -> dict[str, Any]:
                    calls[i] += 1
                    return {"log": [*c.fields["log"], ident]}

                written, state = update_shared(sm, state, append)
                assert ident in written.fields["log"]
                assert state.shared_state_ref == written.version
            finals.append(state)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(n_agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    final = sm0.contract()
    expected = {f"a{i}-{k}" for i in range(n_agents) for k in range(per_agent)}
    assert sorted(final.fields["log"]) == sorted(expected)  # each id exactly once
    assert final.version == initial + n_agents * per_agent
    assert len(sm0.contract_history()) == final.version
    retries = sum(calls) - n_agents * per_agent
    print(f"\n{n_agents * per_agent} writes by {n_agents} agents, {retries} conflict retries")
    assert len(finals) == n_agents
    assert retries > 0  # the agents really did race (else this proves nothing)


# --- stale writes ----------------------------------------------------------------------------


def test_a_stale_write_is_refused_and_nothing_is_written(env: _Env) -> None:
    sm_p, sm_e = env.wm().session(env.sid), env.wm().session(env.sid)
    sm_p.update_contract({"goal": "g", "device": "PUMP-0042"}, expected_version=0)
    _, planner = read_shared(sm_p, env.state("planner"))
    _, executor = read_shared(sm_e, env.state("executor"))
    assert planner.shared_state_ref == executor.shared_state_ref == 1
    written, planner = write_shared(sm_p, planner, {"device": "PUMP-0043"})
    assert written.version == 2 and planner.shared_state_ref == 2
    with pytest.raises(VersionConflictError, match=r"acted on version 1.*now at version 2") as e:
        write_shared(sm_e, executor, {"device": "PUMP-0099"})
    assert (e.value.current_version, e.value.expected_version) == (2, 1)
    assert e.value.details() == {"current_version": 2, "expected_version": 1}
    now = sm_e.contract()
    assert now.version == 2 and now.fields["device"] == "PUMP-0043"
    assert [c.version for c in sm_e.contract_history()] == [1, 2]
    # re-read, then the same write goes through
    _, executor = read_shared(sm_e, executor)
    assert write_shared(sm_e, executor, {"device": "PUMP-0099"})[0].version == 3
    # a state that never read the contract cannot write (it has no version to name)
    with pytest.raises(ContextError, match="no shared_state_ref"):
        write_shared(sm_e, env.state("verifier"), {"x": 1})
    other = SessionState.start("t-other", "u", "q", gateway=env.gateway)
    with pytest.raises(ContextError, match="session"):
        read_shared(sm_e, other)


def test_update_contract_returns_the_version_it_wrote(env: _Env) -> None:
    sm = env.wm().session(env.sid)
    c1 = sm.update_contract({"goal": "g", "n": 1}, expected_version=0)
    assert (c1.version, c1.fields) == (1, {"goal": "g", "n": 1})
    c2 = sm.update_contract({"n": 2}, expected_version=1, corrected=True)
    assert (c2.version, c2.fields, c2.corrected) == (2, {"goal": "g", "n": 2}, True)
    assert c2 == sm.contract()


# --- the cheap check -------------------------------------------------------------------------


def test_contract_since_reads_the_version_only_while_unchanged(env: _Env) -> None:
    sm = env.wm().session(env.sid)
    assert contract_since(sm, 0) is None  # no contract yet: version 0
    sm.update_contract({"goal": "g"}, expected_version=0)
    with RoundTrips() as rt:
        assert contract_since(sm, 1) is None
        assert rt.trips == [["HGET"]]  # one round trip, the version field only
        rt.clear()
        c = contract_since(sm, 0)
        assert c is not None and c.version == 1 and c.fields == {"goal": "g"}
        assert rt.trips == [["HGET"], ["HGETALL"]]
    assert contract_since(sm, 5) is not None  # any other version is news (a lower one too)
    with pytest.raises(ContextError, match="since_version"):
        contract_since(sm, -1)


# --- the poller's API ------------------------------------------------------------------------


def test_poller_iterates_stops_at_once_and_survives_errors(env: _Env) -> None:
    sm = env.wm().session(env.sid)
    sm.update_contract({"goal": "g"}, expected_version=0)
    # iterator: the current contract first (no since_version), then each new version
    got: list[int] = []
    poller = ContractPoller(env.wm().session(env.sid), interval_s=0.05)
    ready = threading.Event()

    def consume() -> None:
        for c in poller:
            got.append(c.version)
            ready.set()
            if c.version == 3:
                poller.stop()  # from inside the loop

    t = threading.Thread(target=consume)
    t.start()
    assert ready.wait(5)
    for v in (1, 2):
        ready.clear()
        sm.update_contract({"n": v}, expected_version=v)
        assert ready.wait(5)
    t.join(5)
    assert not t.is_alive() and got == [1, 2, 3]
    # changes() with a timeout ends by itself
    assert list(ContractPoller(sm, interval_s=0.05, since_version=3).changes(timeout=0.2)) == []
    # stop() wakes a poller waiting out a long interval at once
    slow = ContractPoller(sm, interval_s=30, since_version=3, on_change=lambda c: None).start()
    t0 = time.monotonic()
    slow.stop()
    assert time.monotonic() - t0 < 2 and not slow.running
    # a failing callback is reported to on_error and polling goes on
    failures: list[Exception] = []
    seen = threading.Event()

    def boom(c: TaskContract) -> None:
        seen.set()
        raise RuntimeError("callback failed")

    with ContractPoller(sm, interval_s=0.05, on_change=boom, on_error=failures.append) as p:
        assert seen.wait(5)
        seen.clear()
        sm.update_contract({"n": 9}, expected_version=3)
        assert seen.wait(5)
    assert len(failures) == 2 and p.seen_version == 4 and not p.running


def test_poller_settings_are_checked() -> None:
    sm = _FakeSource()
    for kw in ({"interval_s": 0}, {"jitter": 1.0}, {"jitter": -0.1}, {"since_version": -1}):
        with pytest.raises(ContextError):
            ContractPoller(sm, **kw)
    with pytest.raises(ContextError, match="on_change"):
        ContractPoller(sm).start()
    p = ContractPoller(sm, interval_s=1.0, jitter=0.5)
    waits = [p._wait_s() for _ in range(200)]
    assert all(0.5 <= w <= 1.0 for w in waits) and len(set(waits)) > 1  # jitter only shortens


# --- L1 on the wire --------------------------------------------------------------------------


def test_shared_state_ref_round_trips_through_the_signed_wire() -> None:
    gw = Gateway()
    state = SessionState.start("s-1", "u-1", "inspect PUMP-0042", gateway=gw)
    assert state.shared_state_ref is None
    state = state.advance(shared_state_ref=7)
    wire = WireState.of(state, KEY, version=3)
    echoed = WireState.model_validate_json(encode_json(wire))
    assert echoed.shared_state_ref == 7 and echoed.verify(KEY)
    back = echoed.to_state(gateway=gw, auth=AuthContext("agent-a"))
    assert back.shared_state_ref == 7 and back == state
    assert not echoed.model_copy(update={"shared_state_ref": 8}).verify(KEY)  # signed
    assert not echoed.model_copy(update={"shared_state_ref": None}).verify(KEY)
    with pytest.raises(ValidationError, match="shared_state_ref"):
        WireState.model_validate({**json.loads(encode_json(echoed)), "shared_state_ref": -1})
    for bad in (-1, True, "3"):
        with pytest.raises(ContextError, match="shared_state_ref"):
            state.advance(shared_state_ref=bad)


def test_a_state_signed_before_shared_state_ref_existed_still_loads() -> None:
    """Old services signed every field there was, without shared_state_ref; their states
    (echoed by clients without the key) must verify and load with the reference unset."""
    gw = Gateway()
    state = SessionState.start("s-1", "u-1", "q", gateway=gw)
    body = json.loads(encode_json(WireState.of(state, KEY, version=2)))
    assert body["shared_state_ref"] is None
    del body["shared_state_ref"], body["sig"]
    old = {**body, "sig": _signature(KEY, body)}  # what the old code signed and sent
    wire = WireState.model_validate(old)
    assert wire.verify(KEY)
    assert wire.to_state(gateway=gw, auth=AuthContext("a")).shared_state_ref is None
    forged = {**old, "shared_state_ref": 5}  # adding it to an old state breaks the signature
    assert not WireState.model_validate(forged).verify(KEY)


# --- over HTTP -------------------------------------------------------------------------------


@dataclass
class Service:
    url: str
    keys: dict[str, str]

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"X-API-Key": self.keys["agent-a"]}, timeout=30
        )


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Service]:
    tmp: Path = tmp_path_factory.mktemp("contract-sync")
    settings, raw = service_settings(tmp, redis_url)
    with run_app(settings) as (url, _app):
        yield Service(url, raw)
    cleanup_service_keys(redis_url)


def _session(c: httpx.Client) -> str:
    sid = f"t-{uuid.uuid4().hex[:12]}"
    r = c.post("/v1/sessions", json={"session_id": sid, "user_id": "u-1", "user_query": "PUMP"})
    assert r.status_code == 201, r.text
    return sid


def test_http_since_version_answers_unchanged_then_the_new_version(service: Service) -> None:
    with service.client() as c:
        sid = _session(c)
        url = f"/v1/sessions/{sid}/contract"
        r = c.get(url, params={"since_version": 1})
        assert r.status_code == 200
        assert r.json() == {"session_id": sid, "version": 1, "changed": False}
        put = c.put(url, json={"expected_version": 1, "fields": {"device": "PUMP-0043"}})
        assert put.status_code == 200, put.text
        assert put.json()["version"] == 2
        r = c.get(url, params={"since_version": 1})
        body = r.json()
        assert r.status_code == 200 and "changed" not in body
        assert body["version"] == 2 and body["fields"]["device"] == "PUMP-0043"
        assert body == {**c.get(url).json(), "ttl_s": body["ttl_s"]}
        bad = c.get(url, params={"since_version": -1})
        assert bad.status_code == 422
        assert [d["field"] for d in bad.json()["detail"]] == ["query.since_version"]
        assert bad.json()["detail"][0]["limit"] == 0
        print(
            f"\nGET {url}?since_version=2 -> {c.get(url, params={'since_version': 2}).text}"
            f"\nPUT {url} (stale) -> "
            + c.put(url, json={"expected_version": 1, "fields": {"device": "PUMP-0044"}}).text
        )


def test_http_stale_write_is_409_naming_the_current_version(service: Service) -> None:
    with service.client() as planner, service.client() as executor:
        sid = _session(planner)
        url = f"/v1/sessions/{sid}/contract"
        v_planner = planner.get(url).json()["version"]
        v_executor = executor.get(url).json()["version"]
        assert v_planner == v_executor == 1
        ok = planner.put(url, json={"expected_version": v_planner, "fields": {"step": "plan"}})
        assert ok.status_code == 200 and ok.json()["version"] == 2
        stale = executor.put(url, json={"expected_version": v_executor, "fields": {"step": "x"}})
        assert stale.status_code == 409
        body = stale.json()
        assert body["error"] == "version_conflict"
        assert (body["current_version"], body["expected_version"]) == (2, 1)
        assert "version 2" in body["detail"]
        now = executor.get(url).json()
        assert now["version"] == 2 and now["fields"]["step"] == "plan"
        history = executor.get(f"{url}/history").json()["versions"]
        assert [v["version"] for v in history] == [1, 2]
        retry = executor.put(url, json={"expected_version": 2, "fields": {"step": "x"}})
        assert retry.status_code == 200 and retry.json()["version"] == 3


def test_http_pollers_of_three_agents_converge_and_a_stale_put_raises(service: Service) -> None:
    """The same poller over the service (``?since_version=N`` each poll), one HTTP client
    per agent: every agent sees each PUT within one interval (+ slack)."""
    clients = [service.client() for _ in ROLES]
    try:
        sid = _session(clients[0])
        agents = [
            Agent(role, SessionState.start(sid, "u-1", "PUMP", gateway=Gateway())) for role in ROLES
        ]
        pollers = [
            ContractPoller(
                HttpContractSource(c, sid), since_version=1, on_change=a.on_change
            ).start()
            for a, c in zip(agents, clients, strict=True)
        ]
        latencies: list[float] = []
        try:
            for rnd, c in enumerate(clients):
                t0 = time.monotonic()
                written = put_contract(c, sid, {"step": ROLES[rnd]}, expected_version=rnd + 1)
                assert written.version == rnd + 2 and written.fields["step"] == ROLES[rnd]
                for a in agents:
                    assert a.event(written.version).wait(INTERVAL_S * 4), (a.role, rnd)
                    with a.lock:
                        latencies.append(next(t for v, t in a.seen if v == written.version) - t0)
        finally:
            for p in pollers:
                p.stop()
        print(f"\nHTTP convergence: max {max(latencies) * 1000:.0f} ms over {len(latencies)}")
        assert max(latencies) <= INTERVAL_S + SLACK_S, latencies
        assert all([v for v, _ in a.seen] == [2, 3, 4] for a in agents)
        for a, p in zip(agents, pollers, strict=True):
            assert a.state.shared_state_ref == 4 and p.errors == 0
        with pytest.raises(VersionConflictError) as e:
            put_contract(clients[1], sid, {"step": "late"}, expected_version=2)
        assert (e.value.current_version, e.value.expected_version) == (4, 2)
    finally:
        for c in clients:
            c.close()
