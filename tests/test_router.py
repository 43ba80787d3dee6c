"""ContextRouter on real parts: Redis, Qdrant Edge on a temp dir, the packaged MiniLM model."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import cleanup_keys, redis_client

from context_core.access.namespaces import Grant, NamespaceRegistry
from context_core.config import Settings, get_settings
from context_core.errors import (
    AccessDeniedError,
    CollectionNotFoundError,
    ConfigError,
    ContextMissError,
    ModelMismatchError,
)
from context_core.gateway.sanitize import Gateway
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.embedding import Encoder
from context_core.knowledge.memory import KnowledgeMemory
from context_core.knowledge.qdrant_server import QdrantServerStore
from context_core.knowledge.store import (
    Hit,
    PointRecord,
    SearchQuery,
    SparseVector,
    VectorStore,
    point_id,
)
from context_core.routing.confidence import ConfidencePolicy
from context_core.routing.intents import IntentRegistry, IntentSpec, L2KeySpec, NsKeySpec
from context_core.routing.router import LOW_CONFIDENCE_NOTE, ContextBundle, ContextRouter
from context_core.session.state import SessionState
from context_core.traces import TraceWriter, fragment_cites, read_traces, validate_record
from context_core.working_memory import SessionMemory, WorkingMemory

UPDATED = dt.datetime(2026, 11, 1, 8, 0, tzinfo=dt.UTC)

KNOWLEDGE: list[tuple[str, str, str]] = [
    (
        "PUMP",
        "Pump vibration limits",
        "Centrifugal pump vibration limits: alarm above 4.5 mm/s RMS, trip above 7.1 mm/s RMS "
        "measured on the bearing housing.",
    ),
    (
        "PUMP",
        "Pump maintenance report template",
        "Pump maintenance report template: summary, measured vibration, probable cause, "
        "corrective actions, sign-off by the shift engineer.",
    ),
    (
        "PUMP",
        "Mechanical seal replacement",
        "To replace a pump mechanical seal, isolate and drain the pump, remove the coupling "
        "guard, then withdraw the back pull-out assembly.",
    ),
    (
        "FAN",
        "Fan vibration limits",
        "Axial fan vibration limits: alarm above 6.3 mm/s RMS; check blade pitch and balance.",
    ),
    (
        "COMP",
        "Compressor discharge temperature",
        "Screw compressor trips on high discharge temperature above 110 degrees Celsius.",
    ),
    (
        "Report Templates",
        "Maintenance work report template",
        "Maintenance work report template: equipment id, findings, root cause, actions taken, "
        "parts used, sign-off.",
    ),
]


@pytest.fixture(scope="module")
def redis_url(redis_or_cluster: str) -> str:
    """This module runs once on the system Redis (or embedded Valkey), once on a Redis Cluster."""
    return redis_or_cluster


def _points(encoder: Encoder) -> list[PointRecord]:
    vecs = encoder.encode([t for _, _, t in KNOWLEDGE])
    out = []
    for i, ((section, title, text), vec) in enumerate(zip(KNOWLEDGE, vecs, strict=True)):
        source = f"page-{i}"
        out.append(
            PointRecord(
                id=point_id(source, 0),
                vector=vec.tolist(),
                payload={
                    "source": source,
                    "title": title,
                    "section": section,
                    "heading_path": [title],
                    "updated_at": UPDATED.isoformat(),
                    "updated_at_ts": UPDATED.timestamp(),
                    "chunk_index": 0,
                    "content_hash": hashlib.sha256(text.encode()).hexdigest(),
                    "text": text,
                    "model": encoder.name,
                },
            )
        )
    return out


class SlowStore:
    """A real EdgeStore whose search sleeps first: the L3 timeout path, without mocks."""

    def __init__(self, inner: EdgeStore, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s

    def search(
        self, vector: Sequence[float], query: SearchQuery, sparse: SparseVector | None = None
    ) -> list[Hit]:
        time.sleep(self.delay_s)
        return self.inner.search(vector, query, sparse)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


@dataclass
class Env:
    settings: Settings
    gateway: Gateway
    client: redis.Redis
    store: EdgeStore
    knowledge: KnowledgeMemory
    tracer: TraceWriter
    session_id: str
    redis_url: str

    def router(self, **kw: Any) -> ContextRouter:
        kw.setdefault("knowledge", self.knowledge)
        kw.setdefault("policy", ConfidencePolicy())
        kw.setdefault("l3_timeout_ms", 10_000)  # generous: only the degraded tests time out
        return ContextRouter(wm=WorkingMemory(self.client, self.gateway), tracer=self.tracer, **kw)

    @property
    def user_id(self) -> str:
        """Per test: preferences are per user and outlive sessions (no TTL)."""
        return f"u-{self.session_id}"

    def state(
        self, step: int = 2, device: str | None = "PUMP-0042", query: str | None = None
    ) -> SessionState:
        s = SessionState.start(
            self.session_id,
            self.user_id,
            query or "Why is the pump vibrating?",
            gateway=self.gateway,
        )
        return s.advance(current_step=step, last_device_id=device)

    def sm(self) -> SessionMemory:
        return WorkingMemory(self.client, self.gateway).session(self.session_id)

    def traces(self) -> list[dict[str, Any]]:
        """The records written so far, each checked against its schema: the router writes
        its own without the writer's check (``write_route(validate=False)``)."""
        recs = list(read_traces(self.settings.traces_dir))
        for r in recs:
            validate_record(r)
        return recs


