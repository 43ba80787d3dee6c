"""The vector-store seam: records, a tiny filter language, and the protocol both backends meet.

Two real backends exist (Qdrant Edge in-process, qdrant-client against a server), so the seam
is worth having; everything above it (KnowledgeMemory, the router, ingestion) speaks only the
types in this module. It imports no backend: they import it, and :mod:`.open` (``open_store``)
picks one of them. Filters are plain mappings so they can be logged, traced and compared;
each backend translates the parsed conditions into its own driver's types.

Filter mini-language (all conditions must hold)::

    {"section": "PUMP"}                      equality (str, int or bool)
    {"source": ["p1", "p2"]}                 any-of
    {"expires_at": {"lt": 1.7e9}}            range: any of lt / lte / gt / gte (numbers)
    {"namespace": {"empty": True}}           the field is absent, null or [] (Qdrant IsEmpty)
    {"$or": [{...}, {...}]}                  at least one of the sub-filters holds (each one
                                             all of its conditions; Qdrant ``should``); at
                                             most OR_MAX_CLAUSES sub-filters, no ``$or``
                                             inside them

An empty string is a value, not "empty". Knowledge memory builds its reader scope filter from
the last two (:func:`context_core.knowledge.memory.reader_filter`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from context_core.errors import InvalidStoreRequestError, ModelMismatchError

__all__ = [
    "OR_MAX_CLAUSES",
    "PAYLOAD_INDEXES",
    "RETRIEVAL_MODES",
    "SPARSE_NAME",
    "AnyOf",
    "CollectionInfo",
    "Condition",
    "Equals",
    "Filter",
    "Hit",
    "IndexStatus",
    "IsEmpty",
    "Or",
    "PointRecord",
    "Range",
    "SearchQuery",
    "SparseVector",
    "Vector",
    "VectorStore",
    "check_model",
    "parse_filter",
    "point_id",
    "search_batch",
    "time_dependent",
]

Filter = Mapping[str, Any]
# A plain list of floats or a numpy row (what Encoder.encode returns); both are accepted.
Vector = Sequence[float] | np.ndarray

# Payload fields with an index in every collection, and their kind. Filters on these stay fast
# at 100k points; filters on other fields still work but scan.
PAYLOAD_INDEXES: dict[str, str] = {
    "section": "keyword",
    "source": "keyword",
    "updated_at_ts": "float",
    "expires_at": "float",
    # the trust scope of a hot point and of an answer merged from it (reader scope filters)
    "namespace": "keyword",
    "merged_from": "keyword",
}

# HNSW and quantization settings shared by both backends (ARCHITECTURE.md).
HNSW_M = 32
HNSW_EF_CONSTRUCT = 128
FULL_SCAN_THRESHOLD = 10_000
INDEXING_THRESHOLD_KB = 10_000  # segments holding more vector data than this get HNSW
# int8 scores are coarse: with top-3 over near-tied chunks, ranking by them alone loses ~10% of
# the true top-3 (measured, benchmarks/l3_search.py). Fetch 2x candidates on the int8 copies,
# then rescore them with the original float32 vectors: recall@3 ~1.0 for a fraction of a ms.
QUANT_OVERSAMPLING = 2.0

# A fixed namespace: point ids must be identical across machines and runs, so that a re-run of
# the ingestion overwrites points instead of duplicating them.
_POINT_NAMESPACE = uuid.UUID("5b0f7c0e-3c1d-4a52-9f3e-1c2d7e6a9b40")


def point_id(source: str, chunk_index: int) -> str:
    """Deterministic UUIDv5 of ``f"{source}:{chunk_index}"``."""
    return str(uuid.uuid5(_POINT_NAMESPACE, f"{source}:{chunk_index}"))


# The named sparse vector of a collection (next to the unnamed dense one), with Qdrant's IDF
# modifier: the documents carry BM25 term weights, the engine supplies the IDF at query time.
SPARSE_NAME = "sparse"
# dense: cosine only (what every collection did before sparse vectors); sparse: BM25 only;
# hybrid: both lists fused (context_core.knowledge._qdrant.fuse).
RETRIEVAL_MODES = ("dense", "sparse", "hybrid")
FUSIONS = ("rrf", "weighted")


@dataclass(frozen=True, slots=True)
class SparseVector:
    """Lexical term weights: ``indices`` sorted, unique, in uint32 range; ``values`` > 0."""

    indices: tuple[int, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.indices) != len(self.values):
            raise InvalidStoreRequestError(
                f"a sparse vector needs as many values as indices, got {len(self.indices)} "
                f"indices and {len(self.values)} values"
            )

    def __len__(self) -> int:
        return len(self.indices)


@dataclass(frozen=True, slots=True)
class PointRecord:
    id: str
    vector: Vector | None
    payload: dict[str, Any] = field(default_factory=dict)
    sparse: SparseVector | None = None


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result; ``score`` is the dense cosine similarity in [-1, 1] in every
    retrieval mode (for a hit found by the sparse search alone it is computed from the point's
    dense vector). ``sparse_score`` is the raw BM25-style dot product (None: the sparse search
    did not run), ``rank`` the 1-based position in the returned (fused) list, ``p_relevant``
    filled by the router when a fitted relevance model exists."""

    id: str
    score: float
    payload: dict[str, Any]
    sparse_score: float | None = None
    rank: int | None = None
    p_relevant: float | None = None


