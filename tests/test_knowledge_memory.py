"""KnowledgeMemory with the real MiniLM encoder, the real gateway and both real store backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from qdrant_server import server_store

from context_core.config import Settings
from context_core.errors import ModelMismatchError, SessionDataInKnowledgeError
from context_core.gateway.sanitize import Gateway
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.embedding import Encoder
from context_core.knowledge.memory import KnowledgeMemory, find_session_keys
from context_core.knowledge.qdrant_server import QdrantServerStore
from context_core.knowledge.store import PointRecord, VectorStore, point_id

T0 = 1_800_000_000.0
DOCS = [
    (
        "sop-pump",
        "PUMP",
        "Replacing the mechanical seal of a centrifugal pump: isolate, drain, "
        "remove the impeller, fit the new seal and check for leaks.",
    ),
    (
        "sop-pump",
        "PUMP",
        "Pump cavitation shows as noise and vibration at the suction side; "
        "raise the suction pressure or lower the flow.",
    ),
    (
        "sop-fan",
        "FAN",
        "Balancing a cooling fan: measure vibration at the bearing housing and "
        "add trim weights until the amplitude drops below 2.8 mm/s.",
    ),
    ("sop-fan", "FAN", "Fan belt tension is checked monthly; a slipping belt squeals at start."),
    (
        "sop-comp",
        "COMP",
        "Compressor high discharge temperature trips: clean the intercooler and "
        "check the oil level.",
    ),
]


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["edge", "server", "qdrant-server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[VectorStore]:
    if request.param == "qdrant-server":  # a real server when one is given, else skipped
        yield from server_store()
        return
    s: VectorStore = (
        EdgeStore(tmp_path / "qdrant")
        if request.param == "edge"
        else QdrantServerStore.connect(":memory:")
    )
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def gateway(tmp_path: Path) -> Gateway:
    return Gateway(audit_path=tmp_path / "audit.jsonl")


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def km(
    store: VectorStore, encoder: Encoder, settings: Settings, gateway: Gateway, clock: Clock
) -> KnowledgeMemory:
    mem = KnowledgeMemory(store, encoder, settings, gateway, clock=clock)
    mem.ensure_collections()
    vecs = encoder.encode([text for _, _, text in DOCS])
    records = []
    for i, ((source, section, text), vec) in enumerate(zip(DOCS, vecs, strict=True)):
        payload = {
            "source": source,
            "section": section,
            "text": text,
            "chunk_index": i,
            "title": source,
            "heading_path": [source],
            "updated_at_ts": T0,
        }
        records.append(PointRecord(point_id(source, i), vec, payload))
    assert mem.upsert_chunks(mem.main, records) == len(DOCS)
    return mem


def test_collections_and_stats(km: KnowledgeMemory) -> None:
    km.ensure_collections()  # idempotent
    assert km.stats() == {"knowledge_main": len(DOCS), "hot_knowledge": 0}


def test_search_defaults_to_top_k_and_cosine(km: KnowledgeMemory) -> None:
    hits = km.search("How do I replace a leaking pump seal?")
    assert len(hits) == km.settings.l3_top_k == 3
    assert hits[0].payload["source"] == "sop-pump"
    assert "mechanical seal" in hits[0].payload["text"]
    assert all(-1.0 <= h.score <= 1.0 for h in hits)
    assert hits[0].score > hits[-1].score


def test_identical_text_scores_one(km: KnowledgeMemory) -> None:
    """Scores are cosine similarity: the stored text itself comes back at ~1.0, not ~0."""
    text = DOCS[3][2]
    hits = km.search(text, limit=1)
    assert hits[0].payload["text"] == text
    assert hits[0].score == pytest.approx(1.0, abs=1e-3)


def test_section_filter(km: KnowledgeMemory) -> None:
    query = "vibration measured at the bearing"
    fan = km.search(query, section="FAN")
    assert [h.payload["section"] for h in fan] == ["FAN", "FAN"]  # only two FAN chunks exist
    pump = km.search(query, section="PUMP", limit=1)
    assert pump[0].payload["section"] == "PUMP"
    assert "cavitation" in pump[0].payload["text"]
    assert km.search(query, section="NO-SUCH-AREA") == []


def test_session_data_is_refused(km: KnowledgeMemory, encoder: Encoder) -> None:
    assert find_session_keys({"a": [{"b": {"Session-Id": 1}}], "uid": 2}) == [
        "$.a[0].b.Session-Id",
        "$.uid",
    ]
    with pytest.raises(SessionDataInKnowledgeError, match=r"\$\.ctx\.sessionId"):
        km.upsert_hot(
            "an answer", source="case-1", section="PUMP", extra={"ctx": {"sessionId": "s-123"}}
        )
    vec = encoder.encode(["x"])[0]
    bad = PointRecord(point_id("p", 0), vec, {"source": "p", "meta": [{"user_id": "u-9"}]})
    with pytest.raises(SessionDataInKnowledgeError, match=r"\$\.meta\[0\]\.user_id"):
        km.upsert_chunks(km.main, [bad])
    assert km.stats() == {"knowledge_main": len(DOCS), "hot_knowledge": 0}  # nothing written


def test_hot_upsert_is_cleaned_and_merged(km: KnowledgeMemory, gateway: Gateway) -> None:
    fake_key = "sk_live_" + "a" * 24
    answer = (
        f"Confirmed: pump PUMP-0042 seal leak fixed by re-torquing the gland; "
        f"call 13812341234; key {fake_key}"
    )
    pid = km.upsert_hot(
        answer,
        source="case-77",
        section="PUMP",
        title="Seal leak",
        confirmed=True,
        extra={"api_key": "x" * 20, "ticket": "T-1"},
    )
    (rec,) = km.store.retrieve(km.hot, [pid])
    p = rec.payload
    assert fake_key not in p["text"] and "13812341234" not in p["text"]
    assert "138****1234" in p["text"]
    assert p["api_key"] == "[REDACTED]" and p["ticket"] == "T-1"
    assert p["expires_at"] == pytest.approx(T0 + 72 * 3600)
    assert p["confirmed"] is True and p["model"] == "minilm" and p["section"] == "PUMP"
    assert any(r.where == "l3:hot_knowledge" for r in gateway.recent_audit)

    hits = km.search("pump gland seal leak re-torque", section="PUMP")
    assert hits[0].id == pid  # hot and main merged by score

    # the same answer again is the same point (expiry refreshed), not a duplicate
    assert km.upsert_hot(answer, source="case-77", section="PUMP") == pid
    assert km.stats()["hot_knowledge"] == 1


def test_hot_expiry_and_sweep(km: KnowledgeMemory, clock: Clock) -> None:
    pid = km.upsert_hot(
        "Fan FAN-7 rattles when the guard screws are loose.", source="case-8", section="FAN"
    )
    other = km.upsert_hot("Fan guard screws need thread locker.", source="case-9", section="FAN")
    assert pid in {h.id for h in km.search("loose fan guard screws rattle", section="FAN")}

    clock.now = T0 + 71 * 3600
    assert km.sweep_expired() == 0
    clock.now = T0 + 73 * 3600
    # expired points are invisible to search even before the sweep runs
    visible = {h.id for h in km.search("loose fan guard screws rattle", section="FAN")}
    assert pid not in visible and other not in visible
    assert km.stats()["hot_knowledge"] == 2
    assert km.sweep_expired() == 2
    assert km.stats()["hot_knowledge"] == 0
    assert km.sweep_expired(now=T0 + 1_000 * 3600) == 0


def test_model_mismatch_on_existing_collection(
    store: VectorStore, encoder: Encoder, settings: Settings, gateway: Gateway
) -> None:
    store.create_collection(settings.collection_main, dim=1024, model="bge-m3")
    km = KnowledgeMemory(store, encoder, settings, gateway)
    with pytest.raises(ModelMismatchError, match=r"'bge-m3' \(1024-d\).*'minilm' \(384-d\)"):
        km.ensure_collections()


def test_hot_points_record_their_writer_and_search_by_scope(km: KnowledgeMemory) -> None:
    """Trust fields are server-made (``extra`` cannot forge them), the caller's source is only
    a claim, an ungranted namespace falls back to the private scope, and scoped search sees
    only the scopes it names (both backends: the any-of filter on ``namespace``)."""
    text = "Pump PUMP-0042 gland leak: re-torque the gland nuts to 12 Nm evenly."
    forged = {"written_by": "agent-a", "namespace": "fleet", "trust": "reviewed", "ticket": "T"}
    b = km.upsert_hot(
        text,
        source="sop-pump",
        section="PUMP",
        written_by="agent-b",
        namespace="fleet",  # no ACL given: nothing can vouch for it
        extra=forged,
    )
    system = km.upsert_hot(text, source="sop-pump", section="PUMP")
    assert b != system  # another scope can never overwrite a point
    pb = km.store.retrieve(km.hot, [b])[0].payload
    assert (pb["written_by"], pb["namespace"], pb["trust"]) == (
        "agent-b",
        "agent:agent-b",
        "unreviewed",
    )
    assert pb["ticket"] == "T" and pb["claimed_source"] == "sop-pump"
    assert pb["source"].startswith("hot-") and pb["source"] != "sop-pump"
    ps = km.store.retrieve(km.hot, [system])[0].payload
    assert (ps["written_by"], ps["namespace"]) == (None, "system:local")

    def hot_ids(scopes: list[str] | None) -> set[str]:
        hits = km.search(text, section="PUMP", hot_scopes=scopes)
        return {h.id for h in hits} & {b, system}

    assert hot_ids(None) == {b, system}  # the operator's unscoped view
    assert hot_ids(["system:local"]) == {system}
    assert hot_ids(["system:local", "agent:agent-b"]) == {b, system}
    assert hot_ids(["agent:agent-a", "fleet"]) == set()
    assert hot_ids([]) == set()