@pytest.fixture
def env(tmp_path: Path, redis_url: str, session_id: str, encoder: Encoder) -> Iterator[Env]:
    settings = get_settings(
        data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports", redis_url=redis_url
    )
    gw = Gateway()
    client = redis_client(redis_url, decode_responses=True)
    store = EdgeStore(settings.qdrant_dir)
    km = KnowledgeMemory(store, encoder, settings, gw)
    km.ensure_collections()
    store.upsert(settings.collection_main, _points(encoder))
    tracer = TraceWriter(settings.traces_dir, gateway=gw)
    yield Env(settings, gw, client, store, km, tracer, session_id, redis_url)
    cleanup_keys(redis_url, f"wm:{{{session_id}}}:*")
    cleanup_keys(redis_url, f"pref:{{default:u-{session_id}}}:*")
    client.zrem("ctx:activity", session_id)  # every route is session activity
    store.close()
    client.close()


def _pid(i: int) -> str:
    return point_id(f"page-{i}", 0)


def _sources(bundle: ContextBundle, layer: str) -> list[str]:
    return [f.source for f in bundle.fragments if f.layer == layer]


# --- provenance per intent -----------------------------------------------------------------


# The provenance tests give the router a budget larger than any bundle here, so every
# fragment's provenance is checked; the budget itself is tested in test_bundle_budget.py.
ALL = 50


def test_fetch_sensor_data_bundle(env: Env) -> None:
    sid = env.session_id
    sm = env.sm()
    sm.add_series_point("PUMP-0042.vibration", time.time() - 1800, 4.2)
    sm.update_contract({"goal": "diagnose"}, expected_version=0)
    with env.router(max_fragments=ALL) as router:
        b = router.route(env.state(), "fetch_sensor_data")
    assert b.sources == (
        "L1:session.user_query",
        "L1:session.current_step",
        "L1:session.last_device_id",
        f"L2:wm:{{{sid}}}:series:PUMP-0042.vibration",
        f"L2:wm:{{{sid}}}:contract:current",
    )
    series = b.fragments[3]
    assert series.content["points"] == 1 and series.content["newest"][1] == 4.2
    assert 0.45 < series.freshness_hours < 0.55
    assert (series.relevance, series.confidence, series.label) == (1.0, 1.0, "exact")
    assert b.fragments[4].content["fields"] == {"goal": "diagnose"}
    assert b.fragments[4].content["status"] == "active"
    assert not b.degraded and b.by_layer("L3") == ()
    assert b.context_used["by_reference"] == [] and "fallback" not in b.context_used
    assert b.context_used["l2"] == [
        f"wm:{{{sid}}}:series:PUMP-0042.vibration",
        f"wm:{{{sid}}}:contract:current",
    ]
    (rec,) = env.traces()
    assert rec["l3"] == {"requested": False, "query": "", "hits": [], "used": False, "error": None}
    assert rec["l2"]["required"] == []  # both keys are optional for this intent
    assert rec["l2"]["contract_lost"] is False
    assert rec["by_reference"] == [] and rec["fallback"] is None
    cites = {f["source"]: f["cites"] for f in rec["fragments"]}
    assert cites["L1:session.last_device_id"] == ["PUMP-0042"]
    assert cites["L1:session.current_step"] == []
    assert cites[f"L2:wm:{{{sid}}}:series:PUMP-0042.vibration"] == [
        f"wm:{{{sid}}}:series:PUMP-0042.vibration",
        "4.2",
    ]


def test_call_api_bundle_uses_cached_response(env: Env) -> None:
    sm = env.sm()
    params = {"device": "PUMP-0042", "window": "1h"}
    key = sm.put_api_response("sensors/rms", params, {"rms_mm_s": 4.9})
    with env.router(max_fragments=ALL) as router:
        state = env.state()
        state = state.record_tool_call("sensors/rms", params, call_id="c1")
        state = state.record_tool_result("c1", {"rms_mm_s": 4.9}, status="ok")
        b = router.route(
            state, "call_api", params={"endpoint": "sensors/rms", "api_params": params}
        )
        b_other = router.route(
            state, "call_api", params={"endpoint": "sensors/rms", "api_params": {"x": 1}}
        )
    assert b.sources == (
        "L1:session.user_query",
        "L1:session.current_step",
        "L1:session.last_api_result",
        "L1:session.trace",
        f"L2:{key}",
    )
    assert b.fragments[4].content == {"rms_mm_s": 4.9}
    assert b.fragments[2].content["status"] == "ok"
    # other params -> other key: an optional miss, traced, no fragment, no error
    assert _sources(b_other, "L2") == []
    rec = env.traces()[-1]
    assert rec["l2"]["missing"] == [
        sm.api_key("sensors/rms", {"x": 1}),
        f"wm:{{{env.session_id}}}:contract:current",
    ]


def test_compare_vibration_bundle_with_l3(env: Env) -> None:
    sid = env.session_id
    sm = env.sm()
    sm.add_series_point("PUMP-0042.vibration", time.time(), 5.1)
    sm.put_step_result("1", {"rms_mm_s": 5.1})
    with env.router(max_fragments=ALL) as router:
        b = router.route(env.state(), "compare_vibration")
    assert _sources(b, "L1") == [
        "L1:session.user_query",
        "L1:session.current_step",
        "L1:session.last_device_id",
    ]
    assert _sources(b, "L2") == [
        f"L2:wm:{{{sid}}}:series:PUMP-0042.vibration",
        f"L2:wm:{{{sid}}}:step:1",
    ]
    l3 = b.by_layer("L3")
    assert l3, "the pump vibration-limits chunk should come back"
    assert l3[0].source == f"L3:knowledge_main:{_pid(0)}"
    assert all(f.source.startswith("L3:knowledge_main:") for f in l3)
    (rec,) = env.traces()
    assert rec["l3"]["query"] == "PUMP vibration limits and assessment"
    assert {h["section"] for h in rec["l3"]["hits"]} == {"PUMP"}  # default section filter


