"""Erasure end to end: data planted through the service's real write paths for two users in
two organisations, one user erased over HTTP, then every store scanned byte by byte.

Planted too: task-contract versions (the history bounded to 2, so older versions are archived
as digests), namespace-access audit lines (a denied read) and a quarantined upload per org
(real clamd; without one the retention test skips, saying so, after checking the rest).

Runs on Redis 7 (or the embedded Valkey) with the compliance store on PostgreSQL, and on a
Redis Cluster with the compliance store on Redis. The same user ids exist in both orgs: the
erasure of ``u-one`` in org A must leave ``u-one`` of org B intact.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import shutil
import string
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import httpx
import pytest
from conftest import cleanup_keys
from redis_cluster import redis_client
from test_compliance import Pg, pg, store  # noqa: F401  (fixtures: PostgreSQL, each backend)
from test_ops_hardening import run_app
from test_upload_scan import MARKER, clamd_url  # noqa: F401  (fixture: a private clamd)

from context_core.access.auth import hash_key, new_key
from context_core.access.compliance import ComplianceStore
from context_core.access.subjects import subject_id, subject_key
from context_core.audit_trail import append_audit
from context_core.config import Settings, get_settings
from context_core.errors import AccessDeniedError
from context_core.governance.erasure import ErasureTarget, replay_ledger
from context_core.governance.inventory import INVENTORY
from context_core.governance.ledger import ErasureLedger
from context_core.governance.retention import enforce_retention
from context_core.ingest.hot import merge_hot

if TYPE_CHECKING:
    from context_core.knowledge.embedding import Encoder

ORGS = ("alpha", "bravo")
USERS = ("u-one", "u-two")
# four unrelated answers: near-duplicates would not all merge into main (DUPLICATE_COSINE)
SENTENCES = {
    ("alpha", "u-one"): "Bearing {} was greased on Monday with lithium soap",
    ("alpha", "u-two"): "The invoice for contract {} goes to the finance office in March",
    ("bravo", "u-one"): "Firmware {} reboots the controller when the clock drifts",
    ("bravo", "u-two"): "Cafeteria menu {} lists vegetarian soup every Thursday",
}


def _letters(n: int) -> str:
    return "".join(random.choice(string.ascii_lowercase[6:]) for _ in range(n))  # no hex digits


@dataclass
class World:
    settings: Settings
    url: str
    app: Any
    keys: dict[str, str]
    orgs: dict[str, str]  # short name -> org id
    run: str
    sessions: dict[tuple[str, str], str]  # (org, user) -> session id
    clamd: str | None = None  # None: no clamd, no upload planted

    def token(self, org: str, user: str, what: str) -> str:
        return f"{self.run}{org}{user.replace('-', '')}{what}"

    def client(self, org: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-API-Key": self.keys[org]}, timeout=60)


@pytest.fixture(params=["redis+postgres", "cluster"], scope="module")
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    if request.param == "cluster":
        redis_url, extra = str(request.getfixturevalue("cluster_redis_url")), {}
    else:
        env: Pg = request.getfixturevalue("pg")
        redis_url = str(request.getfixturevalue("redis_url"))
        extra = {"postgres_url": env.app_url, "postgres_schema": env.schema}
    tmp = tmp_path_factory.mktemp("lifecycle")
    try:
        clamd: str | None = str(request.getfixturevalue("clamd_url"))
    except pytest.skip.Exception:
        clamd = None
    run = _letters(6)
    orgs = {o: f"gov-{o}-{run}" for o in ORGS}
    raw = {o: new_key() for o in ORGS}
    doc = {
        f"agent-{o}-{run}": {
            "key_sha256": hash_key(raw[o]),
            "org": orgs[o],
            "namespaces": [f"shared-{o}-{run}"],
            "purposes": ["compliance_admin", "diagnostics"],
        }
        for o in ORGS
    }
    (tmp / "api_keys.json").write_text(json.dumps(doc))
    settings = get_settings(
        data_dir=tmp / "ctx",
        reports_dir=tmp / "reports",
        redis_url=redis_url,
        api_keys_file=tmp / "api_keys.json",
        l3_timeout_ms=5000,
        wm_contract_history_versions=2,
        clamd_url=clamd,
        clamd_timeout_s=10,
        **extra,
    )
    with run_app(settings) as (url, app):
        w = World(settings, url, app, raw, orgs, run, {}, clamd)
        _plant(w)
        yield w
    for sid in w.sessions.values():
        cleanup_keys(redis_url, f"wm:{{{sid}}}:*")
        cleanup_keys(redis_url, f"svc:{{{sid}}}:*")
    for o in ORGS:
        cleanup_keys(redis_url, f"pref:{{{orgs[o]}:*")
        cleanup_keys(redis_url, f"cmp:{{org:{orgs[o]}}}:*")
        cleanup_keys(redis_url, f"ns:{{shared-{o}-{run}}}:*")
        cleanup_keys(redis_url, f"svc:agent:{{agent-{o}-{run}}}:*")


def _plant(w: World) -> None:
    """Every user-facing write path, for each (org, user): a session with a query, a tool
    result, a context route (trace), a step output, a preference, a compliance user profile,
    three task-contract versions (the oldest archived as a digest), a confirmed answer under
    the org's shared namespace (hot, then merged into main); for each org: a denied read of
    the other org's namespace (access audit line) and a quarantined upload (with clamd)."""
    svc = w.app.state.services
    for o in ORGS:
        ns = f"shared-{o}-{w.run}"
        svc.namespaces.create(ns)
        svc.namespaces.grant(ns, f"agent-{o}-{w.run}", ["diagnostics"], write=True)
    for o in ORGS:
        with w.client(o) as c:
            for u in USERS:
                sid = f"t-gov-{w.run}-{uuid.uuid4().hex[:12]}"
                w.sessions[(o, u)] = sid
                tok = lambda what, o=o, u=u: w.token(o, u, what)  # noqa: E731
                body = {"session_id": sid, "user_id": u, "user_query": f"check {tok('query')}"}
                r = c.post("/v1/sessions", json=body)
                assert r.status_code == 201, r.text
                state = r.json()["state"]
                event = {
                    "type": "tool_call",
                    "name": "fetch",
                    "args": {"device": "PUMP-0042"},
                    "result": {"note": tok("result")},
                }
                r = c.post(f"/v1/sessions/{sid}/events", json={"state": state, "event": event})
                assert r.status_code == 200, r.text
                state = r.json()["state"]
                r = c.post(
                    "/v1/context",
                    json={"session_id": sid, "step_intent": "default", "state": state},
                )
                assert r.status_code == 200, r.text
                r = c.put(f"/v1/sessions/{sid}/preferences/units", json={"value": tok("pref")})
                assert r.status_code == 200, r.text
                v = c.get(f"/v1/sessions/{sid}/contract").json()["version"]
                for i in range(3):
                    body = {"fields": {"scope": f"{tok('contract')} {i}"}, "expected_version": v}
                    r = c.put(f"/v1/sessions/{sid}/contract", json=body)
                    assert r.status_code == 200, r.text
                    v = r.json()["version"]
                path = f"/v1/compliance/orgs/{w.orgs[o]}/users/{u}"
                profile = {"blocked_keywords": [tok("keyword")]}
                r = c.put(path, json={"expected_version": 0, "profile": profile})
                assert r.status_code == 200, r.text
                answer = {
                    "text": SENTENCES[(o, u)].format(tok("answer")),
                    "section": "PUMP",
                    "namespace": f"shared-{o}-{w.run}",
                }
                r = c.post(
                    f"/v1/sessions/{sid}/confirmations", json={"state": state, "answers": [answer]}
                )
                assert r.status_code == 201, r.text
    for o, other in (("alpha", "bravo"), ("bravo", "alpha")):
        with pytest.raises(AccessDeniedError):  # audited in access.jsonl under the agent
            svc.namespaces.read(
                f"shared-{other}-{w.run}",
                w.token(o, "org", "nskey"),
                f"agent-{o}-{w.run}",
                "diagnostics",
            )
        if w.clamd is not None:
            with w.client(o) as c:
                data = f"{MARKER} {w.token(o, 'org', 'upload')}\n".encode()
                r = c.post("/v1/uploads", files={"file": ("report.txt", data, "text/plain")})
                assert r.status_code == 422 and r.json()["error"] == "upload_infected", r.text
    summary = merge_hot(svc.knowledge, namespaces=svc.namespaces)
    assert summary.merged >= len(ORGS) * len(USERS), summary


