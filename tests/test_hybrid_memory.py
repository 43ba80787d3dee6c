"""Hybrid retrieval through KnowledgeMemory, and adding sparse vectors to an old collection.

Real encoder (the offline MiniLM), real Qdrant Edge and qdrant-client local mode, real gateway.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from context_core.config import Settings
from context_core.gateway.sanitize import Gateway
from context_core.ingest.add_sparse import add_sparse_vectors
from context_core.ingest.hot import merge_hot
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.embedding import Encoder
from context_core.knowledge.memory import KnowledgeMemory
from context_core.knowledge.qdrant_server import QdrantServerStore
from context_core.knowledge.sparse import SPARSE_ENCODER, SparseEncoder
from context_core.knowledge.store import PointRecord, SearchQuery, VectorStore, point_id

T0 = 1_700_000_000.0
DOCS = [
    ("sop-pump", "PUMP", "Replacing the mechanical seal of a centrifugal pump: isolate, drain, "
     "remove the impeller, fit the new seal and check for leaks."),
    ("sop-pump", "PUMP", "Pump cavitation shows as noise and vibration at the suction side; "
     "raise the suction pressure or lower the flow."),
    ("sop-fan", "FAN", "Balancing a cooling fan: measure vibration at the bearing housing and "
     "add trim weights until the amplitude drops below 2.8 mm/s."),
    ("sop-fan", "FAN", "Fan belt tension is checked monthly; a slipping belt squeals at start."),
    ("sop-comp", "COMP", "Compressor high discharge temperature trips: clean the intercooler "
     "and check the oil level."),
    ("sop-zh", "PUMP", "离心泵机械密封更换：隔离、排空、拆下叶轮，装上新密封并检查泄漏。"),
]  # fmt: skip


@pytest.fixture(params=["edge", "server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[VectorStore]:
    s: VectorStore = (
        EdgeStore(tmp_path / "qdrant")
        if request.param == "edge"
        else QdrantServerStore.connect(":memory:")
    )
    try:
        yield s
    finally:
        s.close()


def _records(encoder: Encoder) -> list[PointRecord]:
    vecs = encoder.encode([t for _, _, t in DOCS])
    return [
        PointRecord(
            point_id(src, i),
            vec,
            {"source": src, "section": sec, "text": text, "chunk_index": i, "updated_at_ts": T0},
        )
        for i, ((src, sec, text), vec) in enumerate(zip(DOCS, vecs, strict=True))
    ]


def _km(
    store: VectorStore, encoder: Encoder, settings: Settings, tmp_path: Path
) -> KnowledgeMemory:
    return KnowledgeMemory(
        store, encoder, settings, Gateway(audit_path=tmp_path / "audit.jsonl"), clock=lambda: T0
    )


@pytest.fixture
def km(store: VectorStore, encoder: Encoder, settings: Settings, tmp_path: Path) -> KnowledgeMemory:
    mem = _km(store, encoder, settings, tmp_path)
    mem.ensure_collections()
    mem.upsert_chunks(mem.main, _records(encoder))
    return mem


def test_new_collections_have_sparse_vectors(km: KnowledgeMemory) -> None:
    for name in (km.main, km.hot):
        info = km.store.info(name)
        assert info is not None and info.sparse == SPARSE_ENCODER
    recs = list(km.store.scroll(km.main, with_vectors=True))
    assert len(recs) == len(DOCS) and all(r.sparse is not None for r in recs)


def test_hybrid_hits_keep_cosine_and_add_sparse_score_and_rank(km: KnowledgeMemory) -> None:
    query = "mechanical seal leaks on the pump"
    dense = {h.id: h for h in km.search(query, limit=6, mode="dense")}
    assert all(h.sparse_score is None for h in dense.values())
    hybrid = km.search(query, limit=4, mode="hybrid")
    assert hybrid[0].payload["text"].startswith("Replacing the mechanical seal")
    assert [h.rank for h in hybrid] == [1, 2, 3, 4]
    for h in hybrid:
        assert h.score == pytest.approx(dense[h.id].score, abs=1e-4)  # the cosine, as before
        assert h.sparse_score is not None
    assert hybrid[0].sparse_score > 0  # type: ignore[operator]
    sparse = km.search(query, limit=3, mode="sparse")
    assert sparse[0].id == hybrid[0].id
    assert all(h.sparse_score and h.sparse_score > 0 for h in sparse)


def test_han_query_matches_han_chunk_through_bigrams(km: KnowledgeMemory) -> None:
    hits = km.search("机械密封泄漏", limit=1, mode="sparse")
    assert hits and hits[0].payload["source"] == "sop-zh"


def test_mode_comes_from_settings(
    store: VectorStore, encoder: Encoder, settings: Settings, tmp_path: Path
) -> None:
    mem = _km(store, encoder, settings.model_copy(update={"retrieval_mode": "dense"}), tmp_path)
    mem.ensure_collections()
    mem.upsert_chunks(mem.main, _records(encoder))
    assert all(h.sparse_score is None for h in mem.search("pump seal"))
    assert all(h.sparse_score is not None for h in mem.search("pump seal", mode="hybrid"))


def test_main_and_hot_fused_in_one_search(km: KnowledgeMemory) -> None:
    km.upsert_hot("Pump seal replacement: torque the gland bolts to 25 Nm.", section="PUMP")
    hits = km.search("pump seal gland torque", limit=4, mode="hybrid")
    hot = [h for h in hits if h.payload.get("trust") == "unreviewed"]
    assert len(hot) == 1 and hot[0].sparse_score and hot[0].sparse_score > 0
    assert [h.rank for h in hits] == [1, 2, 3, 4]


def test_sparse_terms_come_from_the_cleaned_text(km: KnowledgeMemory, encoder: Encoder) -> None:
    text = "Login for the pump panel: api_key=Zz9abcSecret then restart"
    vec = encoder.encode([text])[0]
    rec = PointRecord(point_id("sop-secret", 0), vec, {"source": "sop-secret", "text": text})
    km.upsert_chunks(km.main, [rec])
    (stored,) = km.store.retrieve(km.main, [rec.id], with_vectors=True)
    assert stored.sparse is not None
    secret = set(SparseEncoder().encode_query("Zz9abcSecret").indices)
    assert secret and not secret & set(stored.sparse.indices)
    assert "Zz9abcSecret" not in stored.payload["text"]


def test_hot_merge_carries_sparse_vectors(km: KnowledgeMemory) -> None:
    km.upsert_hot("Fan belt squeal: re-tension to 6 mm deflection.", section="FAN", confirmed=True)
    summary = merge_hot(km, now=T0)
    assert summary.merged == 1
    merged = [
        r for r in km.store.scroll(km.main, with_vectors=True) if r.payload.get("merged_from")
    ]
    assert len(merged) == 1 and merged[0].sparse is not None


def test_old_dense_only_collection_gets_sparse_without_reembedding(
    store: VectorStore, encoder: Encoder, settings: Settings, tmp_path: Path
) -> None:
    mem = _km(store, encoder, settings, tmp_path)
    # built before sparse vectors existed: the plain dense collection, no sparse record
    store.create_collection(mem.main, dim=encoder.dim, model=encoder.name)
    mem.ensure_collections()  # leaves the existing collection as it is
    mem.upsert_chunks(mem.main, _records(encoder))
    info = store.info(mem.main)
    assert info is not None and info.sparse is None
    hits = mem.search("mechanical seal leaks", limit=3, mode="hybrid")  # runs as dense
    assert all(h.sparse_score is None for h in hits)
    before = {r.id: np.asarray(r.vector) for r in store.scroll(mem.main, with_vectors=True)}

    # an interrupted run: half the points got their sparse vector, then it stopped
    store.enable_sparse(mem.main, SPARSE_ENCODER)
    half = list(store.scroll(mem.main, with_vectors=True))[:3]
    store.set_sparse(
        mem.main,
        list(zip([r.id for r in half], SparseEncoder().encode_documents(
            [r.payload["text"] for r in half]), strict=True)),
    )  # fmt: skip
    done = add_sparse_vectors(store, mem.main)
    assert (done.points, done.already, done.written, done.without_text) == (len(DOCS), 3, 3, 0)
    again = add_sparse_vectors(store, mem.main)
    assert (again.already, again.written) == (len(DOCS), 0)

    after = {r.id: r for r in store.scroll(mem.main, with_vectors=True)}
    assert after.keys() == before.keys()
    for pid, rec in after.items():
        assert np.array_equal(np.asarray(rec.vector), before[pid])  # dense untouched
        assert rec.sparse is not None
    info = store.info(mem.main)
    assert info is not None and info.sparse == SPARSE_ENCODER
    hits = mem.search("mechanical seal leaks", limit=3, mode="hybrid")
    assert hits[0].payload["source"] == "sop-pump" and hits[0].sparse_score


def test_a_v1_collection_keeps_its_tokenizer(
    store: VectorStore, encoder: Encoder, settings: Settings, tmp_path: Path
) -> None:
    """A collection written before the Snowball stemmer keeps answering: its documents and
    queries are cut by the plural-only v1 tokenizer it recorded, not by this version's."""
    v1 = SparseEncoder.from_name("bm25-crc32-v1")
    mem = _km(store, encoder, settings, tmp_path)
    for name in (mem.main, mem.hot):
        store.create_collection(name, dim=encoder.dim, model=encoder.name, sparse=v1.name)
    mem.ensure_collections()  # existing collections stay as they are
    mem.upsert_chunks(mem.main, _records(encoder))
    fan = DOCS[2][2]
    (stored,) = store.retrieve(mem.main, [point_id("sop-fan", 2)], with_vectors=True)
    want = v1.encode_documents([fan])[0]
    assert stored.sparse is not None and stored.sparse.indices == want.indices
    assert stored.sparse.values == pytest.approx(want.values, rel=1e-6)  # stored as float32
    hits = mem.search("bearing housing", limit=1, mode="sparse")
    assert hits and hits[0].payload["source"] == "sop-fan" and hits[0].sparse_score
    # the same query cut by v2 ("bear", "hous") shares no term with those documents
    vec = encoder.encode_query("bearing housing")
    v2_hits = store.search(
        vec,
        SearchQuery(mem.main, 1, mode="sparse"),
        sparse=SparseEncoder().encode_query("bearing housing"),
    )
    assert not v2_hits or not v2_hits[0].sparse_score