def test_generate_report_bundle_exact_provenance(env: Env) -> None:
    sid = env.session_id
    sm = env.sm()
    sm.put_step_result("1", {"finding": "bearing wear", "rms_mm_s": 5.1})
    text = KNOWLEDGE[1][2]
    with env.router(max_fragments=ALL) as router:
        b = router.route(env.state(), "generate_report", params={"query": text})
    assert b.sources[:4] == (
        "L1:session.user_query",
        "L1:session.current_step",
        "L1:session.last_device_id",
        f"L2:wm:{{{sid}}}:step:1",
    )
    top = b.by_layer("L3")[0]
    # The stored text itself: cosine ~1.0 (a distance convention would give ~0 here).
    assert top.source == f"L3:knowledge_main:{_pid(1)}"
    assert top.confidence > 0.99 and top.label == "confident" and top.note == ""
    assert top.content["title"] == "Pump maintenance report template"
    expected_age = (time.time() - UPDATED.timestamp()) / 3600
    assert abs(top.freshness_hours - expected_age) < 0.01
    assert b.context_used["l1"] == ["user_query", "current_step", "last_device_id"]
    assert b.context_used["l2"] == [f"wm:{{{sid}}}:step:1"]
    assert b.context_used["l3"][0] == _pid(1)
    assert set(b.timings_ms) == {"l1", "l2", "l3", "total"}
    assert b.timings_ms["total"] >= b.timings_ms["l3"] > 0
    (rec,) = env.traces()
    validate_record(rec)
    assert rec["trace_id"] == b.trace_id
    assert rec["intent"] == "generate_report" and rec["step"] == 2
    # generate_report loads the user's preferences, optionally
    prefs = f"pref:{{default:{env.user_id}}}:*"
    assert rec["l2"] == {
        "requested": [f"wm:{{{sid}}}:step:1", f"wm:{{{sid}}}:contract:current", prefs],
        "required": [f"wm:{{{sid}}}:step:1"],
        "found": [f"wm:{{{sid}}}:step:1"],
        "missing": [f"wm:{{{sid}}}:contract:current", prefs],
        "expired": [],
        "contract_lost": False,  # never written in this session: not lost
    }
    assert b.l2_missing == (f"wm:{{{sid}}}:contract:current", prefs)
    assert rec["fragments"] == [
        {
            "layer": f.layer,
            "source": f.source,
            "confidence": f.confidence,
            "label": f.label,
            "cites": fragment_cites(f.layer, f.source, f.content),
        }
        for f in b.fragments
    ]
    step_cites = rec["fragments"][3]["cites"]
    assert step_cites == [f"wm:{{{sid}}}:step:1", "5.1"]  # key + value; "bearing wear" is words
    top_cites = next(f["cites"] for f in rec["fragments"] if f["source"] == top.source)
    assert top_cites[:3] == [_pid(1), "page-1", "Pump maintenance report template"]
    assert rec["l3"]["used"] is True and rec["l3"]["error"] is None
    # generate_report searches the device's section and the report templates, merged by score
    assert [h["section"] for h in rec["l3"]["hits"]].count("Report Templates") == 1
    assert {h["section"] for h in rec["l3"]["hits"]} == {"PUMP", "Report Templates"}
    scores = [h["score"] for h in rec["l3"]["hits"]]
    assert scores == sorted(scores, reverse=True) and len(scores) == 4


def test_unknown_intent_uses_default(env: Env) -> None:
    with env.router() as router:
        b = router.route(env.state(), "summarise_shift_log")
    assert b.intent == "summarise_shift_log" and b.resolved_intent == "default"
    assert _sources(b, "L2") == []
    assert _sources(b, "L1") == [
        "L1:session.user_query",
        "L1:session.current_step",
        "L1:session.last_device_id",
    ]
    assert env.traces()[0]["intent"] == "summarise_shift_log"


def test_section_filter_override(env: Env) -> None:
    with env.router() as router:
        b = router.route(
            env.state(), "default", params={"section": "FAN", "query": KNOWLEDGE[3][2]}
        )
    assert [f.source for f in b.by_layer("L3")] == [f"L3:knowledge_main:{_pid(3)}"]
    assert {h["section"] for h in env.traces()[0]["l3"]["hits"]} == {"FAN"}


# --- thresholds ------------------------------------------------------------------------------


def test_threshold_edges_on_real_scores(env: Env) -> None:
    query = KNOWLEDGE[0][2]
    hits = env.knowledge.search(query, section="PUMP", limit=3)
    assert len(hits) == 3
    s0, s1, s2 = (h.score for h in hits)
    assert s0 > s1 > s2
    # accept == a real score exactly -> confident; skip == a real score -> low_confidence.
    policy = ConfidencePolicy(accept=s1, skip=s2, source="test")
    with env.router(policy=policy) as router:
        b = router.route(env.state(), "default", params={"query": query})
    l3 = b.by_layer("L3")
    assert [(f.source, f.label) for f in l3] == [
        (f"L3:knowledge_main:{hits[0].id}", "confident"),
        (f"L3:knowledge_main:{hits[1].id}", "confident"),
        (f"L3:knowledge_main:{hits[2].id}", "low_confidence"),
    ]
    assert l3[2].note == LOW_CONFIDENCE_NOTE
    assert b.context_used["l3"] == [hits[0].id, hits[1].id]
    assert b.context_used["l3_reference"] == [hits[2].id]