# --- byte-level scans ---------------------------------------------------------------------------


def _redis_bytes(w: World) -> bytes:
    """Every value of every key the test's ids reach, read by type."""
    r = redis_client(w.settings.redis_url or "", decode_responses=False)
    patterns = [f"wm:{{{s}}}:*" for s in w.sessions.values()]
    patterns += [f"svc:{{{s}}}:*" for s in w.sessions.values()]
    patterns += [f"pref:{{{org}:*" for org in w.orgs.values()]
    patterns += [f"cmp:{{org:{org}}}:*" for org in w.orgs.values()]
    out = bytearray()
    try:
        for pattern in patterns:
            for k in r.scan_iter(match=pattern, count=1000):
                out += k + b"\n"
                kind = r.type(k)
                if kind == b"string":
                    out += r.get(k) or b""
                elif kind == b"hash":
                    for f, v in r.hgetall(k).items():
                        out += f + b"=" + v + b"\n"
                elif kind == b"list":
                    out += b"\n".join(r.lrange(k, 0, -1))
                elif kind == b"set":
                    out += b"\n".join(r.smembers(k))
                elif kind == b"zset":
                    out += b"\n".join(r.zrange(k, 0, -1))
                out += b"\n"
        out += b"\n".join(r.zrange("ctx:activity", 0, -1))
    finally:
        r.close()
    return bytes(out)