def test_feedback_moves_the_dense_query_and_keeps_the_cosine(
    store: VectorStore, tmp_path: Path
) -> None:
    """Pseudo-relevance feedback: B, a neighbour of the best hit A, overtakes C, which is
    closer to the query itself; every hit's score stays its cosine to the query."""
    q = np.array([1.0, 0.0, 0.0])
    vecs = {"A": [0.9, 0.436, 0.0], "B": [0.6, 0.8, 0.0], "C": [0.7, -0.714, 0.0]}
    term = SparseEncoder().encode_query("pump")
    store.create_collection("fb", dim=3, model="toy", sparse=SPARSE_ENCODER)
    store.upsert(
        "fb",
        [PointRecord(point_id(k, 0), v, {"source": k}, sparse=term) for k, v in vecs.items()],
    )
    store.optimize("fb")

    def run(feedback: int) -> list[tuple[str, float]]:
        hits = store.search(
            q,
            SearchQuery("fb", 3, mode="hybrid", fusion="weighted", feedback=feedback),
            sparse=term,
        )
        return [(h.payload["source"], h.score) for h in hits]

    plain, fed = run(0), run(1)
    assert [s for s, _ in plain] == ["A", "C", "B"]
    assert [s for s, _ in fed] == ["A", "B", "C"]
    cos = {k: float(np.dot(q, v) / np.linalg.norm(v)) for k, v in vecs.items()}
    for source, score in plain + fed:
        assert score == pytest.approx(cos[source], abs=1e-4)