def test_per_hit_rule_drops_each_hit_just_below_skip(env: Env) -> None:
    """The per_hit option (CTX_CONFIDENCE_RULE=per_hit): each hit below skip is dropped."""
    query = KNOWLEDGE[0][2]
    hits = env.knowledge.search(query, section="PUMP", limit=3)
    just_above = hits[1].score + 1e-6
    policy = ConfidencePolicy(accept=just_above, skip=just_above, source="test", rule="per_hit")
    with env.router(policy=policy) as router:
        b = router.route(env.state(), "default", params={"query": query})
    assert [f.label for f in b.by_layer("L3")] == ["confident"]
    rec = env.traces()[0]
    assert [h["label"] for h in rec["l3"]["hits"]] == ["confident", "below_skip", "below_skip"]
    assert rec["confidence"]["rule"] == "per_hit"


def test_design_rule_keeps_hits_below_skip_for_reference(env: Env) -> None:
    """The design (default): one hit at or above skip keeps L3 in; every hit below accept,
    even below skip, is passed as low_confidence "for reference"."""
    query = KNOWLEDGE[0][2]
    hits = env.knowledge.search(query, section="PUMP", limit=3)
    just_above = hits[1].score + 1e-6
    policy = ConfidencePolicy(accept=just_above, skip=just_above, source="test")
    assert policy.rule == "design"
    with env.router(policy=policy) as router:
        b = router.route(env.state(), "default", params={"query": query})
    l3 = b.by_layer("L3")
    assert [(f.source, f.label) for f in l3] == [
        (f"L3:knowledge_main:{hits[0].id}", "confident"),
        (f"L3:knowledge_main:{hits[1].id}", "low_confidence"),
        (f"L3:knowledge_main:{hits[2].id}", "low_confidence"),
    ]
    assert hits[2].score < policy.skip  # below skip, and still passed on
    assert [f.note for f in l3[1:]] == [LOW_CONFIDENCE_NOTE] * 2
    assert b.context_used["l3"] == [hits[0].id]
    assert b.context_used["l3_reference"] == [hits[1].id, hits[2].id]
    rec = env.traces()[0]
    labels = [h["label"] for h in rec["l3"]["hits"]]
    assert labels == ["confident", "low_confidence", "low_confidence"]
    assert rec["confidence"] == {
        "accept": just_above, "skip": just_above, "source": "test", "model": None,
        "rule": "design", "version": None,
    }  # fmt: skip


def test_design_rule_leaves_l3_out_only_when_every_hit_is_below_skip(env: Env) -> None:
    query = "how much vibration is too much for a pump"
    hits = env.knowledge.search(query, section="PUMP", limit=3)
    above_all = hits[0].score + 1e-4
    policy = ConfidencePolicy(accept=above_all, skip=above_all, source="test")
    with env.router(policy=policy) as router:
        b = router.route(env.state(), "default", params={"query": query})
    assert b.by_layer("L3") == ()
    assert {h["label"] for h in env.traces()[0]["l3"]["hits"]} == {"below_skip"}


def test_all_hits_below_skip_leave_l3_out(env: Env) -> None:
    policy = ConfidencePolicy(accept=0.99, skip=0.98, source="test")
    with env.router(policy=policy) as router:
        b = router.route(env.state(), "default", params={"query": "quarterly sales figures"})
    assert b.by_layer("L3") == ()
    assert not b.degraded
    assert b.context_used["l3"] == [] and b.context_used["l3_reference"] == []
    rec = env.traces()[0]
    assert rec["l3"]["used"] is False
    assert rec["l3"]["hits"] and {h["label"] for h in rec["l3"]["hits"]} == {"below_skip"}


def test_thresholds_file_changes_router_labels(env: Env) -> None:
    query = "how much vibration is too much for a pump"
    hits = env.knowledge.search(query, section="PUMP", limit=3)
    assert hits[0].score < 0.99
    with env.router() as router:
        before = router.route(env.state(), "default", params={"query": query})
    path = env.settings.resolved_thresholds_path
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"accept": hits[0].score + 0.001, "skip": hits[1].score, "method": "test"}
    path.write_text(json.dumps(doc), encoding="utf-8")
    policy = ConfidencePolicy.load(env.settings)
    assert policy.source == str(path)
    with env.router(policy=policy) as router:
        after = router.route(env.state(), "default", params={"query": query})
    with env.router(policy=policy.with_rule("per_hit")) as router:
        after_per_hit = router.route(env.state(), "default", params={"query": query})
    default = ConfidencePolicy().label_hits([h.score for h in hits])
    assert [f.label for f in before.by_layer("L3")] == [
        label for label in default if label != "below_skip"
    ]
    # The file's accept is above every hit; hits[0] and hits[1] reach its skip, so under the
    # design rule all three are passed for reference, under per_hit the third is dropped.
    assert [f.label for f in after.by_layer("L3")] == ["low_confidence"] * 3
    assert [f.label for f in after_per_hit.by_layer("L3")] == ["low_confidence"] * 2


# --- degraded paths ---------------------------------------------------------------------------