@dataclass(frozen=True, slots=True)
class CollectionInfo:
    name: str
    dim: int
    model: str
    count: int
    sparse: str | None = None  # the sparse encoder the collection's sparse vectors came from


@dataclass(frozen=True, slots=True)
class IndexStatus:
    """Whether the HNSW graph covers the collection (what ``optimize`` is for)."""

    points: int
    indexed_vectors: int
    segments: int


# --- filter parsing -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Equals:
    key: str
    value: str | int | bool


@dataclass(frozen=True, slots=True)
class AnyOf:
    key: str
    values: tuple[str, ...] | tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Range:
    key: str
    lt: float | None = None
    lte: float | None = None
    gt: float | None = None
    gte: float | None = None


@dataclass(frozen=True, slots=True)
class IsEmpty:
    """The field is absent, null or an empty list (``{"field": {"empty": True}}``)."""

    key: str


@dataclass(frozen=True, slots=True)
class Or:
    """At least one clause holds; a clause holds when all its conditions do (``$or``)."""

    clauses: tuple[tuple[Equals | AnyOf | Range | IsEmpty, ...], ...]


Condition = Equals | AnyOf | Range | IsEmpty | Or
_RANGE_OPS = ("lt", "lte", "gt", "gte")
OR_KEY = "$or"
#: The most sub-filters one ``$or`` may hold: each is a clause the engine evaluates per point,
#: and a reader's scope filter needs two (curated points, the reader's scopes).
OR_MAX_CLAUSES = 8


def time_dependent(conditions: Sequence[Condition]) -> bool:
    """Whether a range (the hot points' clock) is among ``conditions``, at any depth: such a
    filter is never asked for twice, so its built form and its answers are not cached."""
    for c in conditions:
        if isinstance(c, Range):
            return True
        if isinstance(c, Or) and any(time_dependent(cl) for cl in c.clauses):
            return True
    return False


def _parse_or(spec: Any) -> Or:
    if not isinstance(spec, list | tuple) or not spec:
        raise InvalidStoreRequestError(
            f"filter {OR_KEY!r} needs a list of 1 to {OR_MAX_CLAUSES} filter mappings, got {spec!r}"
        )
    if len(spec) > OR_MAX_CLAUSES:
        raise InvalidStoreRequestError(
            f"filter {OR_KEY!r} holds {len(spec)} sub-filters; at most {OR_MAX_CLAUSES} are "
            'allowed: merge values of one field into an any-of list ({"field": [v1, v2]})'
        )
    clauses: list[tuple[Equals | AnyOf | Range | IsEmpty, ...]] = []
    for i, sub in enumerate(spec):
        if not isinstance(sub, Mapping) or not sub:
            raise InvalidStoreRequestError(
                f"filter {OR_KEY!r}[{i}] must be a non-empty filter mapping, got {sub!r}"
            )
        if OR_KEY in sub:
            raise InvalidStoreRequestError(
                f"filter {OR_KEY!r}[{i}] holds another {OR_KEY!r}; one level of {OR_KEY!r} "
                "is allowed"
            )
        parsed = parse_filter(sub)
        clauses.append(tuple(c for c in parsed if not isinstance(c, Or)))
    return Or(tuple(clauses))


