"""Embedded L3 backend: Qdrant Edge (the Qdrant engine in-process), one shard per collection.

Layout under ``root`` (``settings.qdrant_dir``)::

    <root>/<collection>/                 the EdgeShard (segments/, wal/, edge_config.json)
    <root>/<collection>/ctx_collection.json   {"model": ..., "dim": ..., "distance": "cosine"}

The sidecar is how a collection remembers its embedding model: Qdrant itself stores only the
dimension, and two models with the same dimension would otherwise mix silently.

Edge does not optimise in the background: points land in an appendable, unindexed segment and
only :meth:`EdgeStore.optimize` builds the HNSW graph and the int8 quantised copies. Bulk
loaders must call it (``KnowledgeMemory.upsert_chunks`` does); ``info().indexed_vectors``
tells whether it happened.

A shard directory can be opened once per process (the WAL is locked), so open shards are
shared process-wide by path and reference-counted: two ``EdgeStore`` objects on one data dir
(the router and an ingestion run in one process) use the same shard. The shard's read and
update calls are safe from several threads; opening and closing are serialised by a lock.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from context_core.errors import (
    BackendUnavailableError,
    CollectionNotFoundError,
    InvalidStoreRequestError,
)
from context_core.fsutil import atomic_write_text
from context_core.knowledge._qdrant import EDGE, to_hit, to_record
from context_core.knowledge.store import (
    FULL_SCAN_THRESHOLD,
    HNSW_EF_CONSTRUCT,
    HNSW_M,
    INDEXING_THRESHOLD_KB,
    CollectionInfo,
    Filter,
    Hit,
    IndexStatus,
    PointRecord,
    Vector,
    check_model,
    check_point_id,
    parse_filter,
    read_sidecar,
    vector_list,
)

__all__ = ["EdgeStore"]

SIDECAR = "ctx_collection.json"
_UPSERT_BATCH = 1024


class _OpenShard:
    __slots__ = ("refs", "shard")

    def __init__(self, shard: Any) -> None:
        self.shard = shard
        self.refs = 0


_OPEN: dict[Path, _OpenShard] = {}
_OPEN_LOCK = threading.RLock()


class EdgeStore:
    """:class:`~context_core.knowledge.store.VectorStore` on Qdrant Edge shards under ``root``."""

    def __init__(self, root: Path | str, *, search_threads: int | None = None) -> None:
        """``search_threads``: size of each shard's search pool (None = one per CPU). It only
        applies when this store is the first to open a shard in the process."""
        self.root = Path(root).expanduser().resolve()
        self.search_threads = search_threads
        self._held: dict[str, Path] = {}  # collection -> shard path this store holds a ref to
        self._meta: dict[str, dict[str, Any]] = {}
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

    def _config(self, dim: int) -> Any:
        import qdrant_edge as qe

        return qe.EdgeConfig(
            max_search_threads=self.search_threads,
            vectors=qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine),
            hnsw_config=qe.HnswIndexConfig(
                m=HNSW_M, ef_construct=HNSW_EF_CONSTRUCT, full_scan_threshold=FULL_SCAN_THRESHOLD
            ),
            quantization_config=qe.ScalarQuantizationConfig(
                type=qe.ScalarType.Int8, always_ram=True
            ),
            # Explicit rather than the engine default: segments over 10 MB of vectors get an
            # HNSW graph on optimize(), smaller ones are scanned (same as full_scan_threshold).
            optimizers=qe.EdgeOptimizersConfig(indexing_threshold=INDEXING_THRESHOLD_KB),
        )

    def _call(self, name: str, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:
            raise BackendUnavailableError(
                f"Qdrant Edge {what} on collection {name!r} ({self.root / name}) failed: {e}"
            ) from e

    # --- VectorStore ---------------------------------------------------------------------
    def create_collection(self, name: str, *, dim: int, model: str) -> None:
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
                self._shard(name)
                return
            path = self._dir(name)
            if path.exists() and any(path.iterdir()):
                raise BackendUnavailableError(
                    f"{path} holds data but no {SIDECAR} record of its embedding model; "
                    "move it away or drop the collection"
                )
            path.mkdir(parents=True, exist_ok=True)
            shard = self._acquire(name, create_config=self._config(dim))
            for field, schema in EDGE.payload_indexes().items():
                op = qe.UpdateOperation.create_field_index(field, schema)
                self._call(name, "create_field_index", shard.update, op)
            meta = {"model": model, "dim": dim, "distance": "cosine", "created_at": time.time()}
            atomic_write_text(path / SIDECAR, json.dumps(meta, indent=2))
            self._meta[name] = meta

    def drop_collection(self, name: str) -> None:
        with self._lock:
            self._release(name)
            self._meta.pop(name, None)
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
            name=name, dim=int(meta["dim"]), model=str(meta["model"]), count=self.count(name)
        )

    def upsert(self, name: str, points: Sequence[PointRecord]) -> None:
        import qdrant_edge as qe

        shard = self._shard(name)
        dim = int(self._meta[name]["dim"])
        batch: list[Any] = []
        for p in points:
            if p.vector is None:
                raise InvalidStoreRequestError(f"point {p.id} has no vector; upsert needs one")
            vec = vector_list(p.vector, collection=name, dim=dim)
            batch.append(qe.Point(check_point_id(p.id), vec, dict(p.payload)))
            if len(batch) >= _UPSERT_BATCH:
                self._call(name, "upsert", shard.update, qe.UpdateOperation.upsert_points(batch))
                batch = []
        if batch:
            self._call(name, "upsert", shard.update, qe.UpdateOperation.upsert_points(batch))

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

    def search(
        self,
        name: str,
        vector: Vector,
        *,
        limit: int = 3,
        filter: Filter | None = None,
        exact: bool = False,
    ) -> list[Hit]:
        import qdrant_edge as qe

        shard = self._shard(name)
        vec = vector_list(vector, collection=name, dim=int(self._meta[name]["dim"]))
        req = qe.QueryRequest(
            limit=limit,
            query=qe.Query.Nearest(vec),
            filter=EDGE.filter(parse_filter(filter)),
            with_payload=True,
            params=EDGE.search_params(exact),
        )
        return [to_hit(p) for p in self._call(name, "search", shard.query, req)]

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
