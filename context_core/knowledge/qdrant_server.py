"""L3 backend for a Qdrant server or cluster, through ``qdrant-client``.

Same collection parameters as the Edge backend (HNSW m=32/ef_construct=128, int8 scalar
quantisation kept in RAM, payload indexes), same filter language, same answers: the contract
suite runs unchanged against both. Tests use ``QdrantClient(":memory:")``, whose search is
pure Python: fine for correctness, never for benchmarks.

The collection's embedding model and dimension are recorded in the collection's own
``metadata`` (``ctx_model``, ``ctx_dim``; Qdrant >= 1.16 and the local mode keep it), so the
record travels with the collection in snapshots and needs no reserved point. ``ctx_sparse``
names the sparse encoder when the collection has the named sparse vector (IDF modifier); a
dense-only collection gains it in place (``create_vector_name``, then ``update_vectors``).

**Placement** (a cluster): the collections this store creates get ``shard_number``,
``replication_factor`` and ``write_consistency_factor`` from ``CTX_QDRANT_SHARDS``,
``CTX_QDRANT_REPLICATION`` and ``CTX_QDRANT_WRITE_CONSISTENCY`` (Qdrant's defaults, 1, unless
set). They are fixed at creation: an existing collection keeps its own (re-shard it with
Qdrant's tools, or drop it and let the refresh job rebuild it). The local ``:memory:`` mode
accepts and ignores them; so does the Edge backend, which has one local shard per collection.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from context_core import defaults
from context_core.errors import (
    BackendUnavailableError,
    CollectionNotFoundError,
    ContextError,
    InvalidStoreRequestError,
    ModelMismatchError,
)
from context_core.knowledge._qdrant import (
    SERVER,
    Leg,
    Rows,
    retrieve,
    to_hit,
    to_record,
    warn_dense_only,
)
from context_core.knowledge.store import (
    FULL_SCAN_THRESHOLD,
    HNSW_EF_CONSTRUCT,
    HNSW_M,
    INDEXING_THRESHOLD_KB,
    SPARSE_NAME,
    CollectionInfo,
    Filter,
    Hit,
    IndexStatus,
    PointRecord,
    SearchQuery,
    SparseVector,
    Vector,
    check_mode,
    check_model,
    check_point_id,
    parse_filter,
    vector_list,
)

__all__ = ["QdrantServerStore", "collection_placement"]

log = logging.getLogger(__name__)

T = TypeVar("T")
_UPSERT_BATCH = 512


def collection_placement(shards: int, replication: int, write_consistency: int) -> dict[str, int]:
    """The ``create_collection`` arguments that place a collection on a cluster's peers."""
    if shards < 1 or replication < 1 or write_consistency < 1:
        raise InvalidStoreRequestError(
            f"shards ({shards}), replication ({replication}) and write consistency "
            f"({write_consistency}) must each be at least 1"
        )
    if write_consistency > replication:
        raise InvalidStoreRequestError(
            f"write consistency {write_consistency} exceeds the replication factor {replication}"
        )
    return {
        "shard_number": shards,
        "replication_factor": replication,
        "write_consistency_factor": write_consistency,
    }


