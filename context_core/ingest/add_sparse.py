"""Give an existing dense-only collection its sparse (BM25) vectors, without re-embedding.

Collections built before hybrid retrieval hold one unnamed dense vector per point. Both
backends can add a named vector to a live collection (Qdrant Edge: the shard's
``create_sparse_vector`` operation; a server: ``create_vector_name``) and set one named vector
of a point without touching the others (``update_vectors``). So the migration is:

1. ``store.enable_sparse`` - the sparse vector (IDF modifier) joins the collection's config
   and the collection records the sparse encoder's name;
2. scroll every point, encode its stored ``text`` with the sparse encoder, ``set_sparse`` in
   batches (dense vectors and payloads are never rewritten);
3. ``optimize`` so the sparse index is built like the HNSW graph.

Nothing is deleted or rebuilt, so an interrupted run loses no point; it only leaves some
points without a sparse vector (the sparse search does not see them yet), and re-running
fills exactly those: points that already have one are skipped.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from context_core.errors import CollectionNotFoundError
from context_core.knowledge.sparse import SparseEncoder
from context_core.knowledge.store import SparseVector, VectorStore

__all__ = ["SparseMigration", "add_sparse_vectors"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SparseMigration:
    collection: str
    encoder: str
    points: int  # seen
    written: int  # got a sparse vector in this run
    already: int  # had one before this run
    without_text: int  # no text payload, or no term in it: left without a sparse vector

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def add_sparse_vectors(
    store: VectorStore,
    collection: str,
    encoder: SparseEncoder | None = None,
    *,
    batch: int = 512,
) -> SparseMigration:
    """Add sparse vectors to every point of ``collection`` that lacks one (idempotent)."""
    info = store.info(collection)
    if info is None:
        raise CollectionNotFoundError(f"collection {collection!r} does not exist; nothing to add")
    if encoder is None:  # a collection that has sparse vectors keeps its own tokenizer
        encoder = SparseEncoder.from_name(info.sparse) if info.sparse else SparseEncoder()
    store.enable_sparse(collection, encoder.name)
    seen = written = already = 0
    pending: list[tuple[str, str]] = []

    def flush() -> int:
        vectors = encoder.encode_documents([t for _, t in pending])
        rows: list[tuple[str, SparseVector]] = [
            (pid, sv) for (pid, _), sv in zip(pending, vectors, strict=True) if len(sv)
        ]
        store.set_sparse(collection, rows)
        pending.clear()
        return len(rows)

    for rec in store.scroll(collection, with_vectors=True, batch=batch):
        seen += 1
        if rec.sparse is not None:
            already += 1
            continue
        text = rec.payload.get("text")
        if not isinstance(text, str) or not text.strip():
            continue
        pending.append((rec.id, text))
        if len(pending) >= batch:
            written += flush()
    if pending:
        written += flush()
    without = seen - already - written
    if written:
        store.optimize(collection)
    log.info(
        "sparse vectors for %r: %d written, %d already there, %d without text/terms of %d",
        collection,
        written,
        already,
        without,
        seen,
    )
    return SparseMigration(collection, encoder.name, seen, written, already, without)
