"""Two organisations on one running service: nothing of one is seen or changed by the other.

Org A and org B each have agents (one a compliance admin). Every endpoint that reads or writes
user-, session-, contract-, upload-, namespace- or hot-knowledge-scoped data is driven by org
B's agent with org A's ids and their look-alikes (case, white space, full width, ``..``,
invisible characters, a Cyrillic letter, another org's id); org A's data must stay out of
every answer and unchanged. A Hypothesis state machine then issues random operations of both
orgs; its invariant is that no value written by one org is ever observed by the other.

Runs once per real server kind: the system Redis 7, the embedded Valkey, a Redis Cluster.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import cleanup_keys
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from context_core.access.auth import hash_key, new_key
from context_core.config import get_settings
from context_core.errors import InvalidIdError
from context_core.gateway.identity import canonical_user_id

AGENTS = {
    "a-agent": ("A", ["diagnostics", "reporting"], ["fleet"]),
    "a-admin": ("A", ["compliance_admin"], []),
    "b-agent": ("B", ["diagnostics", "reporting"], []),
    "b-admin": ("B", ["compliance_admin"], []),
}

#: The user ids org B tries against org A's user ``u-narrow``: every trick of the issue.
LOOKALIKES = [
    "u-narrow",
    "U-NARROW",
    "u-narrow ",
    " u-narrow",
    "ｕ－ｎａｒｒｏｗ",
    "U-Narrow\t",
]
#: Ids refused outright (422 naming the rule), never a fresh unrestricted user.
REFUSED = [
    "u-n\u200barrow",
    "u-nar\u00adrow",
    "u-narr\u034fow",
    "u-narrow\u2063",
    "u-n\u0430rrow",  # Cyrillic a
    "u-narrow\ufe0f",
    "u-narrow\U000e0041",
    "",
    "   ",
]


@dataclass
class TwoOrgs:
    url: str
    keys: dict[str, str]
    org_a: str
    org_b: str
    redis_url: str

    def client(self, agent: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-API-Key": self.keys[agent]}, timeout=30)


@pytest.fixture(scope="module", params=["redis7", "valkey", "cluster"])
def two_orgs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TwoOrgs]:
    from test_service import cleanup_service_keys, running_service

    fixture = {
        "redis7": "system_redis_url",
        "valkey": "embedded_valkey_url",
        "cluster": "cluster_redis_url",
    }[request.param]
    redis_url = str(request.getfixturevalue(fixture))
    tmp = tmp_path_factory.mktemp(f"tenants-{request.param}")
    tag = uuid.uuid4().hex[:8]
    orgs = {"A": f"iso-a-{tag}", "B": f"iso-b-{tag}"}
    raw = {a: new_key() for a in AGENTS}
    doc = {
        a: {
            "key_sha256": hash_key(raw[a]),
            "org": orgs[org],
            "purposes": purposes,
            "namespaces": namespaces,
        }
        for a, (org, purposes, namespaces) in AGENTS.items()
    }
    keys_file = tmp / "api_keys.json"
    keys_file.write_text(json.dumps(doc))
    settings_ = get_settings(
        data_dir=tmp / "ctx",
        reports_dir=tmp / "reports",
        redis_url=redis_url,
        api_keys_file=keys_file,
        l3_timeout_ms=5000,
    )
    try:
        with running_service(settings_) as url:
            yield TwoOrgs(url, raw, orgs["A"], orgs["B"], redis_url)
    finally:
        cleanup_service_keys(redis_url)
        for org in orgs.values():
            cleanup_keys(redis_url, f"cmp:{{org:{org}}}*")
            cleanup_keys(redis_url, f"pref:{{{org}:*")
        for agent in AGENTS:
            cleanup_keys(redis_url, f"svc:agent:{{{agent}}}:*")


def _start(
    c: httpx.Client, user: str, sid: str | None = None, query: str = "check pump P-7"
) -> httpx.Response:
    body = {"session_id": sid or f"iso-{uuid.uuid4().hex[:12]}", "user_id": user}
    return c.post("/v1/sessions", json={**body, "user_query": query})


def _started(
    c: httpx.Client, user: str, sid: str | None = None, query: str = "check pump P-7"
) -> dict[str, Any]:
    r = _start(c, user, sid, query)
    assert r.status_code == 201, r.text
    return dict(r.json())


def _prefs(c: httpx.Client, sid: str) -> dict[str, Any]:
    r = c.get(f"/v1/sessions/{sid}/preferences")
    assert r.status_code == 200, r.text
    return dict(r.json()["preferences"])


def _put_pref(c: httpx.Client, sid: str, ptype: str, value: Any) -> httpx.Response:
    return c.put(f"/v1/sessions/{sid}/preferences/{ptype}", json={"value": value})


# ---- the canonical user id -----------------------------------------------------------------------


@pytest.mark.parametrize("raw", LOOKALIKES)
def test_case_space_and_width_variants_are_one_canonical_user(raw: str) -> None:
    assert canonical_user_id(raw) == "u-narrow"


@pytest.mark.parametrize("raw", REFUSED)
def test_invisible_and_mixed_script_ids_are_refused_naming_the_rule(raw: str) -> None:
    with pytest.raises(InvalidIdError) as info:
        canonical_user_id(raw)
    assert info.value.details()["field"] == "user_id"
    assert "NFKC" in info.value.details()["rule"]


def test_real_ids_of_other_scripts_and_mails_are_kept() -> None:
    assert canonical_user_id("Alice@Example.COM") == "alice@example.com"
    assert canonical_user_id("张三") == "张三"
    with pytest.raises(InvalidIdError):
        canonical_user_id("ivan-петров")  # Latin + Cyrillic letters: a look-alike mix
    assert canonical_user_id("иван.петров") == "иван.петров"
    assert canonical_user_id("田中たろう") == "田中たろう"  # Han + Hiragana: allowed together
    assert canonical_user_id("user-1") == "user-1" and canonical_user_id("user-l") == "user-l"


# ---- over HTTP: org B against org A -----------------------------------------------------------


def test_preferences_never_cross_organisations(two_orgs: TwoOrgs) -> None:
    with two_orgs.client("a-agent") as a, two_orgs.client("b-agent") as b:
        sa = _started(a, "u-narrow")["session"]["session_id"]
        assert _put_pref(a, sa, "units", "mm/s").status_code == 200
        for raw in LOOKALIKES:
            sb = _started(b, raw)["session"]["session_id"]
            assert _prefs(b, sb) == {}, raw
            assert _put_pref(b, sb, "units", "in/s").status_code == 200
            assert b.delete(f"/v1/sessions/{sb}/preferences/units").status_code == 200
        # org A's value is as A wrote it, served at full confidence to A alone
        assert _prefs(a, sa)["units"]["value"] == "mm/s"
        # and A's other agent-visible variant of the same user sees the same record
        sa2 = _started(a, "U-NARROW ")["session"]["session_id"]
        assert _prefs(a, sa2)["units"]["value"] == "mm/s"


@pytest.mark.parametrize("raw", REFUSED[:7])
def test_a_refused_user_id_answers_422_naming_the_field(two_orgs: TwoOrgs, raw: str) -> None:
    with two_orgs.client("b-agent") as b:
        r = _start(b, raw)
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["error"] == "invalid_id" and body["field"] == "user_id"
        assert "NFKC" in body["rule"]


def test_last_completed_task_stays_in_its_organisation(two_orgs: TwoOrgs) -> None:
    with two_orgs.client("a-agent") as a, two_orgs.client("b-agent") as b:
        st_a = _started(a, "u-goal")
        sa = st_a["session"]["session_id"]
        r = a.post(
            f"/v1/sessions/{sa}/events",
            json={"state": st_a["state"], "event": {"type": "goal_achieved"}},
        )
        assert r.status_code == 200, r.text
        sa2 = _started(a, "U-Goal")["session"]["session_id"]
        assert "last_completed_task" in _prefs(a, sa2)
        sb = _started(b, "u-goal")["session"]["session_id"]
        assert _prefs(b, sb) == {}
        st_b = _started(b, "u-goal")
        r = b.post(
            "/v1/context",
            json={
                "session_id": st_b["session"]["session_id"],
                "step_intent": "preferences",
                "state": st_b["state"],
            },
        )
        assert r.status_code in (200, 409), r.text
        assert "check pump" not in json.dumps(r.json()).replace("check pump P-7", "")
        assert "last_completed_task" not in r.text


def test_user_profile_restrictions_hold_for_every_variant_and_stay_in_their_org(
    two_orgs: TwoOrgs,
) -> None:
    A, B = two_orgs.org_a, two_orgs.org_b
    with two_orgs.client("a-admin") as adm_a, two_orgs.client("b-admin") as adm_b:
        r = adm_a.put(
            f"/v1/compliance/orgs/{A}",
            json={"expected_version": 0, "profile": {"approved_tools": ["fetch", "search"]}},
        )
        assert r.status_code in (200, 201), r.text
        r = adm_a.put(
            f"/v1/compliance/orgs/{A}/users/U-Narrow",
            json={"expected_version": 0, "profile": {"approved_tools": ["fetch"]}},
        )
        assert r.status_code in (200, 201), r.text
        # org B's admin can neither read nor write org A's records, whatever the path says
        assert adm_b.get(f"/v1/compliance/orgs/{A}/users/u-narrow").status_code == 403
        r = adm_b.put(
            f"/v1/compliance/orgs/{A}/users/u-narrow",
            json={"expected_version": 1, "profile": {"approved_tools": ["delete_all"]}},
        )
        assert r.status_code == 403
        got = adm_a.get(f"/v1/compliance/orgs/{A}/users/ｕ-ｎａｒｒｏｗ")
        assert got.status_code == 200 and got.json()["profile"]["approved_tools"] == ["fetch"]
        # org B's own user with the same id is untouched by A's profile
        assert adm_b.get(f"/v1/compliance/orgs/{B}/users/u-narrow").json()["version"] == 0
    with two_orgs.client("a-agent") as a:
        for raw in LOOKALIKES:
            st_a = _started(a, raw)
            ev = {"type": "tool_call", "name": "search", "args": {}, "result": {"ok": 1}}
            r = a.post(
                f"/v1/sessions/{st_a['session']['session_id']}/events",
                json={"state": st_a["state"], "event": ev},
            )
            assert r.status_code == 403, (raw, r.text)  # narrowed to "fetch" for every variant


def test_sessions_of_org_a_are_unknown_to_org_b(two_orgs: TwoOrgs) -> None:
    with two_orgs.client("a-agent") as a, two_orgs.client("b-agent") as b:
        st_a = _started(a, "u-1")
        sid, state = st_a["session"]["session_id"], st_a["state"]
        reads = [
            b.get(f"/v1/sessions/{sid}/state"),
            b.get(f"/v1/sessions/{sid}/contract"),
            b.get(f"/v1/sessions/{sid}/contract/history"),
            b.put(
                f"/v1/sessions/{sid}/contract",
                json={"expected_version": 0, "fields": {"goal": "take over"}},
            ),
            b.get(f"/v1/sessions/{sid}/results/call-1"),
            b.put(
                f"/v1/sessions/{sid}/plan",
                json={"steps": [{"step_id": "s1", "depends_on": [], "est_start_s": 1}]},
            ),
            b.post(
                f"/v1/sessions/{sid}/confirmations",
                json={"state": state, "answers": [{"text": "x"}]},
            ),
            b.get(f"/v1/sessions/{sid}/plan"),
            b.get(f"/v1/sessions/{sid}/preferences"),
            b.put(f"/v1/sessions/{sid}/preferences/units", json={"value": "x"}),
            b.delete(f"/v1/sessions/{sid}/preferences/units"),
            b.post(
                "/v1/context", json={"session_id": sid, "step_intent": "default", "state": state}
            ),
            b.post(
                f"/v1/sessions/{sid}/events",
                json={"state": state, "event": {"type": "context_overflow"}},
            ),
            b.post(
                f"/v1/sessions/{sid}/outputs",
                json={"state": state, "output": "hi", "trace_id": "t-1"},
            ),
            b.delete(f"/v1/sessions/{sid}"),
        ]
        for r in reads:
            if b'"state"' in r.request.content:
                # org A's sealed state does not open for org B: refused before any lookup,
                # so the answer says nothing about the session either
                assert r.status_code == 403, (r.request.method, r.request.url, r.text)
                assert r.json()["error"] == "state_refused"
                assert "another session or organisation" in r.json()["detail"]
                assert sid not in r.text
                continue
            assert r.status_code == 404, (r.request.method, r.request.url, r.text)
            assert r.json()["error"] == "unknown_session"
        # the session is intact for its owner
        assert a.get(f"/v1/sessions/{sid}/state").status_code == 200


def test_taking_an_id_in_use_answers_like_any_unavailable_id(two_orgs: TwoOrgs) -> None:
    with two_orgs.client("a-agent") as a, two_orgs.client("b-agent") as b:
        live = f"iso-live-{uuid.uuid4().hex[:8]}"
        closed = f"iso-closed-{uuid.uuid4().hex[:8]}"
        _started(a, "u-1", live)
        _started(a, "u-1", closed)
        assert a.delete(f"/v1/sessions/{closed}").status_code in (200, 204)
        answers = [
            _start(b, "u-1", live),  # org A's live session
            _start(b, "u-1", closed),  # org A closed it a moment ago
            _start(a, "u-1", live),  # the owner's own live id
        ]
        shapes = set()
        for r, sid in zip(answers, [live, closed, live], strict=True):
            text = r.text.replace(sid, "<id>")
            shapes.add((r.status_code, r.json()["error"], text))
        assert len(shapes) == 1, shapes
        ((status, code, _),) = shapes
        assert (status, code) == (409, "session_id_unavailable")
        # the agent that closed an id may take it again
        assert _start(a, "u-1", closed).status_code == 201


def _route_text(c: httpx.Client, user: str, query: str) -> str:
    st_ = _started(c, user, query=query)
    r = c.post(
        "/v1/context",
        json={
            "session_id": st_["session"]["session_id"],
            "step_intent": "default",
            "state": st_["state"],
        },
    )
    assert r.status_code == 200, r.text
    return r.text


def test_hot_answers_stay_with_their_writer(two_orgs: TwoOrgs) -> None:
    marker = f"zq{uuid.uuid4().hex[:10]}"
    answer = f"the torque for pump {marker} is 42 Nm"
    with two_orgs.client("a-agent") as a, two_orgs.client("b-agent") as b:
        st_a = _started(a, "u-1")
        r = a.post(
            f"/v1/sessions/{st_a['session']['session_id']}/confirmations",
            json={"state": st_a["state"], "answers": [{"text": answer, "source": marker}]},
        )
        assert r.status_code == 201, r.text
        question = f"what is the torque for pump {marker}"
        assert answer in _route_text(a, "u-1", question)  # the writer is served its answer
        # the points are in the writer's private scope: org B's agent reads another scope
        assert answer not in _route_text(b, "u-1", question)


def test_namespaces_of_org_a_are_denied_to_org_b(two_orgs: TwoOrgs) -> None:
    from redis_cluster import redis_client
    from test_service import _tool

    from context_core.access.namespaces import NamespaceRegistry
    from context_core.gateway.sanitize import Gateway

    r = redis_client(two_orgs.redis_url, decode_responses=True)
    ns = NamespaceRegistry(r, Gateway())
    writer = f"writer-{uuid.uuid4().hex[:8]}"
    marker = f"iso-{uuid.uuid4().hex[:8]}"
    ns.grant("fleet", writer, ["maintenance"], write=True)
    ns.write("fleet", "baseline:PUMP", {"note": marker}, agent_id=writer, purpose="maintenance")

    def route_as(agent: str) -> str:
        with two_orgs.client(agent) as c:
            sid = f"iso-ns-{uuid.uuid4().hex[:10]}"
            state = _started(c, "u-1", sid)["state"]
            state = _tool(
                c, sid, state, type="tool_call", name="fetch", args={},
                result={"rms_mm_s": 5.0}, device_id="PUMP-0042",
                series={"PUMP-0042.vibration": [[time.time(), 5.0]]},
            )["state"]  # fmt: skip
            resp = c.post(
                "/v1/context",
                json={"session_id": sid, "step_intent": "compare_vibration", "state": state},
            )
        assert resp.status_code == 200, resp.text
        return resp.text

    try:
        assert marker in route_as("a-agent")  # org A's agent holds the grant
        assert marker not in route_as("b-agent")
    finally:
        ns.revoke("fleet", writer)
        r.delete(ns.kv_key("fleet", "baseline:PUMP"))
        r.close()


def test_a_keys_file_granting_one_namespace_to_two_orgs_is_refused(tmp_path: Path) -> None:
    from context_core.access.auth import KeyStore
    from context_core.errors import ConfigError

    digest = hash_key(new_key())
    doc = {
        "a": {"key_sha256": digest, "org": "acme", "namespaces": ["fleet"]},
        "b": {"key_sha256": hash_key(new_key()), "org": "globex", "namespaces": ["fleet"]},
    }
    with pytest.raises(ConfigError, match="fleet"):
        KeyStore.from_mapping(doc)


# ---- random operations of both orgs --------------------------------------------------------------


class TwoOrgMachine(RuleBasedStateMachine):
    """Both orgs open sessions for overlapping user ids (in every variant) and set, read and
    delete preferences; every value carries its writer's org. Invariant: no value an org reads
    was written by the other org."""

    env: TwoOrgs

    def __init__(self) -> None:
        super().__init__()
        self.clients = {o: self.env.client(f"{o.lower()}-agent") for o in ("A", "B")}
        self.sessions: dict[str, list[str]] = {"A": [], "B": []}
        self.seen: list[tuple[str, str]] = []

    def teardown(self) -> None:
        for c in self.clients.values():
            c.close()

    @rule(
        org=st.sampled_from("AB"), user=st.sampled_from(["u-1", "u-2"]), variant=st.integers(0, 4)
    )
    def open_session(self, org: str, user: str, variant: int) -> None:
        raw = [user, user.upper(), f" {user} ", user.replace("u", "ｕ"), user.title()][variant]
        self.sessions[org].append(_started(self.clients[org], raw)["session"]["session_id"])

    @rule(org=st.sampled_from("AB"), pick=st.integers(0, 50), ptype=st.sampled_from(["x", "y"]))
    def set_pref(self, org: str, pick: int, ptype: str) -> None:
        if self.sessions[org]:
            sid = self.sessions[org][pick % len(self.sessions[org])]
            value = f"{org}:{uuid.uuid4().hex[:6]}"
            assert _put_pref(self.clients[org], sid, ptype, value).status_code == 200

    @rule(org=st.sampled_from("AB"), pick=st.integers(0, 50), ptype=st.sampled_from(["x", "y"]))
    def delete_pref(self, org: str, pick: int, ptype: str) -> None:
        if self.sessions[org]:
            sid = self.sessions[org][pick % len(self.sessions[org])]
            r = self.clients[org].delete(f"/v1/sessions/{sid}/preferences/{ptype}")
            assert r.status_code == 200

    @rule(org=st.sampled_from("AB"), pick=st.integers(0, 50))
    def read_prefs(self, org: str, pick: int) -> None:
        if self.sessions[org]:
            sid = self.sessions[org][pick % len(self.sessions[org])]
            for p in _prefs(self.clients[org], sid).values():
                self.seen.append((org, str(p["value"])))

    @invariant()
    def nothing_of_the_other_org_was_seen(self) -> None:
        for reader, value in self.seen:
            assert value.startswith(f"{reader}:"), (reader, value)


def test_random_operations_of_two_orgs_never_mix(two_orgs: TwoOrgs) -> None:
    TwoOrgMachine.env = two_orgs
    machine = TwoOrgMachine.TestCase
    machine.settings = settings(
        max_examples=8,
        stateful_step_count=15,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    machine().runTest()


# ---- records written before the identity model ------------------------------------------------


def test_legacy_user_keys_move_to_their_org_once(any_redis: str, tmp_path: Path) -> None:
    from redis_cluster import redis_client

    from context_core.access.user_keys_migration import migrate_user_keys
    from context_core.platform import build_platform

    tag = uuid.uuid4().hex[:6]
    org, old_a, old_b = f"mig-{tag}", f"Mig-{tag}", f"mig-{tag}"
    r = redis_client(any_redis)
    plain = f"pref:{{{old_b}}}:units"
    upper = f"pref:{{{old_a}}}:units"
    hashed = f"pref:{{h~{tag}}}:units"
    profile = f"cmp:{{org:{org}}}:user:U-Narrow-{tag}"
    try:
        r.hset(plain, mapping={"value": '"mm/s"', "confidence": "1.0", "last_updated": "10"})
        r.hset(upper, mapping={"value": '"in/s"', "confidence": "0.5", "last_updated": "20"})
        r.hset(hashed, mapping={"value": '"x"', "confidence": "1.0", "last_updated": "5"})
        r.hset(profile, mapping={"version": "1", "profile": "{}"})
        dry = migrate_user_keys(r, org, dry_run=True)
        # the server may hold other legacy keys (a shared test database): count ours only
        assert dry.preferences_moved >= 2 and r.exists(plain, upper) == 2
        assert dry.profiles_moved == [f"U-Narrow-{tag}"]
        done = migrate_user_keys(r, org)
        assert {old_a, old_b} <= set(done.to_dict()["users_moved"])
        assert f"h~{tag}" in done.left_alone and r.exists(hashed) == 1
        assert r.exists(plain, upper) == 0
        assert r.exists(f"cmp:{{org:{org}}}:user:u-narrow-{tag}") == 1
        settings_ = get_settings(data_dir=tmp_path / "ctx", redis_url=any_redis)
        with build_platform(settings_, with_knowledge=False) as platform:
            prefs = platform.wm.preferences(org, old_a)
            assert prefs.all()["units"].value == "in/s"  # the newest of the two folded ids
            assert platform.wm.preferences("default", old_b).all() == {}
        again = migrate_user_keys(r, org)
        assert again.preferences_moved == 0 and again.profiles_moved == []
    finally:
        cleanup_keys(any_redis, f"pref:{{{org}:*")
        cleanup_keys(any_redis, f"cmp:{{org:{org}}}*")
        for k in (plain, upper, hashed):
            r.delete(k)
        r.close()
