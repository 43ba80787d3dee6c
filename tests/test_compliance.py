"""Compliance profiles: one contract on every backend, row-level security, enforcement.

Real servers only. The store contract runs on the three Redis kinds of ``any_redis`` (system
Redis 7, embedded Valkey, a Redis Cluster) and on PostgreSQL at 127.0.0.1:5432 (db ``test``;
``CTX_TEST_POSTGRES_URL`` overrides), as a dedicated non-superuser serving role created for
this test session, on a schema of its own created by the migrations (``ctx db upgrade``'s
code, run by the superuser as the owner; both dropped at the end); the PostgreSQL param skips,
saying why, only when the server does not answer. The HTTP part runs the real service
(uvicorn, Redis, Qdrant Edge, the encoder) on the default Redis.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import cleanup_keys, redis_client
from postgres_env import Pg, pg_env

from context_core.access.auth import hash_key, new_key
from context_core.access.compliance import (
    ComplianceProfile,
    ComplianceStore,
    EffectiveProfile,
    PostgresComplianceStore,
    RedisComplianceStore,
    check_tool,
    find_blocked,
    merge,
)
from context_core.config import Settings, get_settings
from context_core.errors import (
    BlockedKeywordError,
    ConfigError,
    ProfileValidationError,
    ToolNotApprovedError,
    VersionConflictError,
)
from context_core.gateway.sanitize import Gateway
from context_core.platform import build_platform
from context_core.postgres.schema import role_of

SECRET = "AKIAIOSFODNN7EXAMPLE"  # an AWS access key id shape: the gateway redacts it


def _org() -> str:
    return f"t-org-{uuid.uuid4().hex[:10]}"


# --- PostgreSQL: a serving role and a schema of our own, migrated like a deployment -------------


@pytest.fixture(scope="session")
def pg() -> Iterator[Pg]:
    with pg_env() as env:
        yield env


REDIS_KINDS = {"redis7": "system_redis_url", "valkey": "embedded_valkey_url"}


@pytest.fixture(params=["redis7", "valkey", "cluster", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ComplianceStore]:
    """Each contract test once per backend: the ``any_redis`` kinds, then PostgreSQL."""
    gw = Gateway(audit_path=tmp_path / "audit.jsonl")
    if request.param == "postgres":
        env: Pg = request.getfixturevalue("pg")
        pg_store = PostgresComplianceStore(env.app_url, gw, schema=env.schema)
        try:
            yield pg_store
        finally:
            pg_store.close()
        return
    fixture = REDIS_KINDS.get(request.param, "cluster_redis_url")
    url = str(request.getfixturevalue(fixture))
    client = redis_client(url, decode_responses=True)
    try:
        yield RedisComplianceStore(client, gw)
    finally:
        cleanup_keys(url, "cmp:{org:t-org-*")
        client.close()


def _raw_dump(store: ComplianceStore, org: str, request: pytest.FixtureRequest) -> str:
    """Everything the backend holds for ``org``, as text (read around the store)."""
    if isinstance(store, RedisComplianceStore):
        r = store._r
        key, audit = store.keys(org)
        return json.dumps([r.hgetall(key), r.lrange(audit, 0, -1)])
    env: Pg = request.getfixturevalue("pg")
    conn = env.admin()  # the superuser sees every row
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT json_agg(p)::text FROM {env.schema}.compliance_profiles p "
                "WHERE org_id = %s UNION ALL "
                f"SELECT json_agg(a)::text FROM {env.schema}.compliance_audit a WHERE org_id = %s",
                (org, org),
            )
            return " ".join(str(r[0]) for r in cur.fetchall())
    finally:
        conn.close()


# --- the contract, on every backend --------------------------------------------------------------


def test_absent_profile_is_version_zero_and_empty(store: ComplianceStore) -> None:
    org = _org()
    p = store.get(org)
    assert (p.version, p.profile, p.updated_by) == (0, ComplianceProfile(), None)
    assert store.history(org) == []
    eff = store.effective(org, "u-1")
    assert eff.version == "0.0" and eff.approved_tools is None and eff.blocked_keywords == ()


def test_writes_are_versioned_with_an_optimistic_lock(store: ComplianceStore) -> None:
    org = _org()
    first = store.put(
        org,
        {"approved_tools": ["fetch", "search"], "timezone": "Europe/Berlin"},
        expected_version=0,
        operator="admin-1",
    )
    assert first.version == 1 and first.updated_by == "admin-1"
    got = store.get(org)
    assert got.version == 1 and got.profile.approved_tools == ["fetch", "search"]
    assert got.profile.timezone == "Europe/Berlin" and got.sha256 == first.sha256
    with pytest.raises(VersionConflictError) as info:  # based on a stale version
        store.put(org, {"approved_tools": []}, expected_version=0, operator="admin-2")
    assert info.value.current_version == 1 and info.value.expected_version == 0
    with pytest.raises(VersionConflictError):  # from the future
        store.put(org, {"approved_tools": []}, expected_version=5, operator="admin-2")
    assert store.get(org).profile.approved_tools == ["fetch", "search"]  # nothing written
    second = store.put(org, {"approved_tools": []}, expected_version=1, operator="admin-2")
    assert second.version == 2 and store.get(org).profile.approved_tools == []
    assert [e.version for e in store.history(org)] == [1, 2]


def test_concurrent_first_writes_one_wins(store: ComplianceStore) -> None:
    org = _org()
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def write(i: int) -> None:
        barrier.wait()
        try:
            store.put(org, {"language": "en"}, expected_version=0, operator=f"w{i}")
            outcomes.append("ok")
        except VersionConflictError:
            outcomes.append("conflict")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["conflict"] * 3 + ["ok"]
    assert store.get(org).version == 1 and len(store.history(org)) == 1


def test_history_has_operator_time_hash_and_no_values(
    store: ComplianceStore, request: pytest.FixtureRequest
) -> None:
    org = _org()
    before = time.time()
    store.put(org, {"data_retention_policy": 30}, expected_version=0, operator="admin-1")
    stored = store.put(
        org,
        {"data_retention_policy": 30, "blocked_keywords": ["confidential", SECRET]},
        expected_version=1,
        operator="admin-2",
    )
    # the gateway ran before storage: the secret is gone from the record itself
    assert SECRET not in json.dumps(stored.profile.stored())
    assert "confidential" in (stored.profile.blocked_keywords or [])
    history = store.history(org)
    assert [(e.version, e.operator) for e in history] == [(1, "admin-1"), (2, "admin-2")]
    assert all(before - 1 <= e.at <= time.time() + 1 for e in history)
    assert history[0].changed == ("data_retention_policy",)
    assert history[1].changed == ("blocked_keywords",)  # names only
    expected = hashlib.sha256(
        json.dumps(
            stored.profile.stored(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode()
    ).hexdigest()
    assert history[1].sha256 == stored.sha256 == store.get(org).sha256 == expected
    assert history[0].sha256 != history[1].sha256
    audit_text = json.dumps([e.to_dict() for e in history])
    assert "confidential" not in audit_text
    assert set(history[1].to_dict()) == {
        "org_id", "user_id", "version", "operator", "at", "sha256", "changed"
    }  # fmt: skip
    raw = _raw_dump(store, org, request)  # read around the store: nothing secret anywhere
    assert org in raw and SECRET not in raw


def test_user_overrides_narrow_and_never_widen(store: ComplianceStore) -> None:
    org = _org()
    store.put(
        org,
        {
            "approved_tools": ["fetch", "search", "report"],
            "blocked_keywords": ["confidential"],
            "data_retention_policy": 90,
            "timezone": "UTC",
            "language": "en",
        },
        expected_version=0,
        operator="admin",
    )
    user = "alice@example.com"  # outside the key alphabet: stored under a hash
    store.put(
        org,
        {
            "approved_tools": ["search", "delete_all"],  # delete_all: not the org's to give
            "blocked_keywords": ["draft"],
            "data_retention_policy": 365,  # longer than the org's: ignored
            "timezone": "Asia/Shanghai",
        },
        expected_version=0,
        operator="admin",
        user_id=user,
    )
    assert store.get(org, user).version == 1 and store.get(org, "bob").version == 0
    eff = store.effective(org, user)
    assert eff.version == "1.1" and eff.org_id == org
    assert eff.approved_tools == ("search",)
    assert set(eff.blocked_keywords) == {"confidential", "draft"}
    assert eff.profile.data_retention_policy == 90
    assert (eff.profile.timezone, eff.profile.language) == ("Asia/Shanghai", "en")
    other = store.effective(org, "bob")  # no overrides: the org's profile
    assert other.version == "1.0" and other.approved_tools == ("fetch", "search", "report")
    # the user's history is its own
    assert str(store.history(org, user)[0].user_id).startswith("h~")  # a hash, not the e-mail
    assert len(store.history(org)) == 1 and len(store.history(org, user)) == 1
    assert "alice" not in json.dumps([e.to_dict() for e in store.history(org, user)])


def test_orgs_do_not_see_each_other(store: ComplianceStore) -> None:
    a, b = _org(), _org()
    store.put(a, {"approved_tools": ["fetch"]}, expected_version=0, operator="admin-a")
    assert store.get(b).version == 0 and store.history(b) == []
    assert store.effective(b, "u").approved_tools is None
    store.put(b, {"approved_tools": ["other"]}, expected_version=0, operator="admin-b")
    assert store.get(a).profile.approved_tools == ["fetch"]


def test_invalid_profiles_are_refused_naming_the_field(store: ComplianceStore) -> None:
    org = _org()
    with pytest.raises(ProfileValidationError) as info:
        store.put(org, {"timezone": "Mars/Olympus"}, expected_version=0, operator="admin")
    assert info.value.issues[0]["loc"] == ["timezone"]
    assert "Europe/Berlin" in info.value.issues[0]["msg"]
    assert store.get(org).version == 0 and store.history(org) == []  # nothing written


# --- PostgreSQL only: row-level security -----------------------------------------------------


def test_row_level_security_isolates_orgs_for_the_app_role(pg: Pg, tmp_path: Path) -> None:
    a, b = _org(), _org()
    store = PostgresComplianceStore(pg.app_url, Gateway(audit_path=tmp_path / "a.jsonl"),
                                    schema=pg.schema)  # fmt: skip
    try:
        store.put(a, {"approved_tools": ["fetch"]}, expected_version=0, operator="admin-a")
        store.put(b, {"approved_tools": ["b-only"]}, expected_version=0, operator="admin-b")
    finally:
        store.close()
    t, audit = f"{pg.schema}.compliance_profiles", f"{pg.schema}.compliance_audit"
    admin = pg.admin()
    try:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity, r.rolname "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "JOIN pg_roles r ON r.oid = c.relowner WHERE n.nspname = %s AND c.relkind = 'r'",
                (pg.schema,),
            )
            tables = {row[0]: row[1:] for row in cur.fetchall()}
            # enabled and forced; owned by the owner role that ran the migrations, not the
            # serving role (which gets DML only and is subject to the policy)
            owner = role_of(pg.admin_url)
            assert tables == {
                "alembic_version": (False, False, owner),
                "compliance_profiles": (True, True, owner),
                "compliance_audit": (True, True, owner),
            }
            assert owner != pg.role
            cur.execute(f"SELECT count(*) FROM {t} WHERE org_id = %s", (b,))
            assert cur.fetchone()[0] == 1  # B's row exists: what follows could see it
            cur.execute("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = %s",
                        (pg.role,))  # fmt: skip
            assert cur.fetchone() == (False, False)
    finally:
        admin.close()

    import psycopg2

    app = pg.app()  # as the app role, org A's transaction crafts queries for B's rows
    try:
        with app, app.cursor() as cur:
            cur.execute("SELECT set_config('ctx.org_id', %s, true)", (a,))
            cur.execute(f"SELECT org_id FROM {t} WHERE org_id IN (%s, %s)", (a, b))
            assert [r[0] for r in cur.fetchall()] == [a]
            cur.execute(f"SELECT org_id, profile FROM {t} WHERE org_id = %s", (b,))
            assert cur.fetchall() == []
            cur.execute(f"SELECT * FROM {t} WHERE org_id = %s OR true", (b,))
            assert {r[0] for r in cur.fetchall()} == {a}
            cur.execute(f"SELECT org_id FROM {audit} WHERE org_id = %s", (b,))
            assert cur.fetchall() == []
            cur.execute(f"UPDATE {t} SET profile = '{{}}' WHERE org_id = %s", (b,))
            assert cur.rowcount == 0
            cur.execute(f"DELETE FROM {audit} WHERE org_id = %s", (b,))
            assert cur.rowcount == 0
            # moving A's row to B is refused by the policy's WITH CHECK
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                cur.execute(f"UPDATE {t} SET org_id = %s WHERE org_id = %s", (b, a))
        with app, app.cursor() as cur:
            cur.execute("SELECT set_config('ctx.org_id', %s, true)", (a,))
            with pytest.raises(psycopg2.errors.InsufficientPrivilege, match="row-level security"):
                cur.execute(
                    f"INSERT INTO {t} (org_id, user_id, version, profile, sha256, updated_at, "
                    "updated_by) VALUES (%s, 'x', 1, '{}', 'x', now(), 'x')",
                    (b,),
                )
        with app, app.cursor() as cur:  # no org set: nothing at all
            cur.execute(f"SELECT count(*) FROM {t}")
            assert cur.fetchone()[0] == 0
    finally:
        app.close()
    admin = pg.admin()
    try:
        with admin.cursor() as cur:  # B's row is untouched
            cur.execute(f"SELECT profile FROM {t} WHERE org_id = %s", (b,))
            assert cur.fetchone()[0] == {"approved_tools": ["b-only"]}
    finally:
        admin.close()


def test_superuser_connection_is_refused(pg: Pg, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="superuser"):
        PostgresComplianceStore(pg.admin_url, Gateway(), schema=pg.schema)


def test_platform_chooses_the_backend(pg: Pg, settings: Settings) -> None:
    with build_platform(settings, with_knowledge=False) as p:
        assert isinstance(p.compliance, RedisComplianceStore)
        assert p.lifecycle.compliance is p.compliance
    s = get_settings(
        **{**settings.model_dump(), "postgres_url": pg.app_url, "postgres_schema": pg.schema}
    )
    p = build_platform(s, with_knowledge=False)
    try:
        assert isinstance(p.compliance, PostgresComplianceStore)
        assert p.lifecycle.compliance is p.compliance
        assert "compliance store (postgres)" in p.opened
    finally:
        p.close()
    assert p.compliance._pool is None  # closed with the platform


# --- pure rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "keywords", "found"),
    [
        ("This is CONFIDENTIAL.", ["confidential"], ("confidential",)),
        ("the secretary called", ["secret"], ()),  # whole words only
        ("top  secret plan", ["top secret"], ("top secret",)),  # any whitespace between
        ("we use C++ here", ["c++"], ("c++",)),  # punctuation in the keyword
        ("这是机密文件", ["机密"], ("机密",)),  # CJK: substring
        ("プロジェクト極秘です", ["極秘"], ("極秘",)),
        ("项目secret代号", ["secret"], ("secret",)),  # Latin word inside CJK text
        ("nothing here", ["secret", "机密"], ()),
        ("", ["secret"], ()),
        ("secret", [], ()),
        # look-alikes (issue 32): invisible characters, other scripts, compatibility forms
        ("top se\u034fcr\u2063e\u200bt\u00ad plan", ["secret"], ("secret",)),
        ("ѕесrеt plan", ["secret"], ("secret",)),  # Cyrillic ѕ е с е
        ("ΡUMP ΑΡΙ", ["api"], ("api",)),  # Greek capitals
        ("𝐜𝐨𝐧𝐟𝐢𝐝𝐞𝐧𝐭𝐢𝐚𝐥", ["Confidential"], ("Confidential",)),
        ("a secret plan", ["ѕесrеt"], ("ѕесrеt",)),  # the keyword itself disguised
        ("the ѕесrеtary called", ["secret"], ()),  # still whole words
        ("bum", ["burn"], ()),  # plain ASCII text keeps its exact meaning
    ],
)
def test_find_blocked(text: str, keywords: list[str], found: tuple[str, ...]) -> None:
    assert find_blocked(text, keywords) == found


def test_validation_names_each_field_and_what_it_allows() -> None:
    with pytest.raises(ProfileValidationError) as info:
        ComplianceProfile.parse(
            {
                "data_retention_policy": 0,
                "approved_tools": "fetch",
                "timezone": "Mars/Olympus",
                "language": "english please",
            }
        )
    by_field = {i["loc"][0]: i["msg"] for i in info.value.issues}
    assert set(by_field) == {"data_retention_policy", "approved_tools", "timezone", "language"}
    assert "greater than or equal to 1" in by_field["data_retention_policy"]
    assert "list" in by_field["approved_tools"]
    assert "IANA" in by_field["timezone"] and "de-DE" in by_field["language"]
    with pytest.raises(ProfileValidationError, match="language tag"):
        ComplianceProfile.parse({"language": "en\n"})  # matched whole, not up to a newline
    with pytest.raises(ProfileValidationError, match="allowed fields: data_retention_policy"):
        ComplianceProfile.parse({"retention_days": 3})
    with pytest.raises(ProfileValidationError, match="item 1 must be"):
        ComplianceProfile.parse({"blocked_keywords": ["ok", "   "]})
    p = ComplianceProfile.parse({"approved_tools": ["Fetch", "fetch", " search "]})
    assert p.approved_tools == ["Fetch", "search"]  # trimmed, deduplicated case-insensitively


def test_merge_and_tool_rules() -> None:
    none, empty = ComplianceProfile(), ComplianceProfile(approved_tools=[])
    some = ComplianceProfile(approved_tools=["fetch", "search"])
    assert merge(none, none).approved_tools is None  # nothing configured: no restriction
    assert merge(none, some).approved_tools == ["fetch", "search"]
    assert merge(some, none).approved_tools == ["fetch", "search"]
    assert merge(empty, some).approved_tools == []  # the org forbids all: the user can't widen
    assert merge(some, ComplianceProfile(approved_tools=["SEARCH", "x"])).approved_tools == [
        "search"
    ]

    def eff(p: ComplianceProfile) -> EffectiveProfile:
        return EffectiveProfile("acme", 3, 1, p)

    check_tool(eff(none), "anything")
    check_tool(eff(some), "Search")
    with pytest.raises(ToolNotApprovedError) as info:
        check_tool(eff(some), "delete_all")
    assert "'delete_all'" in str(info.value) and "fetch, search" in str(info.value)
    assert info.value.details()["approved_tools"] == ["fetch", "search"]
    assert info.value.details()["profile_version"] == "3.1"
    with pytest.raises(ToolNotApprovedError, match="every tool is forbidden"):
        check_tool(eff(empty), "fetch")
    err = BlockedKeywordError("secret", ("answers", 0, "text"), org_id="acme")
    assert err.issues[0]["loc"] == ["answers", 0, "text"] and "'secret'" in str(err)


# --- over HTTP ------------------------------------------------------------------------------------


@dataclass
class Service:
    url: str
    keys: dict[str, str]
    org: str
    redis_url: str

    def client(self, agent: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-API-Key": self.keys[agent]}, timeout=30)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Service]:
    from test_service import cleanup_service_keys, running_service

    tmp = tmp_path_factory.mktemp("compliance")
    org = f"t-org-{uuid.uuid4().hex[:10]}"
    agents = {
        "cmp-admin": {"org": org, "purposes": ["compliance_admin"]},
        "cmp-agent": {"org": org, "purposes": ["diagnostics"]},
        "other-admin": {"org": f"{org}-b", "purposes": ["compliance_admin"]},
    }
    raw = {a: new_key() for a in agents}
    doc = {
        a: {"key_sha256": hash_key(raw[a]), "namespaces": [], **rec} for a, rec in agents.items()
    }
    keys_file = tmp / "api_keys.json"
    keys_file.write_text(json.dumps(doc))
    settings = get_settings(
        data_dir=tmp / "ctx",
        reports_dir=tmp / "reports",
        redis_url=redis_url,
        api_keys_file=keys_file,
        l3_timeout_ms=5000,
    )
    try:
        with running_service(settings) as url:
            yield Service(url, raw, org, redis_url)
    finally:
        cleanup_service_keys(redis_url)
        cleanup_keys(redis_url, f"cmp:{{org:{org}*")
        for agent in agents:
            cleanup_keys(redis_url, f"svc:agent:{{{agent}}}:*")


def _start(c: httpx.Client, user: str = "u-1") -> httpx.Response:
    sid = f"t-{uuid.uuid4().hex[:12]}"
    return c.post("/v1/sessions", json={"session_id": sid, "user_id": user, "user_query": "q"})


def _put(c: httpx.Client, path: str, version: int, profile: dict[str, Any]) -> httpx.Response:
    return c.put(path, json={"expected_version": version, "profile": profile})


def test_http_profiles_admin_versioning_validation_and_history(service: Service) -> None:
    org_path = f"/v1/compliance/orgs/{service.org}"
    with (
        service.client("cmp-admin") as admin,
        service.client("cmp-agent") as agent,
        service.client("other-admin") as other,
    ):
        r = _put(agent, org_path, 0, {"language": "en"})  # no compliance_admin purpose
        assert r.status_code == 403 and "compliance_admin" in r.json()["detail"]
        r = _put(other, org_path, 0, {"language": "en"})  # another org's admin
        assert r.status_code == 403 and service.org in r.json()["detail"]
        assert agent.get(org_path).json()["version"] == 0
        r = _put(admin, org_path, 0, {"language": "en", "data_retention_policy": 30})
        assert r.status_code == 200, r.text
        assert r.json()["version"] == 1 and r.json()["updated_by"] == "cmp-admin"
        r = _put(admin, org_path, 0, {"language": "de"})  # stale
        assert r.status_code == 409
        assert r.json()["error"] == "version_conflict" and r.json()["current_version"] == 1
        r = _put(admin, org_path, 1, {"timezone": "Mars/Olympus", "colour": "red"})
        assert r.status_code == 422
        issues = r.json()["detail"]
        assert any(i["field"] == "profile" and "allowed fields" in i["msg"] for i in issues)
        r = _put(admin, org_path, 1, {"timezone": "Mars/Olympus"})
        assert r.status_code == 422
        assert r.json()["detail"][0]["field"] == "profile.timezone"
        assert "IANA" in r.json()["detail"][0]["msg"]
        got = agent.get(org_path)
        assert got.status_code == 200 and got.json()["profile"]["language"] == "en"
        assert other.get(org_path).status_code == 403
        hist = admin.get(org_path + "/history")
        assert hist.status_code == 200
        entries = hist.json()["entries"]
        assert [(e["version"], e["operator"]) for e in entries] == [(1, "cmp-admin")]
        assert entries[0]["sha256"] == got.json()["sha256"]
        assert agent.get(org_path + "/history").status_code == 403
        user_path = f"{org_path}/users/alice@example.com"
        r = _put(admin, user_path, 0, {"blocked_keywords": ["draft"]})
        assert r.status_code == 200 and r.json()["user_id"] == "alice@example.com"
        assert admin.get(user_path + "/history").json()["entries"][0]["changed"] == [
            "blocked_keywords"
        ]


def test_http_session_snapshot_tool_calls_and_blocked_keywords(service: Service) -> None:
    org_path = f"/v1/compliance/orgs/{service.org}"
    profile = {"approved_tools": ["fetch", "search"], "blocked_keywords": ["confidential"]}
    with service.client("cmp-admin") as admin, service.client("cmp-agent") as agent:
        current = admin.get(org_path).json()["version"]
        assert _put(admin, org_path, current, profile).status_code == 200
        version = current + 1
        r = _start(agent)
        assert r.status_code == 201, r.text
        info, state = r.json()["info"], r.json()["state"]
        sid = r.json()["session"]["session_id"]
        assert info["compliance"]["org_id"] == service.org
        assert info["compliance"]["profile_version"] == f"{version}.0"
        snap_key = info["compliance"]["snapshot_key"]
        assert snap_key == f"wm:{{{sid}}}:compliance:profile"
        rc = redis_client(service.redis_url, decode_responses=True)
        try:
            snap = json.loads(rc.get(snap_key))["data"]
            assert snap["profile"]["approved_tools"] == ["fetch", "search"]
            assert 0 < rc.ttl(snap_key) <= 900

            def tool(st: str, name: str) -> httpx.Response:
                event = {"type": "tool_call", "name": name, "args": {}, "result": {"ok": 1}}
                return agent.post(f"/v1/sessions/{sid}/events", json={"state": st, "event": event})

            r = tool(state, "delete_all")
            assert r.status_code == 403, r.text
            body = r.json()
            assert body["error"] == "tool_not_approved" and body["tool"] == "delete_all"
            assert body["approved_tools"] == ["fetch", "search"]
            assert "'delete_all'" in body["detail"] and "fetch, search" in body["detail"]
            r = tool(state, "fetch")  # the refused call changed nothing: the same state works
            assert r.status_code == 200, r.text
            state = r.json()["state"]
            # a profile change reaches the session when its snapshot is read again
            assert _put(admin, org_path, version, {"approved_tools": ["delete_all"]}).is_success
            r = tool(state, "delete_all")
            assert r.status_code == 403  # still the snapshot taken at session start
            rc.delete(snap_key)  # as if expired (or deleted by session_timeout)
            r = tool(state, "delete_all")
            assert r.status_code == 200, r.text
            state = r.json()["state"]
            assert json.loads(rc.get(snap_key))["data"]["profile_version"] == f"{version + 1}.0"
        finally:
            rc.close()


def test_http_confirmations_and_goal_refuse_blocked_keywords(service: Service) -> None:
    org_path = f"/v1/compliance/orgs/{service.org}"
    with service.client("cmp-admin") as admin, service.client("cmp-agent") as agent:
        current = admin.get(org_path).json()["version"]
        profile = {"blocked_keywords": ["confidential", "机密"]}
        assert _put(admin, org_path, current, profile).status_code == 200
        r = _start(agent)
        state = r.json()["state"]
        sid = r.json()["session"]["session_id"]
        url = f"/v1/sessions/{sid}/confirmations"
        bad = {"text": "The CONFIDENTIAL pump list", "section": "PUMP"}
        r = agent.post(url, json={"state": state, "answers": [{"text": "fine"}, bad]})
        assert r.status_code == 422, r.text
        issue = r.json()["detail"][0]
        assert r.json()["error"] == "invalid_request"
        assert issue["field"] == "answers.1.text" and issue["type"] == "blocked_keyword"
        assert "'confidential'" in issue["msg"]
        r = agent.post(url, json={"state": state, "answers": [{"text": "这是机密"}]})
        assert r.status_code == 422 and "机密" in r.json()["detail"][0]["msg"]
        ok = {"text": "PUMP-0042 seal was replaced", "section": "PUMP"}
        r = agent.post(url, json={"state": state, "answers": [ok]})
        assert r.status_code == 201, r.text
        event = {"type": "goal_achieved", "answers": [bad]}
        r = agent.post(f"/v1/sessions/{sid}/events", json={"state": state, "event": event})
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == "answers.0.text"
        event = {"type": "goal_achieved", "answers": [ok]}
        r = agent.post(f"/v1/sessions/{sid}/events", json={"state": state, "event": event})
        assert r.status_code == 200, r.text
        assert r.json()["info"]["last_completed_task"]["session_id"] == sid


def test_http_confirmations_refuse_look_alike_keywords(service: Service) -> None:
    """Issue 32: invisible characters and look-alike letters do not hide a blocked keyword
    in a confirmed answer (text or title), nor does a keyword typed with look-alikes miss."""
    org_path = f"/v1/compliance/orgs/{service.org}"
    with service.client("cmp-admin") as admin, service.client("cmp-agent") as agent:
        current = admin.get(org_path).json()["version"]
        profile = {"blocked_keywords": ["confidential", "ѕесrеt"]}  # Cyrillic ѕ е с е
        assert _put(admin, org_path, current, profile).status_code == 200
        r = _start(agent)
        state = r.json()["state"]
        url = f"/v1/sessions/{r.json()['session']['session_id']}/confirmations"
        disguised = [
            "con\u034ffid\u2063en\u200btial",  # CGJ, invisible separator, ZWSP
            "confi\u00addential",  # soft hyphen
            "соnfidеntiаl",  # Cyrillic о е а
            "ＣＯＮＦＩＤＥＮＴＩＡＬ",  # full-width
            "𝐂𝐨𝐧𝐟𝐢𝐝𝐞𝐧𝐭𝐢𝐚𝐥",  # mathematical bold
            "con\U000e0066fidential\ufe0f",  # tag character, variation selector
            "confidéntial",  # accent
            "SECRET",  # plain word, keyword typed with look-alikes
        ]
        for text in disguised:
            for field in ("text", "title"):
                answer = {"text": "fine", "title": "fine", field: f"The {text} pump list"}
                r = agent.post(url, json={"state": state, "answers": [answer]})
                assert r.status_code == 422, (text, field, r.text)
                issue = r.json()["detail"][0]
                assert issue["field"] == f"answers.0.{field}", text
                assert issue["type"] == "blocked_keyword", text
        ok = {"text": "The secretary keeps a confidentiality log", "section": "PUMP"}
        r = agent.post(url, json={"state": state, "answers": [ok]})
        assert r.status_code == 201, r.text


def test_keys_file_org_defaults_and_is_validated() -> None:
    from context_core.access.auth import KeyStore

    digest = hash_key(new_key())
    ks = KeyStore.from_mapping({"a": {"key_sha256": digest}})
    assert ks.agents[0].org == "default"
    ks = KeyStore.from_mapping({"a": {"key_sha256": digest, "org": "acme"}})
    assert ks.agents[0].org == "acme"
    with pytest.raises(ConfigError, match=r"a\.org must be"):
        KeyStore.from_mapping({"a": {"key_sha256": digest, "org": "no/slash"}})