def parse_filter(filt: Filter | None) -> list[Condition]:
    """Validate a filter mapping into backend-neutral conditions (empty list = no filter)."""
    if not filt:
        return []
    if not isinstance(filt, Mapping):
        raise InvalidStoreRequestError(f"a filter must be a mapping, got {type(filt).__name__}")
    out: list[Condition] = []
    for key, spec in filt.items():
        if not isinstance(key, str) or not key:
            raise InvalidStoreRequestError(f"filter keys must be field names, got {key!r}")
        if key == OR_KEY:
            out.append(_parse_or(spec))
        elif key.startswith("$"):
            raise InvalidStoreRequestError(
                f"filter key {key!r}: the only operator key is {OR_KEY!r}; field names do not "
                "start with '$'"
            )
        elif isinstance(spec, Mapping) and "empty" in spec:
            if set(spec) != {"empty"} or spec["empty"] is not True:
                raise InvalidStoreRequestError(
                    f"filter on {key!r}: the emptiness test is exactly {{'empty': True}}, got "
                    f"{dict(spec)!r}"
                )
            out.append(IsEmpty(key))
        elif isinstance(spec, Mapping):
            unknown = set(spec) - set(_RANGE_OPS)
            if unknown or not spec:
                raise InvalidStoreRequestError(
                    f"filter on {key!r}: range operators are lt/lte/gt/gte (or "
                    f"{{'empty': True}}), got {sorted(spec)}"
                )
            bounds: dict[str, float] = {}
            for op, bound in spec.items():
                if isinstance(bound, bool) or not isinstance(bound, int | float):
                    raise InvalidStoreRequestError(
                        f"filter on {key!r}: {op} needs a number, got {bound!r}"
                    )
                bounds[op] = float(bound)
            out.append(Range(key, **bounds))
        elif isinstance(spec, list | tuple | set | frozenset):
            values = list(spec)
            if not values:
                raise InvalidStoreRequestError(f"filter on {key!r}: any-of needs >= 1 value")
            all_str = all(isinstance(v, str) for v in values)
            all_int = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
            if all_str or all_int:
                out.append(AnyOf(key, tuple(values)))
            else:
                raise InvalidStoreRequestError(
                    f"filter on {key!r}: any-of values must be all str or all int, got {values!r}"
                )
        elif isinstance(spec, str | int | bool):
            out.append(Equals(key, spec))
        else:
            raise InvalidStoreRequestError(
                f"filter on {key!r}: expected a value, a list or a range mapping, got {spec!r}"
            )
    return out


def check_point_id(pid: str) -> str:
    """Qdrant accepts UUIDs (or unsigned ints); we use UUID strings everywhere."""
    try:
        return str(uuid.UUID(str(pid)))
    except ValueError as e:
        raise InvalidStoreRequestError(
            f"point id {pid!r} is not a UUID; build ids with point_id(source, chunk_index)"
        ) from e


def check_model(
    collection: str, *, recorded_model: str, recorded_dim: int, model: str, dim: int
) -> None:
    """Refuse to mix embedding models in one collection: the scores would be meaningless.

    A model name may carry the backend that ran it (``minilm+onnx-int8``): the int8 encoder's
    vectors are close to fp32's but not equal, so a collection records which one built it and
    queries from the other are refused too."""
    if recorded_model == model and recorded_dim == dim:
        return
    from context_core.knowledge.onnx_encoder import split_encoder_name

    rec_model, rec_backend = split_encoder_name(recorded_model)
    use_model, use_backend = split_encoder_name(model)
    if rec_model == use_model and recorded_dim == dim:
        raise ModelMismatchError(
            f"collection {collection!r} was built with embedding model {rec_model!r} on the "
            f"{rec_backend!r} encoder backend but is being used with the {use_backend!r} "
            f"backend; either set CTX_EMBED_BACKEND={rec_backend} to query it (or auto, "
            f"which follows the collection's backend), or drop the collection and re-ingest "
            f"with CTX_EMBED_BACKEND={use_backend}"
        )
    raise ModelMismatchError(
        f"collection {collection!r} was built with embedding model {recorded_model!r} "
        f"({recorded_dim}-d) but is being used with {model!r} ({dim}-d); either set "
        f"CTX_EMBED_MODEL={rec_model} (CTX_EMBED_BACKEND={rec_backend}) to query it, or drop "
        f"the collection and re-ingest with {model!r}"
    )


def vector_list(vector: Vector, *, collection: str, dim: int) -> list[float]:
    """A plain list of floats of the collection's dimension (numpy rows welcome)."""
    tolist = getattr(vector, "tolist", None)
    values: list[float] = tolist() if callable(tolist) else [float(x) for x in vector]
    if len(values) != dim:
        raise ModelMismatchError(
            f"collection {collection!r} holds {dim}-d vectors, got a {len(values)}-d vector; "
            "the vector was made by another embedding model"
        )
    return values


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """One search: which collection, how many hits, which points, how ranked.

    The one argument of :meth:`VectorStore.search` and of :func:`search_batch` (with the
    query's vectors next to it: a batch shares them). ``filter`` is the mini-language above;
    ``exact=True`` bypasses the HNSW graph. ``mode`` is one of :data:`RETRIEVAL_MODES`: sparse
    and hybrid need the query's sparse vector and a collection with sparse vectors, otherwise
    they run as dense. ``fusion`` (hybrid only) is one of ``FUSIONS``; ``feedback`` (hybrid
    only) is the number of first-pass hits whose vectors move the dense query
    (pseudo-relevance feedback, 0: none).
    """

    name: str
    limit: int = 3
    filter: Filter | None = None
    exact: bool = False
    mode: str = "dense"
    fusion: str = "rrf"
    feedback: int = 0