def _qdrant_bytes(w: World) -> bytes:
    svc = w.app.state.services
    out = bytearray()
    for name in (w.settings.collection_hot, w.settings.collection_main):
        for rec in svc.store.scroll(name):
            out += json.dumps(rec.payload, ensure_ascii=False).encode() + b"\n"
    return bytes(out)


def _pg_bytes(w: World) -> bytes:
    if not w.settings.postgres_url:
        return b""
    import psycopg2
    from postgres_env import PG_ADMIN_URL

    conn = psycopg2.connect(PG_ADMIN_URL)  # the admin sees every org's rows (no RLS)
    try:
        with conn.cursor() as cur:
            out = bytearray()
            for table in ("compliance_profiles", "compliance_audit"):
                cur.execute(f"SELECT * FROM {w.settings.postgres_schema}.{table}")
                out += repr(cur.fetchall()).encode()
            return bytes(out)
    finally:
        conn.close()


def _file_bytes(w: World) -> bytes:
    out = bytearray()
    for root in (w.settings.data_dir, w.settings.reports_dir):
        for p in sorted(Path(root).rglob("*")):
            if p.is_file() and "qdrant" not in p.parts and "valkey" not in p.parts:
                out += p.read_bytes()
    return bytes(out)


def _scan(w: World) -> dict[str, bytes]:
    return {
        "redis": _redis_bytes(w),
        "qdrant": _qdrant_bytes(w),
        "postgres": _pg_bytes(w),
        "files": _file_bytes(w),
    }


def _where(w: World, scan: dict[str, bytes], org: str, user: str) -> dict[str, list[str]]:
    """Which planted tokens (and the session id) of (org, user) each store holds."""
    out: dict[str, list[str]] = {}
    sid = w.sessions[(org, user)].encode()
    for where, data in scan.items():
        hits = [
            what
            for what in ("query", "result", "pref", "keyword", "answer", "contract")
            if w.token(org, user, what).encode() in data
        ]
        if sid in data:
            hits.append("session_id")
        out[where] = hits
    return out


def _org_where(w: World, scan: dict[str, bytes], org: str) -> dict[str, list[str]]:
    """Which of the org's own planted tokens (a denied namespace read, a quarantined upload)
    each store holds."""
    return {
        where: [what for what in ("nskey", "upload") if w.token(org, "org", what).encode() in data]
        for where, data in scan.items()
    }


