"""One suite, three backends: Qdrant Edge on a temp dir, qdrant-client's local mode, and the
Edge shards served over a Unix socket (an in-process ``EdgeServer`` + ``RemoteEdgeStore``);
a fourth, a real Qdrant server or cluster, when ``CTX_TEST_QDRANT_URL`` (or an empty
``CTX_QDRANT_URL``) names one, skipped otherwise (``tests/qdrant_server.py``).
Sparse vectors and the sparse/hybrid retrieval modes are checked the same way, against BM25
and reciprocal rank fusion computed with numpy.

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
from qdrant_server import server_store

from context_core.errors import (
    CollectionNotFoundError,
    InvalidStoreRequestError,
    ModelMismatchError,
)
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.edge_server import EdgeServer, RemoteEdgeStore
from context_core.knowledge.qdrant_server import QdrantServerStore
from context_core.knowledge.store import (
    PointRecord,
    SearchQuery,
    SparseVector,
    VectorStore,
    point_id,
    search_batch,
)

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


@pytest.fixture(params=["edge", "server", "remote", "qdrant-server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[VectorStore]:
    if request.param == "qdrant-server":
        yield from server_store()
        return
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
        hits = filled.search(q, SearchQuery(COLL, 5))
        assert [h.id for h in hits] == _expected(q)
        # scores are cosine similarities (higher = closer), not distances
        assert hits[0].score == pytest.approx(float(VECS[IDS.index(hits[0].id)] @ q), abs=1e-4)
        assert all(a.score >= b.score for a, b in itertools.pairwise(hits))


def test_identical_vector_scores_one(filled: VectorStore) -> None:
    hits = filled.search(VECS[42], SearchQuery(COLL, 1))
    assert hits[0].id == IDS[42]
    assert hits[0].score == pytest.approx(1.0, abs=1e-4)
    assert hits[0].payload["text"] == "chunk 42"
    assert hits[0].payload["heading_path"] == ["Manual", "H2"]


def test_equality_filter(filled: VectorStore) -> None:
    mask = np.array([i % 3 == 1 for i in range(N)])  # FAN
    for q in QUERIES[:10]:
        hits = filled.search(q, SearchQuery(COLL, 5, filter={"section": "FAN"}))
        assert [h.id for h in hits] == _expected(q, mask)
        assert {h.payload["section"] for h in hits} == {"FAN"}


def test_any_of_and_range_filters(filled: VectorStore) -> None:
    sources = ["page-3", "page-17", "page-22"]
    mask = np.array([f"page-{i // 10}" in sources for i in range(N)])
    q = QUERIES[0]
    hits = filled.search(q, SearchQuery(COLL, 7, filter={"source": sources}))
    assert [h.id for h in hits] == _expected(q, mask, k=7)

    # range: expires_at < 1050 -> points 0..49; combined with a section
    mask = np.array([1_000.0 + i < 1_050.0 and i % 3 == 0 for i in range(N)])
    hits = filled.search(
        q, SearchQuery(COLL, 4, filter={"expires_at": {"lt": 1050}, "section": "PUMP"})
    )
    assert [h.id for h in hits] == _expected(q, mask, k=4)
    assert filled.count(COLL, filter={"expires_at": {"gte": 1_290}}) == 10
    assert filled.count(COLL, filter={"expires_at": {"gt": 1_010, "lte": 1_020}}) == 10


# A reader's scope filter on main (context_core.knowledge.memory.reader_filter): curated points
# carry no namespace (absent or null), merged answers carry their scope.
SCOPES = ("org-a", "org-b", "system:local", None, "<absent>")


def _scope(i: int) -> str | None:
    return SCOPES[i % len(SCOPES)]


def _scoped(store: VectorStore) -> VectorStore:
    store.create_collection(COLL, dim=DIM, model="test-16d")
    recs = []
    for i in range(N):
        payload = _payload(i)
        if _scope(i) != "<absent>":
            payload["namespace"] = _scope(i)
        recs.append(PointRecord(IDS[i], VECS[i], payload))
    store.upsert(COLL, recs)
    return store


def test_empty_and_or_filters(store: VectorStore) -> None:
    s = _scoped(store)
    curated = np.array([_scope(i) in (None, "<absent>") for i in range(N)])
    assert s.count(COLL, filter={"namespace": {"empty": True}}) == int(curated.sum())
    reader = {"$or": [{"namespace": {"empty": True}}, {"namespace": ["org-a", "system:local"]}]}
    mask = np.array([_scope(i) in (None, "<absent>", "org-a", "system:local") for i in range(N)])
    for q in QUERIES[:6]:
        hits = s.search(q, SearchQuery(COLL, 8, filter=reader))
        assert [h.id for h in hits] == _expected(q, mask, k=8)
        assert "org-b" not in {h.payload.get("namespace") for h in hits}
    assert s.count(COLL, filter=reader) == int(mask.sum())
    # an $or next to other conditions: all of them hold; a clause holds when all of its do
    fan = {**reader, "section": "FAN"}
    mask_fan = mask & np.array([i % 3 == 1 for i in range(N)])
    hits = s.search(QUERIES[7], SearchQuery(COLL, 6, filter=fan))
    assert [h.id for h in hits] == _expected(QUERIES[7], mask_fan, k=6)
    two = {"$or": [{"namespace": "org-b", "section": "PUMP"}, {"expires_at": {"lt": 1_020}}]}
    mask_two = np.array(
        [(_scope(i) == "org-b" and i % 3 == 0) or 1_000.0 + i < 1_020 for i in range(N)]
    )
    assert s.count(COLL, filter=two) == int(mask_two.sum())
    hits = s.search(QUERIES[8], SearchQuery(COLL, 5, filter=two))
    assert [h.id for h in hits] == _expected(QUERIES[8], mask_two)
    # the same filter scrolls and deletes the same points
    assert {r.id for r in s.scroll(COLL, filter=reader)} == {IDS[i] for i in range(N) if mask[i]}
    s.delete(COLL, filter={"$or": [{"namespace": "org-b"}]})
    assert s.count(COLL, filter={"namespace": "org-b"}) == 0
    assert s.count(COLL) == N - sum(_scope(i) == "org-b" for i in range(N))


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"$or": []}, "list of 1 to 8"),
        ({"$or": [{"a": 1}] * 9}, "at most 8"),
        ({"$or": [{}]}, "must be a non-empty filter mapping"),
        ({"$or": [{"$or": [{"a": 1}]}]}, "one level"),
        ({"$and": [{"a": 1}]}, "only operator key"),
        ({"namespace": {"empty": False}}, "exactly"),
        ({"namespace": {"empty": True, "lt": 3}}, "exactly"),
    ],
)
def test_bad_or_and_empty_filters_name_the_fix(
    filled: VectorStore, bad: dict[str, object], match: str
) -> None:
    with pytest.raises(InvalidStoreRequestError, match=match):
        filled.count(COLL, filter=bad)


def test_payload_indexes_are_added_to_an_existing_collection(store: VectorStore) -> None:
    """A collection made before the namespace indexes gets them when it is opened again;
    opening it again changes nothing (idempotent), and its points stay."""
    store.create_collection(COLL, dim=DIM, model="test-16d")
    store.upsert(COLL, _records()[:20])
    store.create_collection(COLL, dim=DIM, model="test-16d")
    store.create_collection(COLL, dim=DIM, model="test-16d")
    assert store.count(COLL) == 20


def test_edge_adds_the_namespace_indexes_to_an_older_collection(tmp_path: Path) -> None:
    import qdrant_edge as qe

    with EdgeStore(tmp_path / "q") as s:
        s.create_collection(COLL, dim=DIM, model="test-16d")
        s.upsert(COLL, _records()[:20])
        shard = s._shard(COLL)
        for f in ("namespace", "merged_from"):  # as a collection made before they existed
            shard.update(qe.UpdateOperation.delete_field_index(f))
        assert not {"namespace", "merged_from"} & set(shard.info().payload_schema)
    with EdgeStore(tmp_path / "q") as s:
        s.create_collection(COLL, dim=DIM, model="test-16d")
        s.create_collection(COLL, dim=DIM, model="test-16d")  # idempotent
        assert {"namespace", "merged_from"} <= set(s._shard(COLL).info().payload_schema)
        assert s.count(COLL) == 20


def test_exact_search_equals_default(filled: VectorStore) -> None:
    q = QUERIES[3]
    assert [h.id for h in filled.search(q, SearchQuery(COLL, 5, exact=True))] == _expected(q)


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
        filled.search(np.ones(8, dtype=np.float32), SearchQuery(COLL))
    with pytest.raises(ModelMismatchError):
        filled.upsert(COLL, [PointRecord(IDS[0], [0.1] * 8, {})])


def test_bad_requests_are_clear(filled: VectorStore) -> None:
    with pytest.raises(CollectionNotFoundError, match="'nope'"):
        filled.search(QUERIES[0], SearchQuery("nope"))
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
        assert [h.id for h in again.search(q, SearchQuery(COLL, 5))] == _expected(q)
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
        hits = s.search(vecs[123], SearchQuery("big", 3))
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
            return [
                h.id for h in s.search(QUERIES[j], SearchQuery(COLL, 5, filter={"section": "PUMP"}))
            ]

        serial = [ids_for(j) for j in range(len(QUERIES))]
        with ThreadPoolExecutor(max_workers=4) as pool:
            threaded = list(pool.map(ids_for, list(range(len(QUERIES))) * 5))
        assert threaded == serial * 5
    finally:
        s.close()


def test_open_store_picks_backend(tmp_path: Path) -> None:
    from context_core.config import get_settings
    from context_core.knowledge import open_store

    edge = open_store(get_settings(data_dir=tmp_path / "ctx"))
    try:
        assert isinstance(edge, EdgeStore)
        assert edge.root == (tmp_path / "ctx" / "qdrant").resolve()
    finally:
        edge.close()
    assert edge.hnsw_ef is None  # the engine's default unless configured
    assert edge.oversampling is None  # QUANT_OVERSAMPLING unless configured
    tuned = open_store(
        get_settings(data_dir=tmp_path / "ctx", qdrant_hnsw_ef=1024, qdrant_oversampling=6)
    )
    try:
        assert isinstance(tuned, EdgeStore) and tuned.hnsw_ef == 1024
        assert tuned.oversampling == 6.0
    finally:
        tuned.close()
    server = open_store(get_settings(data_dir=tmp_path / "ctx", qdrant_url=":memory:"))
    try:
        assert isinstance(server, QdrantServerStore)
        assert server.where == ":memory:"
    finally:
        server.close()


class _RecordingClient:
    """qdrant-client's real local mode, recording the keyword arguments of each
    ``create_collection`` request (the local mode accepts the placement and ignores it)."""

    def __init__(self) -> None:
        from qdrant_client import QdrantClient

        self._real = QdrantClient(":memory:")
        self.created: dict[str, dict[str, object]] = {}

    def create_collection(self, name: str, **kwargs: object) -> bool:
        self.created[name] = kwargs
        return bool(self._real.create_collection(name, **kwargs))

    def __getattr__(self, attr: str) -> object:
        return getattr(self._real, attr)


def test_server_collections_carry_the_cluster_placement_from_settings(tmp_path: Path) -> None:
    from context_core.config import get_settings
    from context_core.knowledge import open_store
    from context_core.knowledge.qdrant_server import collection_placement

    settings = get_settings(
        data_dir=tmp_path / "ctx",
        qdrant_url=":memory:",
        qdrant_shards=3,
        qdrant_replication=2,
        qdrant_write_consistency=2,
    )
    opened = open_store(settings)
    assert isinstance(opened, QdrantServerStore)
    want = {"shard_number": 3, "replication_factor": 2, "write_consistency_factor": 2}
    assert opened.placement == want
    opened.close()

    client = _RecordingClient()
    store = QdrantServerStore(
        client, where="recorder", shards=3, replication=2, write_consistency=2
    )
    store.create_collection("knowledge_main", dim=DIM, model="test-16d", sparse="bm25")
    sent = client.created["knowledge_main"]
    assert {k: sent[k] for k in want} == want
    store.upsert("knowledge_main", _records()[:20])  # the collection works all the same
    assert store.count("knowledge_main") == 20
    store.create_collection("knowledge_main", dim=DIM, model="test-16d")  # exists: no request
    assert list(client.created) == ["knowledge_main"]
    store.close()

    # defaults: Qdrant's own (one shard, no replica); Edge has no such parameters at all
    default = QdrantServerStore.connect(":memory:")
    assert (
        default.placement
        == collection_placement(1, 1, 1)
        == {
            "shard_number": 1,
            "replication_factor": 1,
            "write_consistency_factor": 1,
        }
    )
    default.close()
    with pytest.raises(InvalidStoreRequestError, match="exceeds the replication factor 1"):
        collection_placement(1, 1, 2)
    from context_core.errors import ConfigError

    with pytest.raises(ConfigError, match="CTX_QDRANT_WRITE_CONSISTENCY=3 exceeds"):
        get_settings(qdrant_replication=2, qdrant_write_consistency=3)
    with pytest.raises(ConfigError, match="CTX_QDRANT_SHARDS"):
        get_settings(qdrant_shards=0)
    with pytest.raises(ConfigError, match="CTX_QDRANT_HNSW_EF"):
        get_settings(qdrant_hnsw_ef=0)
    with pytest.raises(ConfigError, match="CTX_QDRANT_OVERSAMPLING"):
        get_settings(qdrant_oversampling=0.5)


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


# --- sparse vectors, retrieval modes ---------------------------------------------------------
# Synthetic BM25 documents: each point has 2-6 of VOCAB terms with random positive weights. The
# expected answers are computed with numpy using Qdrant's IDF (ln(1 + (N - n + 0.5) /
# (n + 0.5)) over the N points with a sparse vector, n of them holding the term).

VOCAB = 40
SPARSE_MODEL = "test-sparse"
HYB = "hybrid-contract"


def _sparse_docs(n: int = N, seed: int = 5) -> list[SparseVector | None]:
    rng = np.random.default_rng(seed)
    out: list[SparseVector | None] = []
    for i in range(n):
        if i % 25 == 0:
            out.append(None)  # some points have no terms at all
            continue
        terms = np.sort(rng.choice(VOCAB, size=int(rng.integers(2, 7)), replace=False))
        weights = rng.uniform(0.2, 2.0, size=len(terms))
        out.append(SparseVector(tuple(int(t) for t in terms), tuple(float(w) for w in weights)))
    return out


SPARSE = _sparse_docs()
DOC_MATRIX = np.zeros((N, VOCAB))
for _i, _sv in enumerate(SPARSE):
    if _sv is not None:
        DOC_MATRIX[_i, list(_sv.indices)] = _sv.values
_HAS = np.array([sv is not None for sv in SPARSE])
_DF = (DOC_MATRIX[_HAS] > 0).sum(axis=0)
IDF = np.log(1.0 + (_HAS.sum() - _DF + 0.5) / (_DF + 0.5))
SPARSE_QUERIES = [
    SparseVector(tuple(sorted(int(t) for t in ts)), (1.0,) * len(ts))
    for ts in (
        np.random.default_rng(100 + j).choice(VOCAB, size=3, replace=False) for j in range(20)
    )
]


def _bm25(q: SparseVector) -> np.ndarray:
    qv = np.zeros(VOCAB)
    qv[list(q.indices)] = q.values
    return np.asarray(DOC_MATRIX @ (qv * IDF))


def _hybrid_records() -> list[PointRecord]:
    return [PointRecord(IDS[i], VECS[i], _payload(i), SPARSE[i]) for i in range(N)]


@pytest.fixture
def hybrid(store: VectorStore) -> VectorStore:
    store.create_collection(HYB, dim=DIM, model="test-16d", sparse=SPARSE_MODEL)
    store.upsert(HYB, _hybrid_records())
    return store


def _rrf_expected(q: np.ndarray, sq: SparseVector, k: int, n: int) -> list[str]:
    cos, bm = VECS @ q, _bm25(sq)
    dense = np.argsort(-cos, kind="stable")[:n]
    sparse = [i for i in np.argsort(-bm, kind="stable")[:n] if bm[i] > 0]
    fused: dict[int, float] = {}
    for lst in (dense, sparse):
        for r, i in enumerate(lst, 1):
            fused[int(i)] = fused.get(int(i), 0.0) + 1.0 / (60 + r)
    order = sorted(fused, key=lambda i: (-fused[i], -cos[i]))
    return [IDS[i] for i in order[:k]]


def test_sparse_search_is_bm25_with_idf(hybrid: VectorStore) -> None:
    for sq, q in zip(SPARSE_QUERIES, QUERIES, strict=True):
        hits = hybrid.search(q, SearchQuery(HYB, 5, mode="sparse"), sparse=sq)
        bm = _bm25(sq)
        expected = [IDS[i] for i in np.argsort(-bm, kind="stable")[:5] if bm[i] > 0]
        assert [h.id for h in hits] == expected
        for r, h in enumerate(hits, 1):
            i = IDS.index(h.id)
            assert h.sparse_score == pytest.approx(bm[i], rel=1e-4)
            assert h.score == pytest.approx(float(VECS[i] @ q), abs=1e-4)  # still the cosine
            assert h.rank == r


def test_hybrid_rrf_hits_carry_cosine_sparse_score_and_rank(hybrid: VectorStore) -> None:
    for sq, q in zip(SPARSE_QUERIES, QUERIES, strict=True):
        hits = hybrid.search(q, SearchQuery(HYB, 5, mode="hybrid", fusion="rrf"), sparse=sq)
        assert [h.id for h in hits] == _rrf_expected(q, sq, 5, n=50)
        bm = _bm25(sq)
        for r, h in enumerate(hits, 1):
            i = IDS.index(h.id)
            assert h.score == pytest.approx(float(VECS[i] @ q), abs=1e-4)
            assert h.sparse_score == pytest.approx(bm[i], rel=1e-4, abs=1e-6)
            assert h.rank == r
            assert h.p_relevant is None
            assert h.payload["text"] == f"chunk {i}"


def test_hybrid_weighted_fusion(hybrid: VectorStore) -> None:
    from context_core import defaults

    w = defaults.HYBRID_DENSE_WEIGHT
    for sq, q in zip(SPARSE_QUERIES[:8], QUERIES[:8], strict=True):
        hits = hybrid.search(q, SearchQuery(HYB, 5, mode="hybrid", fusion="weighted"), sparse=sq)
        cos, bm = VECS @ q, _bm25(sq)
        cand = set(np.argsort(-cos, kind="stable")[:50].tolist())
        cand |= {i for i in np.argsort(-bm, kind="stable")[:50].tolist() if bm[i] > 0}
        top = max(bm[i] for i in cand)
        fused = {i: w * cos[i] + (1 - w) * bm[i] / top for i in cand}
        expected = sorted(cand, key=lambda i: (-fused[i], -cos[i]))[:5]
        assert [h.id for h in hits] == [IDS[i] for i in expected]


def test_hybrid_respects_filters(hybrid: VectorStore) -> None:
    sq, q = SPARSE_QUERIES[3], QUERIES[3]
    hits = hybrid.search(
        q, SearchQuery(HYB, 8, mode="hybrid", filter={"section": "FAN"}), sparse=sq
    )
    assert hits and all(h.payload["section"] == "FAN" for h in hits)
    hits = hybrid.search(
        q, SearchQuery(HYB, 8, mode="sparse", filter={"section": "FAN"}), sparse=sq
    )
    assert hits and all(h.payload["section"] == "FAN" for h in hits)


def test_sparse_vectors_round_trip(hybrid: VectorStore) -> None:
    got = {r.id: r for r in hybrid.scroll(HYB, with_vectors=True)}
    for i in (1, 2, 25, 77):
        assert got[IDS[i]].sparse is not None if SPARSE[i] is not None else True
        if SPARSE[i] is not None:
            sv = got[IDS[i]].sparse
            assert sv is not None and sv.indices == SPARSE[i].indices  # type: ignore[union-attr]
            assert sv.values == pytest.approx(SPARSE[i].values, rel=1e-6)  # type: ignore[union-attr]
        else:
            assert got[IDS[i]].sparse is None
    (rec,) = hybrid.retrieve(HYB, [IDS[1]], with_vectors=True)
    assert rec.sparse is not None and rec.sparse.indices == SPARSE[1].indices  # type: ignore[union-attr]
    info = hybrid.info(HYB)
    assert info is not None and info.sparse == SPARSE_MODEL


def test_dense_only_collection_unchanged_in_every_mode(filled: VectorStore) -> None:
    info = filled.info(COLL)
    assert info is not None and info.sparse is None
    # sparse vectors sent to a dense-only collection are ignored, not an error
    filled.upsert(COLL, [PointRecord(IDS[0], VECS[0], _payload(0), SPARSE[1])])
    for q, sq in zip(QUERIES, SPARSE_QUERIES, strict=True):
        dense = filled.search(q, SearchQuery(COLL, 5))
        assert [h.id for h in dense] == _expected(q)
        assert [h.rank for h in dense] == [1, 2, 3, 4, 5]
        for mode in ("sparse", "hybrid"):
            hits = filled.search(q, SearchQuery(COLL, 5, mode=mode), sparse=sq)
            assert [h.id for h in hits] == [h.id for h in dense]
            assert [h.score for h in hits] == pytest.approx([h.score for h in dense], abs=1e-6)
            assert all(h.sparse_score is None for h in hits)


def test_unknown_mode_is_refused(hybrid: VectorStore) -> None:
    with pytest.raises(InvalidStoreRequestError, match="retrieval mode"):
        hybrid.search(QUERIES[0], SearchQuery(HYB, mode="bm42"), sparse=SPARSE_QUERIES[0])
    with pytest.raises(InvalidStoreRequestError, match="fusion"):
        hybrid.search(
            QUERIES[0], SearchQuery(HYB, mode="hybrid", fusion="max"), sparse=SPARSE_QUERIES[0]
        )


def test_migration_adds_sparse_without_touching_dense(filled: VectorStore) -> None:
    before = {r.id: r for r in filled.scroll(COLL, with_vectors=True)}
    filled.enable_sparse(COLL, SPARSE_MODEL)
    filled.enable_sparse(COLL, SPARSE_MODEL)  # idempotent
    filled.set_sparse(COLL, [(IDS[i], sv) for i, sv in enumerate(SPARSE) if sv is not None])
    after = {r.id: r for r in filled.scroll(COLL, with_vectors=True)}
    assert after.keys() == before.keys()
    for pid, rec in after.items():
        assert np.array_equal(np.asarray(rec.vector), np.asarray(before[pid].vector))
        assert rec.payload == before[pid].payload
    assert sum(r.sparse is not None for r in after.values()) == int(_HAS.sum())
    info = filled.info(COLL)
    assert info is not None and (info.sparse, info.count) == (SPARSE_MODEL, N)
    sq, q = SPARSE_QUERIES[0], QUERIES[0]
    bm = _bm25(sq)
    hits = filled.search(q, SearchQuery(COLL, 5, mode="sparse"), sparse=sq)
    assert [h.id for h in hits] == [IDS[i] for i in np.argsort(-bm, kind="stable")[:5]]
    assert [h.id for h in filled.search(q, SearchQuery(COLL, 5))] == _expected(q)  # dense unchanged
    with pytest.raises(ModelMismatchError, match="sparse"):
        filled.enable_sparse(COLL, "another-sparse")


def test_search_batch_mixes_modes_and_collections(hybrid: VectorStore) -> None:
    hybrid.create_collection("dense-only", dim=DIM, model="test-16d")
    hybrid.upsert("dense-only", _records()[:50])
    sq, q = SPARSE_QUERIES[2], QUERIES[2]
    got = search_batch(
        hybrid,
        q,
        [
            SearchQuery(HYB, 5, mode="hybrid"),
            SearchQuery("dense-only", 3, mode="hybrid"),
            SearchQuery("absent", 3, mode="hybrid"),
        ],
        sparse=sq,
    )
    assert isinstance(got[0], list) and [h.id for h in got[0]] == _rrf_expected(q, sq, 5, 50)
    assert isinstance(got[1], list) and [h.id for h in got[1]] == [
        h.id for h in hybrid.search(q, SearchQuery("dense-only", 3))
    ]
    assert isinstance(got[2], CollectionNotFoundError)


def test_edge_reopen_keeps_sparse(tmp_path: Path) -> None:
    root = tmp_path / "qdrant"
    first = EdgeStore(root)
    first.create_collection(COLL, dim=DIM, model="test-16d")
    first.upsert(COLL, _records())
    first.enable_sparse(COLL, SPARSE_MODEL)  # an old dense-only shard gains sparse in place
    first.set_sparse(COLL, [(IDS[i], sv) for i, sv in enumerate(SPARSE) if sv is not None])
    first.close()
    again = EdgeStore(root, search_threads=1)  # load() with an explicit config keeps it too
    try:
        info = again.info(COLL)
        assert info is not None and info.sparse == SPARSE_MODEL
        sq = SPARSE_QUERIES[4]
        bm = _bm25(sq)
        hits = again.search(QUERIES[4], SearchQuery(COLL, 5, mode="sparse"), sparse=sq)
        assert [h.id for h in hits] == [IDS[i] for i in np.argsort(-bm, kind="stable")[:5]]
        again.optimize(COLL)
        hits = again.search(QUERIES[4], SearchQuery(COLL, 5, mode="sparse"), sparse=sq)
        assert [h.id for h in hits] == [IDS[i] for i in np.argsort(-bm, kind="stable")[:5]]
    finally:
        again.close()


def test_repeated_sparse_query_sees_every_write(hybrid: VectorStore) -> None:
    """The Edge backend keeps sparse candidate lists of repeated queries: a write must show."""
    sq, q = SparseVector((VOCAB + 1, VOCAB + 2), (1.0, 1.0)), QUERIES[6]
    assert hybrid.search(q, SearchQuery(HYB, 3, mode="sparse"), sparse=sq) == []
    new = point_id("new-page", 0)
    hybrid.upsert(HYB, [PointRecord(new, VECS[0], _payload(0), SparseVector((VOCAB + 1,), (1.0,)))])
    for _ in range(2):  # asked twice: the second answer may come from the cache
        hits = hybrid.search(q, SearchQuery(HYB, 3, mode="sparse"), sparse=sq)
        assert [h.id for h in hits] == [new]
        hits = hybrid.search(
            q, SearchQuery(HYB, 3, mode="hybrid", filter={"section": "PUMP"}), sparse=sq
        )
        assert new in [h.id for h in hits]
    hybrid.set_sparse(HYB, [(IDS[1], SparseVector((VOCAB + 2,), (3.0,)))])
    hits = hybrid.search(q, SearchQuery(HYB, 3, mode="sparse"), sparse=sq)
    assert [h.id for h in hits] == [IDS[1], new]
    hybrid.delete(HYB, ids=[new])
    hits = hybrid.search(q, SearchQuery(HYB, 3, mode="sparse"), sparse=sq)
    assert [h.id for h in hits] == [IDS[1]]


# --- Edge: answers kept until the next write -------------------------------------------------


def test_edge_keeps_answers_until_the_next_write_and_never_serves_a_stale_one(
    tmp_path: Path,
) -> None:
    s = EdgeStore(tmp_path / "qdrant")
    try:
        s.create_collection(COLL, dim=DIM, model="test-16d")
        assert s.search(QUERIES[0], SearchQuery(COLL, 5)) == []  # empty: answered without a search
        s.upsert(COLL, _records())
        q = QUERIES[0]
        first = s.search(q, SearchQuery(COLL, 5, filter={"section": "PUMP"}))
        again = s.search(q, SearchQuery(COLL, 5, filter={"section": "PUMP"}))
        assert [h.id for h in again] == [h.id for h in first]
        assert [h.score for h in again] == [h.score for h in first]
        assert s.answer_cache_stats(COLL)["hits"] == 1
        again[0].payload["text"] = "changed by a caller"  # a copy: the kept answer is intact
        assert s.search(q, SearchQuery(COLL, 5, filter={"section": "PUMP"}))[0].payload["text"] != (
            "changed by a caller"
        )
        # a write: the next search sees it (a new point nearest to the query)
        new = point_id("page-new", 0)
        s.upsert(COLL, [PointRecord(new, q, {**_payload(0), "section": "PUMP"})])
        after = s.search(q, SearchQuery(COLL, 5, filter={"section": "PUMP"}))
        assert after[0].id == new
        s.delete(COLL, ids=[new])
        assert s.search(q, SearchQuery(COLL, 5, filter={"section": "PUMP"}))[0].id != new
        # a time-dependent filter (a range) is searched every time
        before = s.answer_cache_stats(COLL)
        for _ in range(2):
            s.search(q, SearchQuery(COLL, 5, filter={"expires_at": {"gt": 1_100.0}}))
        assert s.answer_cache_stats(COLL)["hits"] == before["hits"]
        assert [h.id for h in s.search(q, SearchQuery(COLL, 5))] == _expected(q)
        # other search settings (beam width, oversampling) are another answer, not a hit
        before = s.answer_cache_stats(COLL)
        s.hnsw_ef, s.oversampling = 256, 3.0
        s.search(q, SearchQuery(COLL, 5))
        assert s.answer_cache_stats(COLL)["hits"] == before["hits"]
    finally:
        s.close()