def test_slow_store_degrades_to_l1_l2(env: Env) -> None:
    sid = env.session_id
    env.sm().put_step_result("1", {"finding": "bearing wear"})
    slow = KnowledgeMemory(
        SlowStore(env.store, 0.3), env.knowledge.encoder, env.settings, env.gateway
    )
    with env.router(knowledge=slow, l3_timeout_ms=100) as router:
        b = router.route(env.state(), "generate_report")
    assert b.degraded is True
    assert b.by_layer("L3") == ()
    assert _sources(b, "L2") == [f"L2:wm:{{{sid}}}:step:1"]
    # Budget 3: the required step result, then L1 fields in the intent's order.
    assert _sources(b, "L1") == ["L1:session.user_query", "L1:session.current_step"]
    assert [r["source"] for r in b.context_used["by_reference"]] == ["L1:session.last_device_id"]
    assert b.timings_ms["total"] < 300  # the route did not wait for the slow search
    rec = env.traces()[0]
    assert rec["degraded"] is True
    assert rec["l3"]["error"] == "timeout after 100 ms"
    assert rec["l3"]["hits"] == [] and rec["l3"]["used"] is False


def test_on_the_loop_a_remote_store_is_searched_without_a_thread_and_a_hung_one_degrades(
    env: Env,
) -> None:
    """With the edge server's client (a store that awaits on the loop) a route run by
    on_loop searches in a greenlet of its own: the same bundle as the blocking route, no
    L3 worker thread started; a server that never answers degrades the route on time."""
    import asyncio
    import shutil
    import socket
    import tempfile

    from context_core.concurrency import on_loop
    from context_core.knowledge.edge_server import EdgeServer, RemoteEdgeStore

    env.sm().put_step_result("1", {"finding": "bearing wear"})
    env.store.close()  # the server owns the shards now
    d = Path(tempfile.mkdtemp(prefix="ctx-edge-"))
    server = EdgeServer(env.settings.qdrant_dir, d / "edge.sock", search_threads=1).start()
    remote = RemoteEdgeStore(server.socket_path)
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(str(d / "hung.sock"))
    hung.listen(8)
    try:
        km = KnowledgeMemory(remote, env.knowledge.encoder, env.settings, env.gateway)
        assert km.awaits_on_loop is True
        with env.router(knowledge=km) as router:
            blocking = router.route(env.state(), "generate_report")
        with env.router(knowledge=km) as router:
            awaited = asyncio.run(on_loop(router.route, env.state(), "generate_report"))
            assert router._pool._threads == set(), "the search ran on a worker thread"
        assert awaited.degraded is False and awaited.by_layer("L3")
        assert [f.source for f in awaited.fragments] == [f.source for f in blocking.fragments]

        stuck = KnowledgeMemory(
            RemoteEdgeStore(d / "hung.sock", timeout_s=5),
            env.knowledge.encoder,
            env.settings,
            env.gateway,
        )
        with env.router(knowledge=stuck, l3_timeout_ms=100) as router:
            t0 = time.perf_counter()
            b = asyncio.run(on_loop(router.route, env.state(), "generate_report"))
            assert time.perf_counter() - t0 < 1.0
        assert b.degraded is True and b.by_layer("L3") == ()
        assert env.traces()[-1]["l3"]["error"] == "timeout after 100 ms"
    finally:
        hung.close()
        remote.close()
        server.close()
        shutil.rmtree(d, ignore_errors=True)


def test_model_mismatch_surfaces_clearly(env: Env, tmp_path: Path) -> None:
    # Same dimension, other model: a search would "work" and return garbage; the router
    # refuses it with a message naming both models, and degrades to L1+L2.
    settings = get_settings(data_dir=tmp_path / "other", redis_url=env.redis_url)
    store = EdgeStore(settings.qdrant_dir)
    store.create_collection(settings.collection_main, dim=384, model="e5-small-other")
    km = KnowledgeMemory(store, env.knowledge.encoder, settings, env.gateway)
    with pytest.raises(ModelMismatchError, match="e5-small-other"):
        km.ensure_collections()
    with env.router(knowledge=km) as router:
        b = router.route(env.state(), "default")
    store.close()
    assert b.degraded is True
    assert b.by_layer("L3") == () and len(b.by_layer("L1")) == 3
    error = env.traces()[0]["l3"]["error"]
    assert error.startswith("ModelMismatchError:")
    assert "'e5-small-other'" in error and "CTX_EMBED_MODEL=e5-small-other" in error
    assert "'minilm'" in error


# --- L2 misses --------------------------------------------------------------------------------


def test_required_miss_raises_after_trace(env: Env) -> None:
    sid = env.session_id
    with env.router() as router, pytest.raises(ContextMissError) as exc:
        router.route(env.state(), "generate_report")
    assert exc.value.key == f"wm:{{{sid}}}:step:1"
    assert "requires it" in str(exc.value)
    (rec,) = env.traces()
    validate_record(rec)
    assert rec["l2"]["missing"] == [
        f"wm:{{{sid}}}:step:1",
        f"wm:{{{sid}}}:contract:current",
        f"pref:{{default:{env.user_id}}}:*",
    ]
    assert rec["l2"]["found"] == []
    assert rec["l3"]["used"] is False


def test_required_template_value_missing(env: Env) -> None:
    # compare_vibration needs a device for its series key; none in L1, none in params.
    with env.router() as router, pytest.raises(ContextMissError, match="needs 'device'"):
        router.route(env.state(device=None), "compare_vibration")
    (rec,) = env.traces()
    placeholder = f"wm:{{{env.session_id}}}:series:<{{device}}.vibration>"
    assert rec["l2"]["required"] == [placeholder]
    assert rec["l2"]["missing"] == [placeholder, f"wm:{{{env.session_id}}}:step:1"]