def test_erasure_removes_exactly_the_user(world: World) -> None:
    w = world
    before = _scan(w)
    for o in ORGS:
        for u in USERS:
            held = _where(w, before, o, u)
            in_redis = {"query", "result", "pref", "contract"} | (
                set() if w.settings.postgres_url else {"keyword"}
            )
            assert in_redis <= set(held["redis"]), (o, u, held)
            assert "answer" in held["qdrant"], (o, u, held)
            assert "session_id" in held["files"], (o, u, held)  # the route traces
            if w.settings.postgres_url:
                assert "keyword" in held["postgres"], (o, u, held)
    for o in ORGS:  # org-owned records: audit lines, quarantined uploads (files only)
        org_held = _org_where(w, before, o)
        assert org_held["files"] == (["nskey", "upload"] if w.clamd else ["nskey"]), org_held
    # the contract history keeps 2 versions: the older ones are digests in the audit log
    audit_lines = [
        json.loads(x)
        for x in (w.settings.data_dir / "audit" / "audit.jsonl").read_text().splitlines()
    ]
    archives = [x for x in audit_lines if x["kind"] == "contract_history_archive"]
    assert len({x["session_sha256"] for x in archives}) == len(ORGS) * len(USERS)
    assert all(len(e["sha256"]) == 64 and e["changed"] for x in archives for e in x["entries"])
    # every L3 payload field planted is one the inventory declares
    declared = {f for e in INVENTORY for f in e.fields}
    for name in (w.settings.collection_hot, w.settings.collection_main):
        for rec in w.app.state.services.store.scroll(name):
            assert set(rec.payload) <= declared, sorted(set(rec.payload) - declared)

    with w.client("alpha") as c:
        other = c.post(f"/v1/compliance/orgs/{w.orgs['bravo']}/users/u-one/erasure")
        assert other.status_code == 403  # another org's admin cannot erase bravo's user
        r = c.post(f"/v1/compliance/orgs/{w.orgs['alpha']}/users/u-one/erasure")
    assert r.status_code == 200, r.text
    receipt = r.json()
    counts = receipt["counts"]
    assert counts["service_sessions"] == 1 and counts["l2_preferences"] >= 1
    assert counts["l3_points"] == 1 and counts["trace_lines"] >= 1  # merged copy (hot one moved)
    assert counts["compliance_user_records"] >= 2  # the profile and its audit entry
    key = subject_key(w.settings)
    assert receipt["subject"] == subject_id(key, w.orgs["alpha"], "u-one")

    after = _scan(w)
    gone = _where(w, after, "alpha", "u-one")
    assert all(not hits for hits in gone.values()), gone
    for o, u in (("alpha", "u-two"), ("bravo", "u-one"), ("bravo", "u-two")):
        assert _where(w, after, o, u) == _where(w, before, o, u), (o, u)
    for o in ORGS:  # the org's own records are not the user's
        assert _org_where(w, after, o) == _org_where(w, before, o), o
    # the audit log keeps the fact under the keyed hash, never the id or a value
    audit = (w.settings.data_dir / "audit" / "audit.jsonl").read_text()
    line = next(json.loads(x) for x in audit.splitlines() if '"kind":"erasure"' in x)
    assert line["subject"] == receipt["subject"] and line["counts"] == counts
    ledger = (w.settings.data_dir / "erasure" / "ledger.jsonl").read_bytes()
    assert receipt["subject"].encode() in ledger and b"u-one" not in ledger

    # a second erasure finds nothing more (idempotent)
    with w.client("alpha") as c:
        again = c.post(f"/v1/compliance/orgs/{w.orgs['alpha']}/users/u-one/erasure").json()
    assert set(again["counts"].values()) == {0}


def test_replay_reapplies_an_erasure_to_restored_data(world: World) -> None:
    """A 'backup' taken before the erasure (the erased user's records written back as they
    were) is cleaned again by replaying the ledger."""
    w = world
    svc = w.app.state.services
    sid = w.sessions[("alpha", "u-one")]
    with w.client("alpha") as c:  # erased already when the test above ran; idempotent
        erased = c.post(f"/v1/compliance/orgs/{w.orgs['alpha']}/users/u-one/erasure")
        assert erased.status_code == 200, erased.text
    # restore: the preference hash and the compliance profile come back as they were
    pref_key = f"pref:{{{w.orgs['alpha']}:u-one}}:units"
    svc.redis.hset(pref_key, mapping={"value": w.token("alpha", "u-one", "pref")})
    svc.compliance.put(
        w.orgs["alpha"],
        {"blocked_keywords": [w.token("alpha", "u-one", "keyword")]},
        expected_version=0,
        operator="restore",
        user_id="u-one",
    )
    traces = sorted(w.settings.traces_dir.glob("traces-*.jsonl"))[-1]
    with traces.open("a") as fh:
        fh.write(json.dumps({"kind": "step_output", "session_id": sid}) + "\n")
    assert w.token("alpha", "u-one", "pref").encode() in _redis_bytes(w)
    target = ErasureTarget.from_settings(
        w.settings,
        redis=svc.redis,
        compliance=svc.compliance,
        store=svc.store,
        agent_orgs={a.agent_id: a.org for a in svc.keys.agents},
    )
    receipt = replay_ledger(target)
    assert receipt.counts["l2_preferences"] == 1 and receipt.counts["trace_lines"] == 1
    assert receipt.counts["compliance_user_records"] == 2
    gone = _where(w, _scan(w), "alpha", "u-one")
    assert all(not hits for hits in gone.values()), gone
    assert _where(w, _scan(w), "bravo", "u-one")["redis"]  # the other org's user untouched


