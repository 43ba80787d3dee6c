"""One suite, three backends: Qdrant Edge on a temp dir, qdrant-client's local mode, and the
Edge shards served over a Unix socket (an in-process ``EdgeServer`` + ``RemoteEdgeStore``).

Every test runs unchanged against each and must produce the same ids in the same order; the
expected answers are computed independently with numpy (exact cosine over all points), so a
backend that merely agrees with the other one but is wrong still fails.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from context_core.errors import (
    CollectionNotFoundError,
    InvalidStoreRequestError,
    ModelMismatchError,
)
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.edge_server import EdgeServer, RemoteEdgeStore
from context_core.knowledge.server import QdrantServerStore
from context_core.knowledge.store import PointRecord, VectorStore, point_id

DIM = 16
N = 300
SECTIONS = ("PUMP", "FAN", "COMP")
COLL = "contract"


def _vectors(n: int = N, seed: int = 7) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


VECS = _vectors()


def _payload(i: int) -> dict[str, object]:
    return {
        "source": f"page-{i // 10}",
        "chunk_index": i % 10,
        "section": SECTIONS[i % 3],
        "expires_at": 1_000.0 + i,
        "heading_path": ["Manual", f"H{i % 5}"],
        "text": f"chunk {i}",
    }


IDS = [point_id(f"page-{i // 10}", i % 10) for i in range(N)]


def _records() -> list[PointRecord]:
    return [PointRecord(IDS[i], VECS[i], _payload(i)) for i in range(N)]


@pytest.fixture(params=["edge", "server", "remote"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[VectorStore]:
    edge_server: EdgeServer | None = None
    sock_dir: Path | None = None
    if request.param == "edge":
        s: VectorStore = EdgeStore(tmp_path / "qdrant")
    elif request.param == "server":
        s = QdrantServerStore.connect(":memory:")
    else:
        # a short directory: pytest's tmp_path can exceed the 107 bytes of a socket path
        sock_dir = Path(tempfile.mkdtemp(prefix="ctx-edge-"))
        edge_server = EdgeServer(tmp_path / "qdrant", sock_dir / "edge.sock").start()
        s = RemoteEdgeStore(sock_dir / "edge.sock")
    try:
        yield s
    finally:
        s.close()
        if edge_server is not None:
            edge_server.close()
        if sock_dir is not None:
            shutil.rmtree(sock_dir, ignore_errors=True)


@pytest.fixture
def filled(store: VectorStore) -> VectorStore:
    store.create_collection(COLL, dim=DIM, model="test-16d")
    store.upsert(COLL, _records())
    return store


def _expected(q: np.ndarray, mask: np.ndarray | None = None, k: int = 5) -> list[str]:
    scores = VECS @ q
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    order = np.argsort(-scores, kind="stable")[:k]
    return [IDS[i] for i in order if np.isfinite(scores[i])]


QUERIES = _vectors(20, seed=99)


def test_point_id_is_deterministic_uuid5() -> None:
    assert point_id("page-1", 3) == point_id("page-1", 3)
    assert point_id("page-1", 3) != point_id("page-1", 4)
    assert point_id("page-1", 3)[14] == "5"  # UUID version nibble


def test_store_satisfies_protocol(store: VectorStore) -> None:
    assert isinstance(store, VectorStore)


def test_search_matches_exact_cosine_order(filled: VectorStore) -> None:
    for q in QUERIES:
        hits = filled.search(COLL, q, limit=5)
        assert [h.id for h in hits] == _expected(q)
        # scores are cosine similarities (higher = closer), not distances
        assert hits[0].score == pytest.approx(float(VECS[IDS.index(hits[0].id)] @ q), abs=1e-4)
        assert all(a.score >= b.score for a, b in itertools.pairwise(hits))


def test_identical_vector_scores_one(filled: VectorStore) -> None:
    hits = filled.search(COLL, VECS[42], limit=1)
    assert hits[0].id == IDS[42]
    assert hits[0].score == pytest.approx(1.0, abs=1e-4)
    assert hits[0].payload["text"] == "chunk 42"
    assert hits[0].payload["heading_path"] == ["Manual", "H2"]


def test_equality_filter(filled: VectorStore) -> None:
    mask = np.array([i % 3 == 1 for i in range(N)])  # FAN
    for q in QUERIES[:10]:
        hits = filled.search(COLL, q, limit=5, filter={"section": "FAN"})
        assert [h.id for h in hits] == _expected(q, mask)
        assert {h.payload["section"] for h in hits} == {"FAN"}


def test_any_of_and_range_filters(filled: VectorStore) -> None:
    sources = ["page-3", "page-17", "page-22"]
    mask = np.array([f"page-{i // 10}" in sources for i in range(N)])
    q = QUERIES[0]
    hits = filled.search(COLL, q, limit=7, filter={"source": sources})
    assert [h.id for h in hits] == _expected(q, mask, k=7)

    # range: expires_at < 1050 -> points 0..49; combined with a section
    mask = np.array([1_000.0 + i < 1_050.0 and i % 3 == 0 for i in range(N)])
    hits = filled.search(COLL, q, limit=4, filter={"expires_at": {"lt": 1050}, "section": "PUMP"})
    assert [h.id for h in hits] == _expected(q, mask, k=4)
    assert filled.count(COLL, filter={"expires_at": {"gte": 1_290}}) == 10
    assert filled.count(COLL, filter={"expires_at": {"gt": 1_010, "lte": 1_020}}) == 10


def test_exact_search_equals_default(filled: VectorStore) -> None:
    q = QUERIES[3]
    assert [h.id for h in filled.search(COLL, q, limit=5, exact=True)] == _expected(q)


def test_upsert_same_id_overwrites(filled: VectorStore) -> None:
    assert filled.count(COLL) == N
    new_payload = {**_payload(5), "text": "rewritten"}
    filled.upsert(COLL, [PointRecord(IDS[5], VECS[6], new_payload)])
    assert filled.count(COLL) == N
    (rec,) = filled.retrieve(COLL, [IDS[5]], with_vectors=True)
    assert rec.payload["text"] == "rewritten"
    assert rec.vector is not None
    assert np.allclose(np.asarray(rec.vector), VECS[6], atol=1e-5)


def test_delete_by_ids_and_by_filter(filled: VectorStore) -> None:
    filled.delete(COLL, ids=IDS[:10])
    assert filled.count(COLL) == N - 10
    assert filled.retrieve(COLL, IDS[:10]) == []
    filled.delete(COLL, filter={"expires_at": {"lt": 1_100}})  # removes 10..99
    assert filled.count(COLL) == N - 100
    assert filled.count(COLL, filter={"expires_at": {"lt": 1_100}}) == 0
    filled.delete(COLL, filter={"section": "FAN"})
    assert filled.count(COLL) == sum(1 for i in range(100, N) if i % 3 != 1)
    with pytest.raises(InvalidStoreRequestError, match="refusing to delete all"):
        filled.delete(COLL)


def test_scroll_is_complete(filled: VectorStore) -> None:
    seen = [r.id for r in filled.scroll(COLL, batch=37)]
    assert sorted(seen) == sorted(IDS)
    assert len(seen) == len(set(seen))
    pumps = list(filled.scroll(COLL, filter={"section": "PUMP"}, with_vectors=True, batch=16))
    assert len(pumps) == 100
    assert all(r.payload["section"] == "PUMP" and r.vector is not None for r in pumps)


def test_retrieve_keeps_requested_order(filled: VectorStore) -> None:
    wanted = [IDS[9], IDS[1], point_id("missing", 0), IDS[200]]
    got = filled.retrieve(COLL, wanted)
    assert [r.id for r in got] == [IDS[9], IDS[1], IDS[200]]
    assert got[0].vector is None


def test_info_records_model_and_dim(filled: VectorStore) -> None:
    info = filled.info(COLL)
    assert info is not None
    assert (info.name, info.dim, info.model, info.count) == (COLL, DIM, "test-16d", N)
    assert filled.info("absent") is None


def test_model_mismatch_is_an_error(filled: VectorStore) -> None:
    filled.create_collection(COLL, dim=DIM, model="test-16d")  # idempotent
    with pytest.raises(ModelMismatchError, match=r"'test-16d'.*'other-model'"):
        filled.create_collection(COLL, dim=DIM, model="other-model")
    with pytest.raises(ModelMismatchError, match="16-d"):
        filled.create_collection(COLL, dim=384, model="test-16d")
    with pytest.raises(ModelMismatchError, match="8-d vector"):
        filled.search(COLL, np.ones(8, dtype=np.float32))
    with pytest.raises(ModelMismatchError):
        filled.upsert(COLL, [PointRecord(IDS[0], [0.1] * 8, {})])


def test_bad_requests_are_clear(filled: VectorStore) -> None:
    with pytest.raises(CollectionNotFoundError, match="'nope'"):
        filled.search("nope", QUERIES[0])
    with pytest.raises(InvalidStoreRequestError, match="not a UUID"):
        filled.upsert(COLL, [PointRecord("not-a-uuid", VECS[0], {})])
    with pytest.raises(InvalidStoreRequestError, match="range operators"):
        filled.count(COLL, filter={"expires_at": {"before": 3}})


def test_drop_collection(filled: VectorStore) -> None:
    filled.drop_collection(COLL)
    assert filled.info(COLL) is None
    filled.create_collection(COLL, dim=8, model="other")
    assert filled.count(COLL) == 0


def test_edge_reopen_keeps_points_and_model(tmp_path: Path) -> None:
    root = tmp_path / "qdrant"
    first = EdgeStore(root)
    first.create_collection(COLL, dim=DIM, model="test-16d")
    first.upsert(COLL, _records())
    first.close()

    again = EdgeStore(root)
    try:
        info = again.info(COLL)
        assert info is not None
        assert (info.model, info.dim, info.count) == ("test-16d", DIM, N)
        q = QUERIES[5]
        assert [h.id for h in again.search(COLL, q, limit=5)] == _expected(q)
        with pytest.raises(ModelMismatchError, match="CTX_EMBED_MODEL=test-16d"):
            again.create_collection(COLL, dim=DIM, model="bge-m3")
    finally:
        again.close()


def test_edge_two_stores_share_one_shard(tmp_path: Path) -> None:
    root = tmp_path / "qdrant"
    a, b = EdgeStore(root), EdgeStore(root)
    try:
        a.create_collection(COLL, dim=DIM, model="test-16d")
        a.upsert(COLL, _records()[:10])
        assert b.count(COLL) == 10  # same process, same shard: no WAL lock clash
        a.close()
        assert b.count(COLL) == 10  # still open through b
    finally:
        b.close()


def test_edge_hnsw_built_after_optimize(tmp_path: Path) -> None:
    """Above the indexing threshold optimize() builds HNSW; search still agrees with numpy."""
    n, dim = 11_000, 256  # 11 MB of float32 vectors: above the 10 MB indexing threshold
    rng = np.random.default_rng(3)
    vecs = rng.normal(size=(n, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ids = [point_id("big", i) for i in range(n)]
    s = EdgeStore(tmp_path / "qdrant")
    try:
        s.create_collection("big", dim=dim, model="test-256d")
        s.upsert("big", [PointRecord(ids[i], vecs[i], {"section": "S"}) for i in range(n)])
        status = s.optimize("big")
        assert status.points == n
        assert status.indexed_vectors == n
        hits = s.search("big", vecs[123], limit=3)
        assert hits[0].id == ids[123]
        assert hits[0].score == pytest.approx(1.0, abs=1e-2)  # int8 copies + rescoring
    finally:
        s.close()


def test_edge_search_from_worker_threads(tmp_path: Path) -> None:
    """The router searches from a pool thread: concurrent searches give the serial answers."""
    from concurrent.futures import ThreadPoolExecutor

    s = EdgeStore(tmp_path / "qdrant")
    try:
        s.create_collection(COLL, dim=DIM, model="test-16d")
        s.upsert(COLL, _records())

        def ids_for(j: int) -> list[str]:
            return [h.id for h in s.search(COLL, QUERIES[j], limit=5, filter={"section": "PUMP"})]

        serial = [ids_for(j) for j in range(len(QUERIES))]
        with ThreadPoolExecutor(max_workers=4) as pool:
            threaded = list(pool.map(ids_for, list(range(len(QUERIES))) * 5))
        assert threaded == serial * 5
    finally:
        s.close()


def test_open_store_picks_backend(tmp_path: Path) -> None:
    from context_core.config import get_settings
    from context_core.knowledge.store import open_store

    edge = open_store(get_settings(data_dir=tmp_path / "ctx"))
    try:
        assert isinstance(edge, EdgeStore)
        assert edge.root == (tmp_path / "ctx" / "qdrant").resolve()
    finally:
        edge.close()
    server = open_store(get_settings(data_dir=tmp_path / "ctx", qdrant_url=":memory:"))
    try:
        assert isinstance(server, QdrantServerStore)
        assert server.where == ":memory:"
    finally:
        server.close()


def test_server_unreachable_names_the_url() -> None:
    import socket

    from context_core.errors import BackendUnavailableError

    with socket.socket() as sock:  # a free loopback port with nothing listening on it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    s = QdrantServerStore.connect(url, timeout=2, check_compatibility=False)
    with pytest.raises(
        BackendUnavailableError, match=rf"'knowledge_main' at {url}.*CTX_QDRANT_URL"
    ):
        s.create_collection("knowledge_main", dim=DIM, model="test-16d")