def test_expired_key_is_traced_as_expired(env: Env) -> None:
    """Expired vs never written is decided in Redis: a second router (another process, as
    far as it knows) that never saw the key agrees with the first one."""
    sid = env.session_id
    sm = env.sm()
    sm.update_contract({"goal": "report"}, expected_version=0)  # a live session
    sm.put_step_result("1", {"finding": "x"}, ttl_s=1)
    with env.router() as router:
        router.route(env.state(), "generate_report")
        time.sleep(1.3)
        with pytest.raises(ContextMissError):
            router.route(env.state(), "generate_report")
    other = ContextRouter(
        wm=WorkingMemory(redis_client(env.redis_url, decode_responses=True), env.gateway),
        knowledge=None,
        policy=ConfidencePolicy(),
        tracer=env.tracer,
    )
    with other, pytest.raises(ContextMissError):
        other.route(env.state(), "generate_report")
    with env.router() as fresh, pytest.raises(ContextMissError):
        fresh.route(env.state(step=5), "generate_report")  # step 4: never written
    first, second, third, never = env.traces()
    assert first["l2"]["expired"] == []
    assert second["l2"]["expired"] == [f"wm:{{{sid}}}:step:1"]
    assert third["l2"]["expired"] == [f"wm:{{{sid}}}:step:1"]
    assert never["l2"]["missing"][0] == f"wm:{{{sid}}}:step:4"
    assert never["l2"]["expired"] == []
    assert not hasattr(other, "_seen")  # no per-process memory of found keys


def test_route_touches_the_session(env: Env) -> None:
    """A route is session activity: the contract's TTL slides back to wm_contract_ttl_s."""
    sm = env.sm()
    sm.update_contract({"goal": "report"}, expected_version=0)
    key = sm.key("contract", "current")
    env.client.expire(key, 60)
    assert sm.ttl(key) <= 60
    with env.router() as router:
        router.route(env.state(), "fetch_sensor_data")
    assert sm.ttl(key) > 3600
    assert env.client.zscore("ctx:activity", env.session_id) is not None
    env.client.zrem("ctx:activity", env.session_id)


def test_lost_contract_is_traced(env: Env) -> None:
    """A live session whose contract expired: contract_lost in the trace (CER fails it)."""
    sid = env.session_id
    sm = env.sm()
    sm.update_contract({"goal": "report"}, expected_version=0)
    sm.put_step_result("1", {"finding": "x"})
    with env.router(max_fragments=ALL) as router:
        kept = router.route(env.state(), "generate_report")
        env.client.delete(sm.key("contract", "current"))  # what an elapsed TTL does
        lost = router.route(env.state(), "generate_report")
    assert f"L2:wm:{{{sid}}}:contract:current" in kept.sources
    assert f"L2:wm:{{{sid}}}:contract:current" not in lost.sources
    first, second = env.traces()
    assert first["l2"]["contract_lost"] is False
    assert second["l2"]["contract_lost"] is True
    assert second["l2"]["expired"] == [f"wm:{{{sid}}}:contract:current"]


# --- shared namespaces ------------------------------------------------------------------------


def test_namespaces_merge_and_denial(env: Env) -> None:
    ns_name = f"fleet-{uuid.uuid4().hex[:8]}"
    reg = NamespaceRegistry(
        env.client, env.gateway, audit_path=env.settings.data_dir / "audit" / "access.jsonl"
    )
    reg.create(
        ns_name,
        ttl_s=300,
        acl={
            "diag": Grant(frozenset({"diagnostics"}), write=True),
            "intern": Grant(frozenset({"training"})),
        },
    )
    reg.write(ns_name, "baseline:PUMP", {"rms_mm_s": 2.2}, agent_id="diag", purpose="diagnostics")
    registry = IntentRegistry.builtin()
    registry.register(
        IntentSpec(
            name="fleet_check",
            l2_keys=(L2KeySpec("step", "{prev_step}"),),
            namespaces=(NsKeySpec(ns_name, "baseline:{device_prefix}", "diagnostics"),),
        )
    )
    try:
        with env.router(namespaces=reg, registry=registry) as router:
            ok = router.route(env.state(), "fleet_check", agent_id="diag")
            denied = router.route(env.state(), "fleet_check", agent_id="intern")
    finally:
        cleanup_keys(env.redis_url, f"ns:{{{ns_name}}}:*")
    (ns_frag,) = ok.by_layer("NS")
    assert ns_frag.source == f"NS:ns:{{{ns_name}}}:kv:baseline:PUMP"
    assert ns_frag.content == {"rms_mm_s": 2.2}
    assert ok.context_used["ns"] == [f"ns:{{{ns_name}}}:kv:baseline:PUMP"]
    assert denied.by_layer("NS") == ()
    rec_ok, rec_denied = env.traces()
    ref = f"{ns_name}/baseline:PUMP"
    assert rec_ok["ns"] == {"requested": [ref], "found": [ref], "denied": []}
    assert rec_denied["ns"] == {"requested": [ref], "found": [], "denied": [ref]}
    audit = (env.settings.data_dir / "audit" / "access.jsonl").read_text().splitlines()
    assert json.loads(audit[-1])["agent_id"] == "intern"