def check_mode(mode: str, fusion: str = "rrf") -> None:
    if mode not in RETRIEVAL_MODES:
        raise InvalidStoreRequestError(
            f"retrieval mode must be one of {', '.join(RETRIEVAL_MODES)}, got {mode!r}"
        )
    if fusion not in FUSIONS:
        raise InvalidStoreRequestError(
            f"hybrid fusion must be one of {', '.join(FUSIONS)}, got {fusion!r}"
        )


def search_batch(
    store: VectorStore,
    vector: Vector,
    queries: Sequence[SearchQuery],
    sparse: SparseVector | None = None,
) -> list[list[Hit] | Exception]:
    """Run several searches with one vector; each answer is its hits or the error it raised.

    A store with its own ``search_batch`` (the edge server's client: one round trip for a
    route's main + hot searches) is asked once; any other store is searched query by query
    (a dense query is not handed the sparse vector, which it would not use).
    """
    batch = getattr(store, "search_batch", None)
    if callable(batch):
        return list(batch(vector, queries, sparse=sparse))
    out: list[list[Hit] | Exception] = []
    for q in queries:
        try:
            out.append(store.search(vector, q, sparse if q.mode != "dense" else None))
        except Exception as e:  # handed back to the caller, who decides per query
            out.append(e)
    return out


@runtime_checkable
class VectorStore(Protocol):
    """What L3 needs from a vector database; scores are cosine similarity."""

    def create_collection(
        self, name: str, *, dim: int, model: str, sparse: str | None = None
    ) -> None:
        """Idempotent; an existing collection with another model/dim -> ModelMismatchError.

        ``sparse`` (the sparse encoder's name) gives a new collection a named sparse vector
        with the IDF modifier next to the dense one; an existing collection is left as it is
        (:meth:`enable_sparse` adds sparse vectors to it)."""
        ...

    def enable_sparse(self, name: str, sparse: str) -> None:
        """Give an existing collection the sparse vector (idempotent; dense data untouched)."""
        ...

    def set_sparse(self, name: str, points: Sequence[tuple[str, SparseVector]]) -> None:
        """Set the sparse vectors of existing points without touching their dense vectors."""
        ...

    def drop_collection(self, name: str) -> None:
        """Delete a collection and its points (absent: no-op)."""
        ...

    def info(self, name: str) -> CollectionInfo | None: ...

    def upsert(self, name: str, points: Sequence[PointRecord]) -> None: ...

    def delete(
        self, name: str, *, ids: Sequence[str] | None = None, filter: Filter | None = None
    ) -> None: ...

    def search(
        self, vector: Vector, query: SearchQuery, sparse: SparseVector | None = None
    ) -> list[Hit]:
        """Top ``query.limit`` of ``query.name`` by cosine similarity to ``vector`` (mode
        dense), by BM25 (sparse, with ``sparse`` the query's sparse vector) or both fused
        (hybrid); see :class:`SearchQuery`. A collection without sparse vectors answers sparse
        and hybrid as dense."""
        ...

    def scroll(
        self,
        name: str,
        *,
        filter: Filter | None = None,
        with_vectors: bool = False,
        batch: int = 256,
    ) -> Iterator[PointRecord]: ...

    def retrieve(
        self, name: str, ids: Sequence[str], *, with_vectors: bool = False
    ) -> list[PointRecord]: ...

    def count(self, name: str, *, filter: Filter | None = None) -> int: ...

    def optimize(self, name: str) -> IndexStatus:
        """Make sure the HNSW index covers the points (after a bulk load)."""
        ...

    def close(self) -> None: ...


def read_sidecar(path: Path) -> dict[str, Any] | None:
    """The JSON record of a collection's model and dimension (Edge backend)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise InvalidStoreRequestError(
            f"collection record {path} is unreadable ({e}); restore it or drop the collection"
        ) from e
    if not isinstance(data, dict) or not isinstance(data.get("model"), str):
        raise InvalidStoreRequestError(f"collection record {path} lacks 'model'/'dim'")
    return data
