"""Embedded L3 backend: Qdrant Edge (the Qdrant engine in-process), one shard per collection.

Layout under ``root`` (``settings.qdrant_dir``)::

    <root>/<collection>/                 the EdgeShard (segments/, wal/, edge_config.json)
    <root>/<collection>/ctx_collection.json   {"model": ..., "dim": ..., "distance": "cosine",
                                              "sparse": <sparse encoder name> (when present)}

The sidecar is how a collection remembers its embedding model: Qdrant itself stores only the
dimension, and two models with the same dimension would otherwise mix silently.

Sparse vectors: a collection created with ``sparse=<encoder name>`` has the named sparse vector
``"sparse"`` (IDF modifier) next to the unnamed dense one. An older, dense-only shard gains it in
place (:meth:`EdgeStore.enable_sparse`: the engine's ``create_sparse_vector`` operation, then
``update_vectors`` per point), so no point is rewritten and the dense vectors stay as they were.

Edge does not optimise in the background: points land in an appendable, unindexed segment and
only :meth:`EdgeStore.optimize` builds the HNSW graph and the int8 quantised copies. Bulk
loaders must call it (``KnowledgeMemory.upsert_chunks`` does); ``info().indexed_vectors``
tells whether it happened.

A shard directory can be opened once per process (the WAL is locked), so open shards are
shared process-wide by path and reference-counted: two ``EdgeStore`` objects on one data dir
(the router and an ingestion run in one process) use the same shard. The shard's read and
update calls are safe from several threads; opening and closing are serialised by a lock.

Cluster placement settings (``CTX_QDRANT_SHARDS``, ``CTX_QDRANT_REPLICATION``,
``CTX_QDRANT_WRITE_CONSISTENCY``) do not apply here and are ignored: each collection is one
local shard with no replicas. Only the server backend (:mod:`.server`) passes them on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from context_core.errors import (
    BackendUnavailableError,
    CollectionNotFoundError,
    ConfigError,
    InvalidStoreRequestError,
    ModelMismatchError,
)
from context_core.fsutil import atomic_write_text
from context_core.knowledge._qdrant import (
    EDGE,
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
    read_sidecar,
    time_dependent,
    vector_list,
)

__all__ = ["EdgeStore"]

log = logging.getLogger(__name__)

SIDECAR = "ctx_collection.json"
_UPSERT_BATCH = 1024


# Sparse candidate lists kept per open shard (see _OpenShard.sparse_rows).
SPARSE_CACHE_SIZE = 512
#: Whole answers kept per open shard (see :class:`_OpenShard`); a few hundred distinct step
#: queries cover a fleet's templated intents.
ANSWER_CACHE_SIZE = 512


class _OpenShard:
    """An open shard, its reference count, and the answers of recent queries.

    A route asks the same step queries again and again (an intent's query is a template of
    the device, ``"{device_prefix} vibration limits and assessment"``): a hybrid search with
    feedback is five engine batches and their fusion in Python, ~1 ms per route. The answers
    change only when the shard does, and every write to the shard goes through this process
    (the WAL lock), so they are kept until the next write: :meth:`changed` drops them and
    bumps ``generation``, and an answer computed across a write is never stored. So a cached
    answer is exactly the one a search would compute now. Kept: whole answers (``answers``,
    for searches without a time-dependent filter), sparse candidate lists (``sparse_cache``,
    the costly leg, for the others), and the point count (an empty collection, such as a hot
    collection nobody confirmed into yet, answers ``[]`` without a search).
    """

    __slots__ = (
        "answers",
        "cache_lock",
        "count",
        "generation",
        "hits",
        "misses",
        "refs",
        "shard",
        "sparse_cache",
    )

    def __init__(self, shard: Any) -> None:
        self.shard = shard
        self.refs = 0
        self.generation = 0
        self.sparse_cache: OrderedDict[Any, Any] = OrderedDict()
        self.answers: OrderedDict[Any, list[Hit]] = OrderedDict()
        self.count: int | None = None
        self.hits = 0
        self.misses = 0
        self.cache_lock = threading.Lock()

    def changed(self) -> None:
        with self.cache_lock:
            self.generation += 1
            self.sparse_cache.clear()
            self.answers.clear()
            self.count = None

    def answer(self, key: Any) -> tuple[list[Hit] | None, int]:
        """(a copy of the stored answer or None, the generation to store a fresh one under)."""
        with self.cache_lock:
            hits = self.answers.get(key)
            if hits is None:
                self.misses += 1
                return None, self.generation
            self.answers.move_to_end(key)
            self.hits += 1
        return [dataclasses.replace(h, payload=dict(h.payload)) for h in hits], self.generation

    def keep_answer(self, key: Any, hits: list[Hit], generation: int) -> None:
        with self.cache_lock:
            if generation != self.generation:
                return  # the shard changed while it was searched
            self.answers[key] = [dataclasses.replace(h, payload=dict(h.payload)) for h in hits]
            while len(self.answers) > ANSWER_CACHE_SIZE:
                self.answers.popitem(last=False)

    def cached(self, key: Any) -> tuple[Any, int]:
        """(the stored list or None, the generation to store a fresh one under)."""
        with self.cache_lock:
            rows = self.sparse_cache.get(key)
            if rows is not None:
                self.sparse_cache.move_to_end(key)
            return rows, self.generation

    def remember(self, key: Any, rows: Any, generation: int) -> None:
        with self.cache_lock:
            if generation != self.generation:
                return  # the shard changed while the list was computed
            self.sparse_cache[key] = rows
            while len(self.sparse_cache) > SPARSE_CACHE_SIZE:
                self.sparse_cache.popitem(last=False)


_OPEN: dict[Path, _OpenShard] = {}
_OPEN_LOCK = threading.RLock()


class EdgeStore:
    """:class:`~context_core.knowledge.store.VectorStore` on Qdrant Edge shards under ``root``."""

    def __init__(
        self,
        root: Path | str,
        *,
        search_threads: int | None = None,
        on_disk: bool = False,
        hnsw_ef: int | None = None,
        oversampling: float | None = None,
        hnsw_m: int = HNSW_M,
        ef_construct: int = HNSW_EF_CONSTRUCT,
    ) -> None:
        """``search_threads``: size of each shard's search pool (None = one per CPU). It only
        applies when this store is the first to open a shard in the process.

        ``on_disk``: collections this store creates keep their original vectors and payloads
        in memory-mapped files instead of RAM (the int8 copies HNSW searches stay in RAM, the
        originals are read only to rescore the few candidates). For collections of millions
        of points, where the float32 originals alone would take GBs of RAM.

        ``hnsw_ef`` / ``oversampling``: HNSW beam width and int8 candidate oversampling of
        approximate searches (None: the engine's default ef and ``QUANT_OVERSAMPLING``);
        larger collections need more of both for the same recall.

        ``hnsw_m`` / ``ef_construct``: links per node and build beam width of the HNSW graph
        of collections this store *creates* (a collection keeps the values it was built
        with). A better graph finds the same recall at a smaller search beam, for a longer
        build."""
        if not 4 <= hnsw_m <= 128:
            raise ConfigError(f"HNSW m must be between 4 and 128, got {hnsw_m}")
        if not 4 <= ef_construct <= 4096:
            raise ConfigError(f"HNSW ef_construct must be between 4 and 4096, got {ef_construct}")
        self.hnsw_m, self.ef_construct = hnsw_m, ef_construct
        self.root = Path(root).expanduser().resolve()
        self.search_threads = search_threads
        self.on_disk = on_disk
        self.hnsw_ef = hnsw_ef
        self.oversampling = oversampling
        self._held: dict[str, Path] = {}  # collection -> shard path this store holds a ref to
        self._meta: dict[str, dict[str, Any]] = {}
        self._indexed: set[str] = set()  # collections whose payload indexes were checked
        self._lock = threading.RLock()
        self._closed = False

    # --- shard handling ----------------------------------------------------------------
    def _dir(self, name: str) -> Path:
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise InvalidStoreRequestError(f"collection name {name!r} is not a plain name")
        return self.root / name

    def _meta_for(self, name: str) -> dict[str, Any] | None:
        meta = self._meta.get(name)
        if meta is None:
            meta = read_sidecar(self._dir(name) / SIDECAR)
            if meta is not None:
                self._meta[name] = meta
        return meta

    def _shard(self, name: str) -> Any:
        """The open shard of ``name``; CollectionNotFoundError if it was never created."""
        with self._lock:
            if self._closed:
                raise BackendUnavailableError(f"EdgeStore at {self.root} is closed")
            path = self._held.get(name)
            if path is not None:
                return _OPEN[path].shard
            if self._meta_for(name) is None:
                raise CollectionNotFoundError(
                    f"collection {name!r} does not exist under {self.root}; create it first "
                    "(KnowledgeMemory.ensure_collections or the knowledge refresh job)"
                )
            return self._acquire(name, create_config=None)

    def _acquire(self, name: str, create_config: Any) -> Any:
        import qdrant_edge as qe

        path = self._dir(name)
        with _OPEN_LOCK:
            entry = _OPEN.get(path)
            if entry is None:
                try:
                    if create_config is not None:
                        shard = qe.EdgeShard.create(str(path), create_config)
                    elif self.search_threads is not None:
                        # load() wants the full config to override one knob; ours is the same
                        # as the one the shard was created with, apart from the thread count.
                        dim = int(self._meta[name]["dim"])
                        shard = qe.EdgeShard.load(str(path), self._config(dim))
                    else:
                        shard = qe.EdgeShard.load(str(path))
                except Exception as e:  # qdrant_edge raises a bare Exception
                    raise BackendUnavailableError(
                        f"could not open the Qdrant Edge shard of collection {name!r} at {path}: "
                        f"{e}; another process may hold it open (one process per data dir), or "
                        "the directory is damaged (drop and re-ingest the collection)"
                    ) from e
                entry = _OPEN[path] = _OpenShard(shard)
            entry.refs += 1
        self._held[name] = path
        return entry.shard

    def _release(self, name: str) -> None:
        path = self._held.pop(name, None)
        if path is None:
            return
        with _OPEN_LOCK:
            entry = _OPEN.get(path)
            if entry is None:
                return
            entry.refs -= 1
            if entry.refs <= 0:
                del _OPEN[path]
                try:
                    entry.shard.flush()
                finally:
                    entry.shard.close()

    def _config(self, dim: int, sparse: bool = False) -> Any:
        """The shard config; ``sparse`` adds the sparse vector (creation only: a loaded shard
        keeps the vectors it has)."""
        import qdrant_edge as qe

        sparse_vectors = (
            {SPARSE_NAME: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)} if sparse else None
        )
        return qe.EdgeConfig(
            max_search_threads=self.search_threads,
            vectors=qe.EdgeVectorParams(
                size=dim, distance=qe.Distance.Cosine, on_disk=self.on_disk or None
            ),
            on_disk_payload=self.on_disk or None,
            sparse_vectors=sparse_vectors,
            hnsw_config=qe.HnswIndexConfig(
                m=self.hnsw_m,
                ef_construct=self.ef_construct,
                full_scan_threshold=FULL_SCAN_THRESHOLD,
            ),
            quantization_config=qe.ScalarQuantizationConfig(
                type=qe.ScalarType.Int8, always_ram=True
            ),
            # Explicit rather than the engine default: segments over 10 MB of vectors get an
            # HNSW graph on optimize(), smaller ones are scanned (same as full_scan_threshold).
            optimizers=qe.EdgeOptimizersConfig(indexing_threshold=INDEXING_THRESHOLD_KB),
        )

    def _entry(self, name: str) -> _OpenShard:
        self._shard(name)
        return _OPEN[self._held[name]]

    def _changed(self, name: str) -> None:
        """After a write: the shard's cached sparse candidate lists are stale."""
        path = self._held.get(name)
        entry = _OPEN.get(path) if path is not None else None
        if entry is not None:
            entry.changed()

    def _call(self, name: str, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:
            raise BackendUnavailableError(
                f"Qdrant Edge {what} on collection {name!r} ({self.root / name}) failed: {e}"
            ) from e

    # --- VectorStore ---------------------------------------------------------------------
    def create_collection(
        self, name: str, *, dim: int, model: str, sparse: str | None = None
    ) -> None:
        import qdrant_edge as qe

        if dim <= 0:
            raise InvalidStoreRequestError(f"collection {name!r}: dim must be > 0, got {dim}")
        with self._lock:
            meta = self._meta_for(name)
            if meta is not None:
                check_model(
                    name,
                    recorded_model=meta["model"],
                    recorded_dim=int(meta["dim"]),
                    model=model,
                    dim=dim,
                )
                self._index_missing(name, self._shard(name))
                return
            path = self._dir(name)
            if path.exists() and any(path.iterdir()):
                raise BackendUnavailableError(
                    f"{path} holds data but no {SIDECAR} record of its embedding model; "
                    "move it away or drop the collection"
                )
            path.mkdir(parents=True, exist_ok=True)
            shard = self._acquire(name, create_config=self._config(dim, sparse is not None))
            for field, schema in EDGE.payload_indexes().items():
                op = qe.UpdateOperation.create_field_index(field, schema)
                self._call(name, "create_field_index", shard.update, op)
            meta = {"model": model, "dim": dim, "distance": "cosine", "created_at": time.time()}
            if sparse is not None:
                meta["sparse"] = sparse
            atomic_write_text(path / SIDECAR, json.dumps(meta, indent=2))
            self._meta[name] = meta

    def _index_missing(self, name: str, shard: Any) -> None:
        """Create the ``PAYLOAD_INDEXES`` an existing collection lacks (one made by an
        earlier version): idempotent, read once per collection and store."""
        if name in self._indexed:
            return
        import qdrant_edge as qe

        have = set(self._call(name, "info", shard.info).payload_schema or {})
        for field, schema in EDGE.payload_indexes().items():
            if field not in have:
                op = qe.UpdateOperation.create_field_index(field, schema)
                self._call(name, "create_field_index", shard.update, op)
                log.info("collection %r: payload index on %r created", name, field)
        self._indexed.add(name)

    def drop_collection(self, name: str) -> None:
        with self._lock:
            self._release(name)
            self._meta.pop(name, None)
            self._indexed.discard(name)
            path = self._dir(name)
            with _OPEN_LOCK:
                if path in _OPEN:
                    raise BackendUnavailableError(
                        f"collection {name!r} is still open by another EdgeStore; close it first"
                    )
                shutil.rmtree(path, ignore_errors=True)

    def info(self, name: str) -> CollectionInfo | None:
        meta = self._meta_for(name)
        if meta is None:
            return None
        return CollectionInfo(
            name=name,
            dim=int(meta["dim"]),
            model=str(meta["model"]),
            count=self.count(name),
            sparse=meta.get("sparse"),
        )

    def _sparse_of(self, name: str) -> str | None:
        meta = self._meta_for(name)
        return None if meta is None else meta.get("sparse")

    def enable_sparse(self, name: str, sparse: str) -> None:
        import qdrant_edge as qe

        with self._lock:
            shard = self._shard(name)
            meta = dict(self._meta[name])
            recorded = meta.get("sparse")
            if recorded == sparse:
                return
            if recorded is not None:
                raise ModelMismatchError(
                    f"collection {name!r} holds sparse vectors of {recorded!r}, not {sparse!r}; "
                    "drop and re-ingest the collection to change the sparse encoder"
                )
            op = qe.UpdateOperation.create_sparse_vector(SPARSE_NAME, modifier=qe.Modifier.Idf)
            try:
                shard.update(op)
            except Exception as e:  # already there: an earlier run stopped before the record
                if "exist" not in str(e).lower():
                    raise BackendUnavailableError(
                        f"Qdrant Edge could not add sparse vectors to collection {name!r} "
                        f"({self.root / name}): {e}"
                    ) from e
            self._changed(name)
            self._call(name, "flush", shard.flush)
            meta["sparse"] = sparse
            atomic_write_text(self._dir(name) / SIDECAR, json.dumps(meta, indent=2))
            self._meta[name] = meta

    def set_sparse(self, name: str, points: Sequence[tuple[str, SparseVector]]) -> None:
        import qdrant_edge as qe

        shard = self._shard(name)
        if self._sparse_of(name) is None:
            raise InvalidStoreRequestError(
                f"collection {name!r} has no sparse vectors; enable_sparse() first"
            )
        batch: list[Any] = []
        for pid, sv in points:
            if not len(sv):
                continue
            vec = {SPARSE_NAME: EDGE.sparse_vector(sv)}
            batch.append(qe.PointVectors(check_point_id(pid), vec))
            if len(batch) >= _UPSERT_BATCH:
                self._call(
                    name, "set_sparse", shard.update, qe.UpdateOperation.update_vectors(batch)
                )
                batch = []
        if batch:
            self._call(name, "set_sparse", shard.update, qe.UpdateOperation.update_vectors(batch))
        self._changed(name)

    def upsert(self, name: str, points: Sequence[PointRecord]) -> None:
        import qdrant_edge as qe

        shard = self._shard(name)
        dim = int(self._meta[name]["dim"])
        has_sparse = self._sparse_of(name) is not None  # dense-only: sparse vectors ignored
        batch: list[Any] = []
        for p in points:
            if p.vector is None:
                raise InvalidStoreRequestError(f"point {p.id} has no vector; upsert needs one")
            vec: Any = vector_list(p.vector, collection=name, dim=dim)
            if has_sparse:
                vec = EDGE.point_vector(vec, p.sparse)
            batch.append(qe.Point(check_point_id(p.id), vec, dict(p.payload)))
            if len(batch) >= _UPSERT_BATCH:
                self._call(name, "upsert", shard.update, qe.UpdateOperation.upsert_points(batch))
                batch = []
        if batch:
            self._call(name, "upsert", shard.update, qe.UpdateOperation.upsert_points(batch))
        self._changed(name)

    def delete(
        self, name: str, *, ids: Sequence[str] | None = None, filter: Filter | None = None
    ) -> None:
        import qdrant_edge as qe

        if ids is None and not filter:
            raise InvalidStoreRequestError("delete needs ids or a filter (refusing to delete all)")
        shard = self._shard(name)
        if ids:
            op = qe.UpdateOperation.delete_points([check_point_id(i) for i in ids])
            self._call(name, "delete", shard.update, op)
        if filter:
            op = qe.UpdateOperation.delete_points_by_filter(EDGE.filter(parse_filter(filter)))
            self._call(name, "delete", shard.update, op)
        self._changed(name)

    def search(
        self, vector: Vector, query: SearchQuery, sparse: SparseVector | None = None
    ) -> list[Hit]:
        check_mode(query.mode, query.fusion)
        name = query.name
        shard = self._shard(name)
        vec = vector_list(vector, collection=name, dim=int(self._meta[name]["dim"]))
        conditions = parse_filter(query.filter)
        if query.mode != "dense" and self._sparse_of(name) is None:
            warn_dense_only(name)
            query = dataclasses.replace(query, mode="dense")
        entry = self._entry(name)
        if self._empty(name, shard, entry):
            return []
        # a time-dependent filter (hot points' expiry) would never be asked for twice
        cacheable = not time_dependent(conditions)
        if not cacheable:
            return self._search(shard, entry, vec, conditions, query, sparse, cacheable=False)
        key = (
            tuple(vec), repr(conditions), query.limit, query.exact, query.mode, query.fusion,
            query.feedback, (sparse.indices, sparse.values) if sparse is not None else None,
            self.hnsw_ef, self.oversampling,
        )  # fmt: skip
        found, gen = entry.answer(key)
        if found is not None:
            return found
        hits = self._search(shard, entry, vec, conditions, query, sparse, cacheable=True)
        entry.keep_answer(key, hits, gen)
        return hits

    def _empty(self, name: str, shard: Any, entry: _OpenShard) -> bool:
        """The collection has no point (its count, remembered until the next write)."""
        n = entry.count
        if n is None:
            import qdrant_edge as qe

            gen = entry.generation
            n = int(self._call(name, "count", shard.count, qe.CountRequest(exact=True)))
            with entry.cache_lock:
                if gen == entry.generation:
                    entry.count = n
        return n == 0

    def answer_cache_stats(self, name: str) -> dict[str, int]:
        """Searches of ``name`` answered from the cache (``hits``) or searched (``misses``)
        since it was opened in this process."""
        entry = self._entry(name)
        return {"hits": entry.hits, "misses": entry.misses, "kept": len(entry.answers)}

    def _search(
        self,
        shard: Any,
        entry: _OpenShard,
        vec: list[float],
        conditions: list[Any],
        query: SearchQuery,
        sparse: SparseVector | None,
        *,
        cacheable: bool,
    ) -> list[Hit]:
        import qdrant_edge as qe

        name, exact = query.name, query.exact
        if query.mode == "dense" or sparse is None or not len(sparse):
            req = qe.QueryRequest(
                limit=query.limit,
                query=qe.Query.Nearest(vec),
                filter=EDGE.filter(conditions),
                with_payload=True,
                params=EDGE.search_params(
                    exact, hnsw_ef=self.hnsw_ef, oversampling=self.oversampling
                ),
            )
            found = self._call(name, "search", shard.query, req)
            return [to_hit(p, r) for r, p in enumerate(found, 1)]
        query_sparse = qe.Query.Nearest(EDGE.sparse_vector(sparse), using=SPARSE_NAME)

        def run(legs: list[Leg]) -> list[Rows]:
            out: list[Rows | None] = [None] * len(legs)
            todo: list[tuple[int, Any, int]] = []  # (leg, cache key or None, generation)
            for n, leg in enumerate(legs):
                key = None
                # legs that carry vectors stay out: 30 x dim floats per entry would multiply
                # the cache's memory bound (a repeated query is answered whole, above, anyway)
                if cacheable and leg.kind == "sparse" and not leg.payload and not leg.vectors:
                    key = (
                        sparse.indices,
                        sparse.values,
                        tuple(conditions),
                        leg.limit,
                        leg.ids,
                        leg.vectors,
                    )
                    out[n], gen = entry.cached(key)
                    if out[n] is not None:
                        continue
                    todo.append((n, key, gen))
                else:
                    todo.append((n, None, 0))
            if todo:
                fresh = self._run_legs(
                    name, shard, [legs[n] for n, _, _ in todo], vec, query_sparse, conditions, exact
                )
                for (n, key, gen), rows in zip(todo, fresh, strict=True):
                    out[n] = rows
                    if key is not None:
                        entry.remember(key, rows, gen)
            return [rows or [] for rows in out]

        return retrieve(
            run,
            mode=query.mode,
            limit=query.limit,
            fusion=query.fusion,
            query=vec,
            feedback=query.feedback,
        )

    def _run_legs(
        self,
        name: str,
        shard: Any,
        legs: list[Leg],
        vec: list[float],
        query_sparse: Any,
        conditions: list[Any],
        exact: bool,
    ) -> list[Rows]:
        """The legs of a sparse/hybrid retrieval as one engine batch."""
        import qdrant_edge as qe

        reqs = []
        for leg in legs:
            rescore = leg.ids is not None
            if leg.kind == "dense":
                dense = list(leg.query) if leg.query is not None else vec
                q, params = (
                    qe.Query.Nearest(dense),
                    EDGE.search_params(
                        exact or rescore, hnsw_ef=self.hnsw_ef, oversampling=self.oversampling
                    ),
                )
            else:
                q, params = query_sparse, None
            reqs.append(
                qe.QueryRequest(
                    limit=leg.limit,
                    query=q,
                    filter=EDGE.filter(conditions, leg.ids),
                    with_payload=leg.payload,
                    with_vector=leg.vectors or None,
                    params=params,
                )
            )
        got = self._call(name, "search", shard.query_batch, qe.QueryBatchRequest(reqs))
        # read only the fields a leg asked for: each attribute is converted on access
        return [
            [
                (
                    p.id,
                    p.score,
                    p.payload if leg.payload else None,
                    p.vector if leg.vectors else None,
                )
                for p in pts
            ]
            for leg, pts in zip(legs, got, strict=True)
        ]

    def scroll(
        self,
        name: str,
        *,
        filter: Filter | None = None,
        with_vectors: bool = False,
        batch: int = 256,
    ) -> Iterator[PointRecord]:
        import qdrant_edge as qe

        shard = self._shard(name)
        edge_filter = EDGE.filter(parse_filter(filter))
        offset: Any = None
        while True:
            req = qe.ScrollRequest(
                offset=offset,
                limit=batch,
                filter=edge_filter,
                with_payload=True,
                with_vector=with_vectors,
            )
            records, offset = self._call(name, "scroll", shard.scroll, req)
            for r in records:
                yield to_record(r, with_vectors)
            if offset is None:
                return

    def retrieve(
        self, name: str, ids: Sequence[str], *, with_vectors: bool = False
    ) -> list[PointRecord]:
        shard = self._shard(name)
        wanted = [check_point_id(i) for i in ids]
        found = self._call(name, "retrieve", shard.retrieve, wanted, True, with_vectors)
        by_id = {str(r.id): to_record(r, with_vectors) for r in found}
        return [by_id[i] for i in wanted if i in by_id]

    def count(self, name: str, *, filter: Filter | None = None) -> int:
        import qdrant_edge as qe

        shard = self._shard(name)
        req = qe.CountRequest(exact=True, filter=EDGE.filter(parse_filter(filter)))
        return int(self._call(name, "count", shard.count, req))

    def optimize(self, name: str) -> IndexStatus:
        """Build HNSW + int8 copies for segments over the indexing threshold; then flush."""
        shard = self._shard(name)
        self._call(name, "optimize", shard.optimize)
        self._changed(name)  # approximate answers may differ from the kept ones now
        self._call(name, "flush", shard.flush)
        return self.index_status(name)

    def index_status(self, name: str) -> IndexStatus:
        info = self._call(name, "info", self._shard(name).info)
        return IndexStatus(
            points=int(info.points_count),
            indexed_vectors=int(info.indexed_vectors_count),
            segments=int(info.segments_count),
        )

    def flush(self) -> None:
        with self._lock:
            for name in list(self._held):
                self._call(name, "flush", _OPEN[self._held[name]].shard.flush)

    def close(self) -> None:
        with self._lock:
            for name in list(self._held):
                self._release(name)
            self._closed = True

    def __enter__(self) -> EdgeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