def test_every_route_writes_one_valid_record(env: Env) -> None:
    env.sm().put_step_result("1", {"finding": "x"})
    with env.router() as router:
        bundles = [
            router.route(env.state(), intent)
            for intent in ("fetch_sensor_data", "call_api", "generate_report", "default")
        ]
    recs = env.traces()
    assert [r["trace_id"] for r in recs] == [b.trace_id for b in bundles]
    for r in recs:
        validate_record(r)


def test_required_namespace_denial_reraises_after_trace(env: Env) -> None:
    ns_name = f"fleet-{uuid.uuid4().hex[:8]}"
    reg = NamespaceRegistry(env.client, env.gateway)
    reg.create(ns_name, ttl_s=60, acl={"diag": Grant(frozenset({"diagnostics"}))})
    registry = IntentRegistry.from_dict(
        {"must_share": {"namespaces": [[ns_name, "baseline:{device_prefix}", "audit", True]]}}
    )
    try:
        router = env.router(namespaces=reg, registry=registry, knowledge=None)
        with router, pytest.raises(AccessDeniedError, match="purpose 'audit' not granted"):
            router.route(env.state(), "must_share", agent_id="diag")
    finally:
        cleanup_keys(env.redis_url, f"ns:{{{ns_name}}}:*")
    (rec,) = env.traces()
    assert rec["ns"]["denied"] == [f"{ns_name}/baseline:PUMP"]


def test_no_knowledge_memory_degrades_intents_that_want_l3(env: Env) -> None:
    with env.router(knowledge=None) as router:
        b = router.route(env.state(), "default")
        b2 = router.route(env.state(), "fetch_sensor_data")
    assert b.degraded is True and b.by_layer("L3") == ()
    assert b2.degraded is False
    first, second = env.traces()
    assert first["l3"]["error"] == "no knowledge memory configured"
    assert second["l3"]["error"] is None


def test_registry_from_data_and_validation() -> None:
    reg = IntentRegistry.from_dict(
        {
            "inspect_seal": {
                "l1_fields": ["user_query"],
                "l2_keys": [["step", "{prev_step}", True], ["api", "{endpoint}"]],
                "l3": True,
                "l3_query": "{device_prefix} seal leak",
                "l3_sections": ["{device_prefix}"],
            }
        }
    )
    spec = reg.get("inspect_seal")
    assert [k.required for k in spec.l2_keys] == [True, False]
    assert spec.required_keys == (L2KeySpec("step", "{prev_step}", True),)
    assert reg.get("no_such_intent").name == "default"
    assert {"fetch_sensor_data", "call_api", "compare_vibration", "generate_report"} <= set(
        reg.names()
    )
    with pytest.raises(ConfigError, match="unknown L1 field"):
        IntentSpec(name="bad", l1_fields=("password",))
    with pytest.raises(ConfigError, match="L2 key kind 'blob' unknown"):
        IntentRegistry.from_dict({"bad": {"l2_keys": [["blob", "x"]]}})


# --- a missing hot collection ----------------------------------------------------------------


def _main_only(backend: str, settings: Settings, encoder: Encoder) -> VectorStore:
    store: VectorStore
    if backend == "edge":
        store = EdgeStore(settings.qdrant_dir)
    else:
        store = QdrantServerStore.connect(":memory:")
    store.create_collection(settings.collection_main, dim=encoder.dim, model=encoder.name)
    store.upsert(settings.collection_main, _points(encoder))
    return store