def test_retention_removes_exactly_the_expired_org(world: World) -> None:
    """alpha keeps data 1 day, bravo 365: two days later (an injected clock, no sleep) alpha's
    traces, L3 points, preferences, namespace-access audit lines and quarantined upload are
    gone, its TTL'd L2 keys (the contract among them) are left to expire, and bravo's data is
    intact; erasure and retention receipts stay. Runs after the erasure tests: checks alpha's
    u-two only."""
    w = world
    svc = w.app.state.services
    with w.client("alpha") as c:  # as after the tests above (idempotent): alpha's u-one gone
        assert c.post(f"/v1/compliance/orgs/{w.orgs['alpha']}/users/u-one/erasure").is_success
    for o, days in (("alpha", 1), ("bravo", 365)):
        with w.client(o) as c:
            path = f"/v1/compliance/orgs/{w.orgs[o]}"
            v = c.get(path).json()["version"]
            body = {"expected_version": v, "profile": {"data_retention_policy": days}}
            assert c.put(path, json=body).status_code == 200
    later = time.time() + 2 * 86_400
    target = ErasureTarget.from_settings(
        w.settings,
        redis=svc.redis,
        compliance=svc.compliance,
        store=svc.store,
        agent_orgs={a.agent_id: a.org for a in svc.keys.agents},
        clock=lambda: later,
        wm=svc.wm,
    )
    target.session_match = f"t-gov-{w.run}-*"  # this run's sessions only (shared test DB)
    before = _scan(w)
    dry = enforce_retention(target, dry_run=True)
    assert dry.counts["trace_lines"] >= 1 and dry.counts["l3_points"] == 1
    assert dry.counts["l2_preferences"] == 1
    assert dry.counts["audit_lines"] == 1  # alpha's denied read; receipts are never counted
    assert dry.counts["quarantined_uploads"] == (1 if w.clamd else 0)
    assert dry.counts["contract_history_archived"] == 0  # each write bounded its own list
    assert set(dry.cutoffs) == {w.orgs["alpha"], w.orgs["bravo"]}
    during = _scan(w)  # a dry run deletes nothing (it appends its receipt to the audit log)
    assert {k: during[k] for k in ("redis", "qdrant", "postgres")} == {
        k: before[k] for k in ("redis", "qdrant", "postgres")
    }
    assert _where(w, during, "alpha", "u-two") == _where(w, before, "alpha", "u-two")

    real = enforce_retention(target)
    assert real.counts == dry.counts
    after = _scan(w)
    held = _where(w, after, "alpha", "u-two")
    assert "pref" not in held["redis"] and not held["qdrant"] and not held["files"], held
    assert {"query", "result"} <= set(held["redis"])  # L2 session keys: their own TTL
    assert {"contract"} <= set(held["redis"])
    for u in USERS:
        assert _where(w, after, "bravo", u) == _where(w, before, "bravo", u)
    assert _org_where(w, after, "alpha")["files"] == []
    assert _org_where(w, after, "bravo") == _org_where(w, before, "bravo")
    qdir = w.settings.upload_quarantine_dir
    if w.clamd:
        assert len(list(qdir.glob("*.bin"))) == 1  # bravo's file; alpha's went with its line
    assert set(enforce_retention(target).counts.values()) == {0}  # idempotent
    audit = (w.settings.data_dir / "audit" / "audit.jsonl").read_text().splitlines()
    runs = [json.loads(x) for x in audit if '"kind":"retention"' in x]
    assert [r["dry_run"] for r in runs] == [True, False, False]
    assert runs[1]["counts"] == real.counts and "u-two" not in "".join(audit)
    assert any('"kind":"erasure"' in x for x in audit)  # receipts outlive the retention
    if w.clamd is None:
        pytest.skip("clamd unavailable: the quarantined uploads were not planted or checked")


