"""Merged answers in ``knowledge_main`` never cross organisations.

``knowledge_main`` is one corpus for every organisation of a deployment. An answer org A's
agent confirmed under A's shared namespace is merged into it by the daily job; before the fix
the merged copy was served to every agent of every organisation, and the merge's
near-duplicate check dropped org B's own answer as a "duplicate" of A's.

Real parts: the HTTP service under uvicorn (its own keys file with two organisations; on the
Edge backend its gRPC server too), Redis for the namespace ACLs, the packaged MiniLM encoder,
and each L3 backend: Qdrant Edge on a temp dir, qdrant-client's local mode, the Edge shards
behind an edge server's Unix socket.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from conftest import cleanup_keys
from google.protobuf import json_format
from test_ops_hardening import run_app
from test_service import free_port

from context_app.rpc.v1 import context_pb2 as pb
from context_app.rpc.v1 import context_pb2_grpc as pb_grpc
from context_core.access.auth import hash_key, new_key
from context_core.config import get_settings
from context_core.ingest.hot import merge_hot
from context_core.knowledge.edge_server import EdgeServer
from context_core.knowledge.memory import hot_scopes, reader_filter
from context_core.routing.intents import IntentSpec, NsKeySpec

#: agent -> (org, purposes); the namespaces are made per run (``World.ns``).
AGENTS = {
    "tk-a-writer": ("A", ["diagnostics"]),
    "tk-a-reader": ("A", ["diagnostics"]),
    "tk-b-agent": ("B", ["diagnostics"]),
}


@dataclass
class World:
    url: str
    app: Any
    keys: dict[str, str]
    ns: dict[str, str]  # org -> its shared namespace
    tag: str
    grpc_target: str | None = None

    @property
    def svc(self) -> Any:
        return self.app.state.services

    def client(self, agent: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-API-Key": self.keys[agent]}, timeout=60)

    def merge(self) -> dict[str, int]:
        return merge_hot(self.svc.knowledge, namespaces=self.svc.namespaces).to_dict()

    def main_points(self, text: str) -> list[dict[str, Any]]:
        km = self.svc.knowledge
        return [r.payload for r in km.store.scroll(km.main) if r.payload.get("text") == text]


@pytest.fixture(scope="module", params=["edge", "qdrant-local", "edge-server"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp(f"tenant-knowledge-{request.param}")
    tag = uuid.uuid4().hex[:8]
    ns = {"A": f"tk-a-{tag}", "B": f"tk-b-{tag}"}
    raw = {a: new_key() for a in AGENTS}
    doc = {
        a: {
            "key_sha256": hash_key(raw[a]),
            "org": f"tk-org-{org.lower()}-{tag}",
            "purposes": purposes,
            "namespaces": [ns[org]],
        }
        for a, (org, purposes) in AGENTS.items()
    }
    (tmp / "api_keys.json").write_text(json.dumps(doc))
    backend: dict[str, Any] = {}
    edge_server: EdgeServer | None = None
    sock_dir: Path | None = None
    if request.param == "edge":
        backend["grpc_port"] = free_port()
    elif request.param == "qdrant-local":
        backend["qdrant_url"] = ":memory:"
    elif request.param == "edge-server":
        sock_dir = Path(tempfile.mkdtemp(prefix="ctx-tk-"))  # a socket path is short
        edge_server = EdgeServer(tmp / "shards", sock_dir / "edge.sock").start()
        backend["edge_socket"] = sock_dir / "edge.sock"
    settings = get_settings(
        data_dir=tmp / "ctx",
        reports_dir=tmp / "reports",
        redis_url=redis_url,
        api_keys_file=tmp / "api_keys.json",
        l3_timeout_ms=20_000,
        **backend,
    )
    try:
        with run_app(settings) as (url, app):
            port = backend.get("grpc_port")
            w = World(url, app, raw, ns, tag, f"127.0.0.1:{port}" if port else None)
            reg = w.svc.namespaces
            reg.create(ns["A"])
            reg.grant(ns["A"], "tk-a-writer", ["diagnostics"], write=True)
            reg.grant(ns["A"], "tk-a-reader", ["diagnostics"])
            reg.create(ns["B"])
            reg.grant(ns["B"], "tk-b-agent", ["diagnostics"], write=True)
            registry = w.svc.router.registry
            for org in ("A", "B"):  # a route that declares the org's namespace
                registry.register(
                    IntentSpec(
                        name=f"ask_{org.lower()}",
                        l3=True,
                        l3_query="{user_query}",
                        namespaces=(NsKeySpec(ns[org], "baseline:{device_prefix}", "diagnostics"),),
                    )
                )
            yield w
    finally:
        for n in ns.values():
            cleanup_keys(redis_url, f"ns:{{{n}}}:*")
        cleanup_keys(redis_url, "wm:{tk-*")
        cleanup_keys(redis_url, "svc:{tk-*")
        for agent in AGENTS:
            cleanup_keys(redis_url, f"svc:agent:{{{agent}}}:*")
        if edge_server is not None:
            edge_server.close()
        if sock_dir is not None:
            shutil.rmtree(sock_dir, ignore_errors=True)


def _session(c: httpx.Client, query: str) -> tuple[str, str]:
    """A new session: its id and its sealed state."""
    sid = f"tk-{uuid.uuid4().hex[:12]}"
    r = c.post("/v1/sessions", json={"session_id": sid, "user_id": "u-1", "user_query": query})
    assert r.status_code == 201, r.text
    assert r.json()["session"]["session_id"] == sid
    return sid, str(r.json()["state"])


def _confirm(c: httpx.Client, text: str, namespace: str) -> str:
    sid, state = _session(c, text)
    r = c.post(
        f"/v1/sessions/{sid}/confirmations",
        json={"state": state, "answers": [{"text": text, "namespace": namespace}]},
    )
    assert r.status_code == 201, r.text
    ((confirmed),) = r.json()["confirmed"]
    return str(confirmed["scope"])


def _l3_texts(c: httpx.Client, query: str, intent: str) -> list[str]:
    """The texts of the L3 fragments a route with ``query`` delivers."""
    sid, state = _session(c, query)
    r = c.post(
        "/v1/context",
        json={"session_id": sid, "step_intent": intent, "state": state},
    )
    assert r.status_code == 200, r.text
    frags = r.json()["fragments"]
    return [str(f["content"].get("text")) for f in frags if f["layer"] == "L3"]


def _l3_texts_grpc(world: World, agent: str, query: str, intent: str) -> list[str]:
    """:func:`_l3_texts` over gRPC (CreateSession, GetContext)."""
    assert world.grpc_target is not None
    md = (("authorization", f"Bearer {world.keys[agent]}"),)
    with grpc.insecure_channel(world.grpc_target) as channel:
        stub = pb_grpc.ContextServiceStub(channel)
        sid = f"tk-{uuid.uuid4().hex[:12]}"
        made = stub.CreateSession(
            pb.CreateSessionRequest(user_id="u-1", user_query=query, session_id=sid),
            metadata=md,
            timeout=60,
        )
        bundle = stub.GetContext(
            pb.ContextRequest(session_id=sid, step_intent=intent, state=made.state),
            metadata=md,
            timeout=60,
        )
    frags = json_format.MessageToDict(bundle, preserving_proto_field_name=True)["fragments"]
    return [str(f["content"].get("text")) for f in frags if f["layer"] == "L3"]


def test_a_merged_answer_stays_in_its_organisation(world: World) -> None:
    secret = f"pump tk{world.tag} seal kit is part 77-{world.tag} from the A plant store"
    question = secret  # B asks exactly what A's answer says: the closest possible match
    with world.client("tk-a-writer") as a, world.client("tk-b-agent") as b:
        assert _confirm(a, secret, world.ns["A"]) == world.ns["A"]
        summary = world.merge()
        assert summary["merged"] == 1, summary
        (merged,) = world.main_points(secret)
        # the merged point keeps the scope and the writer of its hot source
        assert merged["namespace"] == world.ns["A"]
        assert merged["written_by"] == "tk-a-writer"
        assert merged["merged_from"] == world.svc.knowledge.hot
        assert merged["trust"] == "reviewed"

        # org B's agent, over HTTP, with the exact text: nothing of it, declared or not
        for intent in ("default", "ask_a", "ask_b"):
            assert secret not in _l3_texts(b, question, intent), intent
        # and the library search in B's scopes does not even return it (a route declaring
        # A's namespace adds it to the scopes: then the ACL check drops it, as above)
        km = world.svc.knowledge
        b_hits = km.search(question, hot_scopes=hot_scopes("tk-b-agent", [world.ns["B"]]))
        assert secret not in {h.payload.get("text") for h in b_hits}
        # the operator's unscoped view still holds it
        assert secret in {h.payload.get("text") for h in km.search(question)}

        # org A's writer with the namespace declared gets it; without declaring it, not
        assert secret in _l3_texts(a, question, "ask_a")
        assert secret not in _l3_texts(a, question, "default")
        if world.grpc_target is not None:  # the gRPC path routes through the same code
            for intent in ("default", "ask_a"):
                assert secret not in _l3_texts_grpc(world, "tk-b-agent", question, intent)
            assert secret in _l3_texts_grpc(world, "tk-a-writer", question, "ask_a")


def test_a_revoked_read_grant_hides_the_merged_answer(world: World) -> None:
    secret = f"fan tk{world.tag} bearing grease is batch 31-{world.tag} for plant A only"
    with world.client("tk-a-writer") as a, world.client("tk-a-reader") as reader:
        assert _confirm(a, secret, world.ns["A"]) == world.ns["A"]
        assert world.merge()["merged"] == 1
        assert secret in _l3_texts(reader, secret, "ask_a")
        world.svc.namespaces.revoke(world.ns["A"], "tk-a-reader")
        try:
            assert secret not in _l3_texts(reader, secret, "ask_a")
        finally:
            world.svc.namespaces.grant(world.ns["A"], "tk-a-reader", ["diagnostics"])
        # the writer losing write hides it as well (checked at read time, as for hot points)
        world.svc.namespaces.grant(world.ns["A"], "tk-a-writer", ["diagnostics"], write=False)
        try:
            assert secret not in _l3_texts(reader, secret, "ask_a")
        finally:
            world.svc.namespaces.grant(world.ns["A"], "tk-a-writer", ["diagnostics"], write=True)
        assert secret in _l3_texts(reader, secret, "ask_a")


def test_b_answer_identical_to_a_answer_is_merged_not_dropped(world: World) -> None:
    """The duplicate check looks at curated points and the same scope only: org B's answer
    is not dropped because org A's identical one exists (which would tell B it does)."""
    text = f"compressor tk{world.tag} oil change interval is 4000 hours ({world.tag})"
    with world.client("tk-a-writer") as a, world.client("tk-b-agent") as b:
        assert _confirm(a, text, world.ns["A"]) == world.ns["A"]
        assert world.merge()["merged"] == 1
        assert _confirm(b, text, world.ns["B"]) == world.ns["B"]
        summary = world.merge()
        assert summary["merged"] == 1 and summary["duplicates"] == 0, summary
        scopes = sorted(p["namespace"] for p in world.main_points(text))
        assert scopes == sorted(world.ns.values())
        # each organisation reads its own copy, once
        assert _l3_texts(b, text, "ask_b").count(text) == 1
        assert _l3_texts(a, text, "ask_a").count(text) == 1
        # a second copy in the same scope is a duplicate, as before
        assert _confirm(b, text, world.ns["B"]) == world.ns["B"]
        assert world.merge()["duplicates"] == 1