@pytest.mark.parametrize("backend", ["edge", "server"])
def test_missing_hot_collection_means_no_hot_hits(
    backend: str, env: Env, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = get_settings(data_dir=tmp_path / f"main-only-{backend}", redis_url=env.redis_url)
    store = _main_only(backend, settings, env.knowledge.encoder)
    km = KnowledgeMemory(store, env.knowledge.encoder, settings, env.gateway)
    try:
        assert km.stats() == {"knowledge_main": len(KNOWLEDGE), "hot_knowledge": None}
        hits = km.search(KNOWLEDGE[0][2], section="PUMP")
        assert hits[0].id == _pid(0) and hits[0].score > 0.99
        assert km.search(KNOWLEDGE[3][2], section="FAN")[0].id == _pid(3)
        warned = [r for r in caplog.records if "hot collection 'hot_knowledge'" in r.message]
        assert len(warned) == 1  # once per instance, not per query
        # asking for the hot collection by name is still an error
        with pytest.raises(CollectionNotFoundError, match="'hot_knowledge'"):
            km.search("pump", collection=settings.collection_hot)
        with env.router(knowledge=km) as router:
            b = router.route(env.state(), "default", params={"query": KNOWLEDGE[0][2]})
    finally:
        store.close()
    assert b.degraded is False
    assert b.by_layer("L3")[0].source == f"L3:knowledge_main:{_pid(0)}"
    rec = env.traces()[0]
    assert rec["l3"]["error"] is None and rec["l3"]["used"] is True


def test_missing_main_collection_still_degrades_with_a_clear_error(
    env: Env, tmp_path: Path
) -> None:
    settings = get_settings(data_dir=tmp_path / "empty", redis_url=env.redis_url)
    store = EdgeStore(settings.qdrant_dir)
    store.create_collection(settings.collection_hot, dim=384, model=env.knowledge.encoder.name)
    km = KnowledgeMemory(store, env.knowledge.encoder, settings, env.gateway)
    try:
        with pytest.raises(CollectionNotFoundError, match="'knowledge_main' does not exist"):
            km.search("pump vibration")
        with env.router(knowledge=km) as router:
            b = router.route(env.state(), "default")
    finally:
        store.close()
    assert b.degraded is True and b.by_layer("L3") == ()
    error = env.traces()[0]["l3"]["error"]
    assert error.startswith("CollectionNotFoundError: collection 'knowledge_main' does not exist")
    assert "ensure_collections or the knowledge refresh job" in error


# --- the traces feed CER ---------------------------------------------------------------------


def test_router_traces_give_cer_what_it_needs(env: Env) -> None:
    """Optional misses do not fail loading; outputs are judged against the traced cites."""
    from evaluation.cer import cer_report, judge_steps

    sid = env.session_id
    sm = env.sm()
    sm.update_contract({"device": "PUMP-0042"}, expected_version=0)
    with env.router() as router:
        fetch = router.route(env.state(step=0), "fetch_sensor_data")  # series not fetched yet
        env.tracer.record_output(fetch.trace_id, sid, 0, "Fetching the series for PUMP-0042.")
        sm.add_series_point("PUMP-0042.vibration", time.time(), 5.27)
        sm.put_step_result("0", {"rms_mm_s": 5.27})
        compare = router.route(env.state(step=1), "compare_vibration")
        env.tracer.record_output(compare.trace_id, sid, 1, "RMS 5.27 mm/s is above the alarm.")
        silent = router.route(env.state(step=1), "compare_vibration")
        env.tracer.record_output(silent.trace_id, sid, 1, "Looks bad, replace something.")
    v = {x.trace_id: x for x in judge_steps(env.traces(), accept=ConfidencePolicy().accept)}
    series_key = f"wm:{{{sid}}}:series:PUMP-0042.vibration"
    assert v[fetch.trace_id].effective
    assert v[fetch.trace_id].notes == (
        f"l2_optional_missing: {series_key} (optional for this intent; not a failure)",
    )
    assert v[compare.trace_id].used and v[compare.trace_id].rules_matched == ("cites_source",)
    assert not v[silent.trace_id].used
    assert v[silent.trace_id].reasons[-1].startswith("not_cited: output cites nothing checked by")
    rep = cer_report(list(v.values()))
    assert rep.overall.n_not_checkable == 0
    assert rep.info_notes == {"l2_optional_missing": 1}


# --- preferences --------------------------------------------------------------------------------


def test_preferences_intent_routes_the_users_structured_preferences(env: Env) -> None:
    prefs = env.sm().wm.preferences("default", env.user_id)
    prefs.set("units", "mm/s", confidence=0.9)
    prefs.set("report_language", "de", confidence=0.4)
    prefs.set("detail", {"level": "short"}, confidence=0.7)
    prefs.set("greeting", "none", confidence=0.2)
    uid = env.user_id
    with env.router() as router:
        b = router.route(env.state(), "preferences")
    # Budget 3: the three most confident preferences; the fourth and the L1 fields by reference.
    assert b.sources == (
        f"L2:pref:{{default:{uid}}}:units",
        f"L2:pref:{{default:{uid}}}:detail",
        f"L2:pref:{{default:{uid}}}:report_language",
    )
    units = b.fragments[0]
    assert units.content["value"] == "mm/s" and units.content["confidence"] == 0.9
    assert set(units.content) == {"value", "confidence", "last_updated"}
    assert (units.relevance, units.confidence, units.label) == (0.9, 0.9, "preference")
    assert 0 <= units.freshness_hours < 0.01
    assert b.fragments[1].content["value"] == {"level": "short"}
    assert b.context_used["l2"] == [
        f"pref:{{default:{uid}}}:{t}" for t in ("units", "detail", "report_language")
    ]
    assert [r["source"] for r in b.context_used["by_reference"]] == [
        f"L2:pref:{{default:{uid}}}:greeting",
        "L1:session.user_query",
        "L1:session.current_step",
    ]
    (rec,) = env.traces()
    assert rec["l2"]["requested"] == [f"pref:{{default:{uid}}}:*"]
    assert rec["l2"]["found"] == [f"pref:{{default:{uid}}}:*"] and rec["l2"]["missing"] == []


def test_one_preference_type_and_misses(env: Env) -> None:
    registry = IntentRegistry.from_dict(
        {
            "units_only": {"l1_fields": [], "l2_keys": [["pref", "units"]]},
            "lang_from_params": {"l1_fields": [], "l2_keys": [["pref", "{pref}"]]},
        }
    )
    uid = env.user_id
    with env.router(registry=registry) as router:
        none = router.route(env.state(), "preferences")
        missing = router.route(env.state(), "units_only")
        env.sm().wm.preferences("default", uid).set("units", "in/s", confidence=0.5)
        found = router.route(env.state(), "units_only")
        by_param = router.route(env.state(), "lang_from_params", params={"pref": "units"})
    assert none.sources == ("L1:session.user_query", "L1:session.current_step")
    assert missing.fragments == ()
    assert found.sources == (f"L2:pref:{{default:{uid}}}:units",)
    assert found.fragments[0].content["value"] == "in/s"
    assert by_param.sources == found.sources
    recs = env.traces()
    assert recs[0]["l2"]["missing"] == [f"pref:{{default:{uid}}}:*"]
    assert recs[1]["l2"]["missing"] == [f"pref:{{default:{uid}}}:units"]
    assert recs[1]["l2"]["expired"] == []  # preferences have no TTL: never "expired"
    assert recs[2]["l2"]["found"] == [f"pref:{{default:{uid}}}:units"]