def test_compliance_history_is_bounded_and_archived_as_digests(
    store: ComplianceStore,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    """With 2 versions kept, older audit entries of the org's and a user's profile leave the
    store for the audit log, as digests (the user as its subject digest, no value)."""
    org = f"t-org-{uuid.uuid4().hex[:8]}"
    for v in range(5):
        store.put(org, {"language": f"de-X{v}"}, expected_version=v, operator="ops")
    for v in range(3):
        store.put(org, {"timezone": "UTC"}, expected_version=v, operator="ops", user_id="U-Hist")
    target = ErasureTarget(
        redis=cast("Any", None),  # not reached: no retention is set
        compliance=store,
        traces_dir=tmp_path / "traces",
        audit_path=tmp_path / "audit.jsonl",
        ledger=ErasureLedger(tmp_path / "ledger.jsonl"),
        key=b"k" * 32,
        agent_orgs={"ops": org},
        history_versions=2,
    )
    dry = enforce_retention(target, dry_run=True)
    assert dry.counts["compliance_history_archived"] == 3 + 1
    assert len(store.history(org)) == 5
    real = enforce_retention(target)
    assert real.counts["compliance_history_archived"] == 4
    assert [e.version for e in store.history(org)] == [4, 5]
    assert [e.version for e in store.history(org, "u-hist")] == [2, 3]
    assert store.get(org).version == 5  # the profile itself is untouched
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    archived = [x for x in lines if x["kind"] == "compliance_history_archive"]
    assert [[e["version"] for e in x["entries"]] for x in archived] == [[1, 2, 3], [1]]
    assert archived[0]["subject"] is None and archived[1]["subject"].startswith("s~")
    text = json.dumps(archived)
    assert (
        "u-hist" not in text
        and "de-X" not in text
        and len(archived[0]["entries"][0]["sha256"]) == 64
    )
    assert enforce_retention(target).counts["compliance_history_archived"] == 0


def test_retention_of_audit_lines_and_quarantined_uploads(tmp_path: Path, redis_url: str) -> None:
    """Without clamd too: the audit logs and the upload quarantine, written by their real
    writers (the namespace registry, the gateway, the upload quarantine), lose exactly the
    expired org's lines and files; lines naming no org wait for the longest retention;
    receipts stay; a quarantine line whose agent is gone from the keys file is kept."""
    from context_core.access.compliance import RedisComplianceStore
    from context_core.access.namespaces import NamespaceRegistry
    from context_core.errors import UploadBlockedError
    from context_core.gateway.sanitize import Gateway
    from context_core.ingest.upload import _quarantine

    run = _letters(6)
    orgs = {"alpha": f"t-org-{run}-a", "bravo": f"t-org-{run}-b"}
    data = tmp_path / "ctx"
    settings = get_settings(data_dir=data, redis_url=redis_url)
    audit, access = data / "audit" / "audit.jsonl", data / "audit" / "access.jsonl"
    client = redis_client(redis_url, decode_responses=True)
    gw = Gateway(audit_path=audit)
    compliance = RedisComplianceStore(client, gw)
    try:
        registry = NamespaceRegistry(client, gw, audit_path=access)
        t0 = time.time()
        for o in ORGS:
            with pytest.raises(AccessDeniedError):
                registry.read(f"ns-{run}-{o}", f"key-{run}-{o}", f"agent-{o}", "diagnostics")
            err = UploadBlockedError("blocked", keyword="k")
            qid = _quarantine(
                settings.upload_quarantine_dir,
                f"file-{run}-{o}".encode(),
                err,
                source=f"upload:agent-{o}/x.txt",
                content_type="text/plain",
                sha256="0" * 64,
                agent_id=f"agent-{o}",
                now=t0,
            )
            assert qid is not None
        _quarantine(  # an agent no longer in the keys file: no org to judge it by
            settings.upload_quarantine_dir,
            f"file-{run}-gone".encode(),
            UploadBlockedError("blocked", keyword="k"),
            source="upload:agent-gone/x.txt",
            content_type="text/plain",
            sha256="1" * 64,
            agent_id="agent-gone",
            now=t0,
        )
        gw.clean_text("mail jane.doe@example.com", where="t")  # a gateway line: no org
        for o, days in (("alpha", 1), ("bravo", 30)):
            compliance.put(
                orgs[o], {"data_retention_policy": days}, expected_version=0, operator="t"
            )
        later = t0 + 2 * 86_400
        target = ErasureTarget(
            redis=client,
            compliance=compliance,
            traces_dir=data / "traces",
            audit_path=audit,
            ledger=ErasureLedger(data / "erasure" / "ledger.jsonl"),
            key=b"k" * 32,
            agent_orgs={f"agent-{o}": orgs[o] for o in ORGS},
            clock=lambda: later,
            quarantine_dir=settings.upload_quarantine_dir,
        )
        old_receipt = {"ts": t0 - 90 * 86_400, "kind": "erasure", "org": orgs["alpha"]}
        append_audit(audit, old_receipt)  # an old receipt: the proof stays
        assert audit.read_text().count('"findings"') == 1

        dry = enforce_retention(target, dry_run=True)
        assert (dry.counts["audit_lines"], dry.counts["quarantined_uploads"]) == (1, 1)
        assert f"key-{run}-alpha" in access.read_text()
        real = enforce_retention(target)
        assert real.counts == dry.counts
        text = access.read_text()
        assert f"key-{run}-alpha" not in text and f"key-{run}-bravo" in text
        qdir = settings.upload_quarantine_dir
        files = b"".join(p.read_bytes() for p in qdir.glob("*.bin"))
        assert f"file-{run}-alpha".encode() not in files
        assert f"file-{run}-bravo".encode() in files and f"file-{run}-gone".encode() in files
        qlines = (qdir / "quarantine.jsonl").read_text()
        assert "agent-alpha" not in qlines and "agent-bravo" in qlines
        assert '"findings"' in audit.read_text()  # no org: waits for bravo's 30 days
        assert '"kind":"erasure"' in audit.read_text()
        assert set(enforce_retention(target).counts.values()) == {0}  # idempotent

        target.clock = lambda: t0 + 40 * 86_400  # past the longest retention
        last = enforce_retention(target)
        assert last.counts["audit_lines"] == 2  # bravo's denied read, the gateway line
        assert last.counts["quarantined_uploads"] == 2  # bravo's; the unknown agent's
        assert list(qdir.glob("*.bin")) == []
        assert '"findings"' not in audit.read_text() and '"kind":"erasure"' in audit.read_text()
    finally:
        cleanup_keys(redis_url, f"cmp:{{org:t-org-{run}-*")
        client.close()


def test_ctx_erase_and_replay(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line: a preference and a compliance profile planted through the library,
    ``ctx erase`` removes them and prints the receipt; ``ctx erase --replay`` then finds
    nothing, and removes them again once they are written back (a restore)."""
    from typer.testing import CliRunner

    from context_app.cli import app
    from context_core.platform import build_platform

    org = f"gov-cli-{_letters(6)}"
    monkeypatch.setenv("CTX_DATA_DIR", str(tmp_path / "ctx"))
    monkeypatch.setenv("CTX_REPORTS_DIR", str(tmp_path / "reports"))
    monkeypatch.setenv("CTX_REDIS_URL", redis_url)
    monkeypatch.delenv("CTX_API_KEYS_FILE", raising=False)
    monkeypatch.delenv("CTX_POSTGRES_URL", raising=False)
    settings = get_settings()

    def plant() -> None:
        with build_platform(settings, with_knowledge=False) as p:
            p.wm.preferences(org, "u-cli").set("units", "metric")
            p.compliance.put(
                org, {"language": "de"}, expected_version=0, operator="t", user_id="u-cli"
            )
            p.wm.preferences(org, "u-keep").set("units", "imperial")

    def held() -> set[str]:
        with build_platform(settings, with_knowledge=False) as p:
            return {str(k) for k in p.redis.scan_iter(match=f"*{org}*", count=1000)}

    try:
        plant()
        runner = CliRunner()
        r = runner.invoke(app, ["erase", "--org", org, "--user", "U-CLI"])  # canonical: u-cli
        assert r.exit_code == 0, r.output
        receipt = json.loads(r.output)
        assert receipt["counts"]["l2_preferences"] == 2  # the hash and the user's index
        assert receipt["counts"]["compliance_user_records"] == 2  # profile + audit entry
        assert all("u-cli" not in k for k in held()) and any("u-keep" in k for k in held())
        r = runner.invoke(app, ["erase", "--replay"])
        assert r.exit_code == 0, r.output
        assert set(json.loads(r.output)["counts"].values()) == {0}
        plant()  # a backup from before the erasure, restored
        r = runner.invoke(app, ["erase", "--replay"])
        assert json.loads(r.output)["counts"]["l2_preferences"] == 2, r.output
        assert all("u-cli" not in k for k in held())
        r = runner.invoke(app, ["erase", "--org", org])
        assert r.exit_code == 2 and "--user" in r.output
        keys = tmp_path / "keys.json"
        keys.write_text(json.dumps({"cli-agent": {"key_sha256": "0" * 64, "org": org}}))
        monkeypatch.setenv("CTX_API_KEYS_FILE", str(keys))
        with build_platform(get_settings(), with_knowledge=False) as p:
            p.compliance.put(org, {"data_retention_policy": 30}, expected_version=0, operator="t")
        for args in (["retention", "enforce", "--dry-run"], ["retention", "enforce"]):
            r = runner.invoke(app, args)
            assert r.exit_code == 0, r.output
            out = json.loads(r.output)
            assert out["dry_run"] == (args[-1] == "--dry-run") and list(out["cutoffs"]) == [org]
            assert out["counts"]["l2_preferences"] == 0  # u-keep's preference is minutes old
        in_60_days = (dt.datetime.now(dt.UTC) + dt.timedelta(days=60)).isoformat()
        r = runner.invoke(app, ["retention", "enforce", "--dry-run", "--as-of", in_60_days])
        assert json.loads(r.output)["counts"]["l2_preferences"] == 1, r.output  # u-keep's
        r = runner.invoke(app, ["retention", "enforce", "--as-of", in_60_days])
        assert r.exit_code == 2 and "--dry-run" in r.output
        assert any("u-keep" in k for k in held())
    finally:
        cleanup_keys(redis_url, f"pref:{{{org}:*")
        cleanup_keys(redis_url, f"cmp:{{org:{org}}}:*")


def test_restore_from_rdb_and_edge_copy_then_replay(tmp_path: Path, encoder: Encoder) -> None:
    """Backups that respect erasure: L2 from an RDB file (SAVE on a private Redis 7), L3 from a
    copy of the Qdrant Edge shard directory taken with the store closed. Both restored after
    an erasure bring the user's data back; replaying the ledger removes it again and leaves
    the other user alone."""
    from test_ops_hardening import PrivateRedis

    from context_core.gateway.sanitize import Gateway
    from context_core.governance.erasure import erase_user
    from context_core.knowledge.memory import KnowledgeMemory
    from context_core.platform import build_platform

    server = PrivateRedis(tmp_path / "redis")
    server.start()
    try:
        settings = get_settings(data_dir=tmp_path / "ctx", redis_url=server.url)
        org, backup = "bk-org", tmp_path / "backup"
        key = subject_key(settings)

        def target(p: Any) -> ErasureTarget:
            return ErasureTarget.from_settings(
                settings, redis=p.redis, compliance=p.compliance, store=p.store, agent_orgs={}
            )

        def held(p: Any, user: str) -> dict[str, int]:
            pref = p.wm.preferences(org, user).all()
            points = p.store.count(
                settings.collection_hot, filter={"subject": subject_id(key, org, user)}
            )
            return {"pref": len(pref), "profile": p.compliance.get(org, user).version, "l3": points}

        with build_platform(settings, with_knowledge=False) as p:
            km = KnowledgeMemory(p.store, encoder, settings, Gateway())
            km.ensure_collections()
            for user, text in (("u-gone", "Gasket size 42 fits"), ("u-kept", "Oil ISO VG 68")):
                p.wm.preferences(org, user).set("units", "metric")
                p.compliance.put(
                    org, {"language": "de"}, expected_version=0, operator="t", user_id=user
                )
                km.upsert_hot(text, section="PUMP", subject=subject_id(key, org, user))
            assert held(p, "u-gone") == {"pref": 1, "profile": 1, "l3": 1}
            assert p.redis.save()  # the RDB backup: dump.rdb in the server's --dir
        backup.mkdir()
        shutil.copy2(server.workdir / "dump.rdb", backup / "dump.rdb")
        shutil.copytree(settings.qdrant_dir, backup / "qdrant")  # store closed: a clean copy

        with build_platform(settings, with_knowledge=False) as p:
            erase_user(target(p), org, "u-gone")
            assert held(p, "u-gone") == {"pref": 0, "profile": 0, "l3": 0}

        server.stop()  # restore both stores from the backup taken before the erasure
        shutil.copy2(backup / "dump.rdb", server.workdir / "dump.rdb")
        shutil.rmtree(settings.qdrant_dir)
        shutil.copytree(backup / "qdrant", settings.qdrant_dir)
        server.start()
        with build_platform(settings, with_knowledge=False) as p:
            assert held(p, "u-gone") == {"pref": 1, "profile": 1, "l3": 1}  # back from backup
            receipt = replay_ledger(target(p))
            assert receipt.counts["l2_preferences"] == 2 and receipt.counts["l3_points"] == 1
            assert held(p, "u-gone") == {"pref": 0, "profile": 0, "l3": 0}
            assert held(p, "u-kept") == {"pref": 1, "profile": 1, "l3": 1}
    finally:
        server.stop()