def test_a_system_answer_every_reader_sees_still_counts_as_a_duplicate(world: World) -> None:
    text = f"fan tk{world.tag} guard bolts are M8 stainless ({world.tag}) everywhere"
    world.svc.knowledge.upsert_hot(text, section="GENERAL", confirmed=True)  # the platform's
    assert world.merge()["merged"] == 1
    with world.client("tk-a-writer") as a:
        assert _confirm(a, text, world.ns["A"]) == world.ns["A"]
        assert world.merge() == {"merged": 0, "duplicates": 1, "expired": 0, "kept": 0}
        assert _l3_texts(a, text, "ask_a").count(text) == 1
    assert [p["namespace"] for p in world.main_points(text)] == ["system:local"]


def test_reader_filter_shape() -> None:
    """Curated points (no namespace, never merged) or the reader's scopes: the filter the
    store contract tests check on every backend."""
    assert reader_filter(["system:local", "fleet"]) == {
        "$or": [
            {"namespace": {"empty": True}, "merged_from": {"empty": True}},
            {"namespace": ["system:local", "fleet"]},
        ]
    }
    assert reader_filter([]) == {
        "$or": [{"namespace": {"empty": True}, "merged_from": {"empty": True}}]
    }


def test_ctx_unscoped_merged_finds_and_deletes_only_unscoped_merged_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answers merged before merges kept their namespace: hidden from every reader, listed
    by ``ctx unscoped-merged --dry-run`` and deleted by it; curated chunks and scoped merged
    answers stay."""
    from typer.testing import CliRunner

    from context_app.cli import app
    from context_core.knowledge.edge import EdgeStore
    from context_core.knowledge.store import PointRecord, SearchQuery, point_id

    settings = get_settings(data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports")
    main = settings.collection_main
    vec = [1.0, 0.0, 0.0, 0.0]
    points = {
        "curated": {"source": "p1", "text": "curated"},
        "legacy": {"source": "hot-1", "text": "legacy", "merged_from": "hot_knowledge"},
        "scoped": {
            "source": "hot-2",
            "text": "scoped",
            "merged_from": "hot_knowledge",
            "namespace": "fleet",
        },
    }
    ids = {name: point_id(name, 0) for name in points}
    with EdgeStore(settings.qdrant_dir) as store:
        store.create_collection(main, dim=4, model="test-4d")
        store.upsert(main, [PointRecord(ids[n], vec, p) for n, p in points.items()])
        # no reader sees the legacy answer, whatever its scopes
        seen = store.search(vec, SearchQuery(main, 10, reader_filter(["system:local", "fleet"])))
        assert {h.payload["text"] for h in seen} == {"curated", "scoped"}
    monkeypatch.setenv("CTX_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("CTX_REPORTS_DIR", str(settings.reports_dir))
    runner = CliRunner()
    dry = runner.invoke(app, ["unscoped-merged", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "1 unscoped merged answer(s)" in dry.output and "dry run" in dry.output
    refused = runner.invoke(app, ["unscoped-merged"], input="n\n")
    assert refused.exit_code == 1 and "nothing deleted" in refused.output
    done = runner.invoke(app, ["unscoped-merged", "--yes"])
    assert done.exit_code == 0 and "deleted 1 unscoped" in done.output, done.output
    with EdgeStore(settings.qdrant_dir) as store:
        left = {r.payload["text"] for r in store.scroll(main)}
    assert left == {"curated", "scoped"}