class QdrantServerStore:
    """:class:`~context_core.knowledge.store.VectorStore` over a ``QdrantClient``."""

    def __init__(
        self,
        client: Any,
        *,
        where: str | None = None,
        shards: int = defaults.QDRANT_SHARDS,
        replication: int = defaults.QDRANT_REPLICATION,
        write_consistency: int = defaults.QDRANT_WRITE_CONSISTENCY,
    ) -> None:
        self._client = client
        self.where = where or "a Qdrant client"
        self.placement = collection_placement(shards, replication, write_consistency)
        self._meta: dict[str, tuple[str, int]] = {}
        self._sparse: dict[str, str | None] = {}
        self._indexed: set[str] = set()  # collections whose payload indexes were checked

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        api_key: str | None = None,
        timeout: int = 10,
        check_compatibility: bool = True,
        shards: int = defaults.QDRANT_SHARDS,
        replication: int = defaults.QDRANT_REPLICATION,
        write_consistency: int = defaults.QDRANT_WRITE_CONSISTENCY,
    ) -> QdrantServerStore:
        """``url`` of a server/cluster, or ":memory:" for qdrant-client's local mode.
        ``shards`` / ``replication`` / ``write_consistency``: the placement of the
        collections this store creates (see the module docstring)."""
        from qdrant_client import QdrantClient

        placement = {
            "shards": shards,
            "replication": replication,
            "write_consistency": write_consistency,
        }
        if url == ":memory:":
            return cls(QdrantClient(":memory:"), where=":memory:", **placement)
        client = QdrantClient(
            url=url, api_key=api_key, timeout=timeout, check_compatibility=check_compatibility
        )
        return cls(client, where=url, **placement)

    def _call(self, name: str, what: str, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        try:
            return fn(*args, **kw)
        except ContextError:
            raise
        except Exception as e:  # http/grpc/transport errors and the local mode's ValueErrors
            if "not found" in str(e).lower() and "collection" in str(e).lower():
                raise CollectionNotFoundError(
                    f"collection {name!r} does not exist on {self.where}; create it first "
                    "(KnowledgeMemory.ensure_collections or the knowledge refresh job)"
                ) from e
            raise BackendUnavailableError(
                f"Qdrant {what} on collection {name!r} at {self.where} failed: {e}; check that "
                "the server is up and CTX_QDRANT_URL / CTX_QDRANT_API_KEY are right"
            ) from e

    def _recorded(self, name: str) -> tuple[str, int] | None:
        """(model, dim) from the collection metadata, or None when the collection is absent."""
        rec = self._meta.get(name)
        if rec is not None:
            return rec
        if not self._call(name, "collection_exists", self._client.collection_exists, name):
            return None
        info = self._call(name, "get_collection", self._client.get_collection, name)
        meta = info.config.metadata or {}
        vectors = info.config.params.vectors
        size = int(getattr(vectors, "size", 0) or meta.get("ctx_dim", 0))
        model = meta.get("ctx_model")
        if not isinstance(model, str):
            raise InvalidStoreRequestError(
                f"collection {name!r} at {self.where} has no ctx_model metadata: it was not "
                "created by this platform; drop it or choose another collection name"
            )
        rec = (model, size)
        self._meta[name] = rec
        sparse = meta.get("ctx_sparse")
        has = SPARSE_NAME in (info.config.params.sparse_vectors or {})
        self._sparse[name] = str(sparse) if has and isinstance(sparse, str) else None
        return rec

    def _sparse_of(self, name: str) -> str | None:
        self._dim(name)
        return self._sparse.get(name)

    def _dim(self, name: str) -> int:
        rec = self._recorded(name)
        if rec is None:
            raise CollectionNotFoundError(
                f"collection {name!r} does not exist on {self.where}; create it first "
                "(KnowledgeMemory.ensure_collections or the knowledge refresh job)"
            )
        return rec[1]

    # --- VectorStore ---------------------------------------------------------------------
    def create_collection(
        self, name: str, *, dim: int, model: str, sparse: str | None = None
    ) -> None:
        from qdrant_client import models

        if dim <= 0:
            raise InvalidStoreRequestError(f"collection {name!r}: dim must be > 0, got {dim}")
        rec = self._recorded(name)
        if rec is not None:
            check_model(name, recorded_model=rec[0], recorded_dim=rec[1], model=model, dim=dim)
            self._index_missing(name)
            return
        self._call(
            name,
            "create_collection",
            self._client.create_collection,
            name,
            vectors_config=models.VectorParams(size=dim, distance=models.Distance.COSINE),
            hnsw_config=models.HnswConfigDiff(
                m=HNSW_M, ef_construct=HNSW_EF_CONSTRUCT, full_scan_threshold=FULL_SCAN_THRESHOLD
            ),
            optimizers_config=models.OptimizersConfigDiff(indexing_threshold=INDEXING_THRESHOLD_KB),
            quantization_config=models.ScalarQuantization(
                scalar=models.ScalarQuantizationConfig(type=models.ScalarType.INT8, always_ram=True)
            ),
            sparse_vectors_config=(
                {SPARSE_NAME: models.SparseVectorParams(modifier=models.Modifier.IDF)}
                if sparse is not None
                else None
            ),
            metadata={
                "ctx_model": model,
                "ctx_dim": dim,
                "distance": "cosine",
                **({"ctx_sparse": sparse} if sparse is not None else {}),
            },
            **self.placement,
        )
        self._create_indexes(name, SERVER.payload_indexes())
        self._indexed.add(name)
        self._meta[name] = (model, dim)
        self._sparse[name] = sparse

    def _create_indexes(self, name: str, indexes: dict[str, Any]) -> None:
        with warnings.catch_warnings():
            # The local (":memory:") mode warns that it ignores payload indexes; a server uses them.
            warnings.filterwarnings("ignore", message="Payload indexes have no effect")
            for field, schema in indexes.items():
                self._call(
                    name,
                    "create_payload_index",
                    self._client.create_payload_index,
                    name,
                    field,
                    field_schema=schema,
                )

    def _index_missing(self, name: str) -> None:
        """Create the ``PAYLOAD_INDEXES`` an existing collection lacks (one made by an
        earlier version): idempotent, read once per collection and store."""
        if name in self._indexed:
            return
        info = self._call(name, "get_collection", self._client.get_collection, name)
        have = set(info.payload_schema or {})
        missing = {f: s for f, s in SERVER.payload_indexes().items() if f not in have}
        if missing:
            self._create_indexes(name, missing)
            log.info("collection %r: payload indexes on %s created", name, sorted(missing))
        self._indexed.add(name)

    def enable_sparse(self, name: str, sparse: str) -> None:
        from qdrant_client import models

        self._meta.pop(name, None)  # re-read: another process may have done it
        recorded = self._sparse_of(name)
        if recorded == sparse:
            return
        if recorded is not None:
            raise ModelMismatchError(
                f"collection {name!r} holds sparse vectors of {recorded!r}, not {sparse!r}; "
                "drop and re-ingest the collection to change the sparse encoder"
            )
        info = self._call(name, "get_collection", self._client.get_collection, name)
        if SPARSE_NAME not in (info.config.params.sparse_vectors or {}):
            config = models.SparseVectorNameConfig(
                sparse=models.SparseVectorConfig(modifier=models.Modifier.IDF)
            )
            self._call(
                name,
                "create_vector_name",
                self._client.create_vector_name,
                name,
                SPARSE_NAME,
                config,
            )
        meta = dict(info.config.metadata or {})
        meta["ctx_sparse"] = sparse
        self._call(name, "update_collection", self._client.update_collection, name, metadata=meta)
        self._sparse[name] = sparse

    def set_sparse(self, name: str, points: Sequence[tuple[str, SparseVector]]) -> None:
        from qdrant_client import models

        if self._sparse_of(name) is None:
            raise InvalidStoreRequestError(
                f"collection {name!r} has no sparse vectors; enable_sparse() first"
            )
        batch: list[Any] = []
        for pid, sv in points:
            if not len(sv):
                continue
            vec = {SPARSE_NAME: SERVER.sparse_vector(sv)}
            batch.append(models.PointVectors(id=check_point_id(pid), vector=vec))
            if len(batch) >= _UPSERT_BATCH:
                self._call(name, "update_vectors", self._client.update_vectors, name, batch)
                batch = []
        if batch:
            self._call(name, "update_vectors", self._client.update_vectors, name, batch)

    def drop_collection(self, name: str) -> None:
        self._meta.pop(name, None)
        self._sparse.pop(name, None)
        self._indexed.discard(name)
        if self._call(name, "collection_exists", self._client.collection_exists, name):
            self._call(name, "delete_collection", self._client.delete_collection, name)

    def info(self, name: str) -> CollectionInfo | None:
        rec = self._recorded(name)
        if rec is None:
            return None
        return CollectionInfo(
            name=name,
            dim=rec[1],
            model=rec[0],
            count=self.count(name),
            sparse=self._sparse.get(name),
        )

    def upsert(self, name: str, points: Sequence[PointRecord]) -> None:
        from qdrant_client import models

        dim = self._dim(name)
        has_sparse = self._sparse.get(name) is not None  # dense-only: sparse vectors ignored
        batch: list[Any] = []
        for p in points:
            if p.vector is None:
                raise InvalidStoreRequestError(f"point {p.id} has no vector; upsert needs one")
            vec: Any = vector_list(p.vector, collection=name, dim=dim)
            if has_sparse:
                vec = SERVER.point_vector(vec, p.sparse)
            batch.append(
                models.PointStruct(id=check_point_id(p.id), vector=vec, payload=dict(p.payload))
            )
            if len(batch) >= _UPSERT_BATCH:
                self._call(name, "upsert", self._client.upsert, name, points=batch, wait=True)
                batch = []
        if batch:
            self._call(name, "upsert", self._client.upsert, name, points=batch, wait=True)

    def delete(
        self, name: str, *, ids: Sequence[str] | None = None, filter: Filter | None = None
    ) -> None:
        from qdrant_client import models

        if ids is None and not filter:
            raise InvalidStoreRequestError("delete needs ids or a filter (refusing to delete all)")
        self._dim(name)
        if ids:
            selector: Any = models.PointIdsList(points=[check_point_id(i) for i in ids])
            self._call(
                name, "delete", self._client.delete, name, points_selector=selector, wait=True
            )
        if filter:
            selector = models.FilterSelector(filter=SERVER.filter(parse_filter(filter)))
            self._call(
                name, "delete", self._client.delete, name, points_selector=selector, wait=True
            )

    def search(
        self, vector: Vector, query: SearchQuery, sparse: SparseVector | None = None
    ) -> list[Hit]:
        check_mode(query.mode, query.fusion)
        name = query.name
        vec = vector_list(vector, collection=name, dim=self._dim(name))
        if query.mode != "dense" and self._sparse.get(name) is None:
            warn_dense_only(name)
            query = dataclasses.replace(query, mode="dense")
        if query.mode != "dense" and sparse is not None and len(sparse):
            return self._retrieve(query, vec, sparse, parse_filter(query.filter))
        with warnings.catch_warnings():
            # The local mode is always exact and warns that search_params do nothing there.
            warnings.filterwarnings("ignore", message="Local mode performs exact")
            resp = self._call(
                name,
                "search",
                self._client.query_points,
                name,
                query=vec,
                query_filter=SERVER.filter(parse_filter(query.filter)),
                limit=query.limit,
                with_payload=True,
                search_params=SERVER.search_params(query.exact),
            )
        return [to_hit(p, r) for r, p in enumerate(resp.points, 1)]

    def _retrieve(
        self, query: SearchQuery, vec: list[float], sparse: SparseVector, conditions: list[Any]
    ) -> list[Hit]:
        from qdrant_client import models

        name, exact = query.name, query.exact
        query_sparse = SERVER.sparse_vector(sparse)

        def run(legs: list[Leg]) -> list[Rows]:
            reqs = []
            for leg in legs:
                rescore = leg.ids is not None
                dense = leg.kind == "dense"
                q_dense = list(leg.query) if leg.query is not None else vec
                reqs.append(
                    models.QueryRequest(
                        query=q_dense if dense else query_sparse,
                        using=None if dense else SPARSE_NAME,
                        filter=SERVER.filter(conditions, leg.ids),
                        limit=leg.limit,
                        with_payload=leg.payload,
                        with_vector=leg.vectors,
                        params=SERVER.search_params(exact or rescore) if dense else None,
                    )
                )
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Local mode performs exact")
                got = self._call(
                    name, "search", self._client.query_batch_points, name, requests=reqs
                )
            return [
                [
                    (str(p.id), float(p.score), p.payload, p.vector if leg.vectors else None)
                    for p in r.points
                ]
                for leg, r in zip(legs, got, strict=True)
            ]

        return retrieve(
            run,
            mode=query.mode,
            limit=query.limit,
            fusion=query.fusion,
            query=vec,
            feedback=query.feedback,
        )

    def scroll(
        self,
        name: str,
        *,
        filter: Filter | None = None,
        with_vectors: bool = False,
        batch: int = 256,
    ) -> Iterator[PointRecord]:
        self._dim(name)
        qfilter = SERVER.filter(parse_filter(filter))
        offset: Any = None
        while True:
            records, offset = self._call(
                name,
                "scroll",
                self._client.scroll,
                name,
                scroll_filter=qfilter,
                limit=batch,
                offset=offset,
                with_payload=True,
                with_vectors=with_vectors,
            )
            for r in records:
                yield to_record(r, with_vectors)
            if offset is None:
                return

    def retrieve(
        self, name: str, ids: Sequence[str], *, with_vectors: bool = False
    ) -> list[PointRecord]:
        self._dim(name)
        wanted = [check_point_id(i) for i in ids]
        found = self._call(
            name,
            "retrieve",
            self._client.retrieve,
            name,
            ids=wanted,
            with_payload=True,
            with_vectors=with_vectors,
        )
        by_id = {str(r.id): to_record(r, with_vectors) for r in found}
        return [by_id[i] for i in wanted if i in by_id]

    def count(self, name: str, *, filter: Filter | None = None) -> int:
        self._dim(name)
        res = self._call(
            name,
            "count",
            self._client.count,
            name,
            count_filter=SERVER.filter(parse_filter(filter)),
            exact=True,
        )
        return int(res.count)

    def optimize(self, name: str) -> IndexStatus:
        """A server optimises in the background; this only reports how far it got."""
        self._dim(name)
        info = self._call(name, "get_collection", self._client.get_collection, name)
        return IndexStatus(
            points=int(info.points_count or 0),
            indexed_vectors=int(info.indexed_vectors_count or 0),
            segments=int(info.segments_count or 0),
        )

    def close(self) -> None:
        self._call("-", "close", self._client.close)
