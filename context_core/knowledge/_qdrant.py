"""What the two Qdrant backends share: filters, search parameters, payload schemas, records.

Qdrant Edge (``qdrant_edge``) and qdrant-client (``qdrant_client.models``) spell the same
model classes with the same keyword arguments, except for a few names (the float range is
``RangeFloat`` in Edge, ``Range`` in the client; payload schema members are ``Keyword`` and
``KEYWORD``). A :class:`QdrantModels` names the module and those differences; the functions
below build one driver's objects from it, so a filter means the same on both backends by
construction. The driver modules are imported on first use, never at import time.
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from context_core import defaults
from context_core.knowledge.store import (
    PAYLOAD_INDEXES,
    QUANT_OVERSAMPLING,
    SPARSE_NAME,
    AnyOf,
    Condition,
    Equals,
    Hit,
    IsEmpty,
    Or,
    PointRecord,
    Range,
    SparseVector,
    time_dependent,
)

__all__ = [
    "EDGE",
    "HYBRID_CANDIDATES",
    "RRF_K",
    "SERVER",
    "Leg",
    "QdrantModels",
    "retrieve",
    "to_hit",
    "to_record",
    "warn_dense_only",
]

log = logging.getLogger("context_core.knowledge")

# Hybrid search: each list (dense, sparse) contributes this many candidates per requested hit
# (at least HYBRID_MIN_CANDIDATES) before fusion; RRF's k is the usual 60.
HYBRID_CANDIDATES = 10
HYBRID_MIN_CANDIDATES = 30
RRF_K = 60

#: Built driver filters by (driver, conditions), re-used across searches (see
#: :meth:`QdrantModels.filter`); cleared when it reaches this size.
_FILTER_CACHE = 256
_FILTERS: dict[tuple[str, str], Any] = {}


@dataclass(frozen=True, slots=True)
class QdrantModels:
    """One driver's model module and the few class/member names where the two differ."""

    module_name: str
    range_class: str  # float range condition
    keyword_schema: str  # PayloadSchemaType member for "keyword" indexes
    float_schema: str  # PayloadSchemaType member for "float" indexes

    @property
    def models(self) -> Any:
        return _import(self.module_name)

    def filter(self, conditions: list[Condition], ids: Sequence[str] | None = None) -> Any:
        """The driver's ``Filter`` for parsed conditions (all must hold), restricted to the
        point ``ids`` when given; None for no condition at all. Filters without ids or a
        range (the hot points' clock) are built once and re-used: a route asks for the same
        few section filters again and again."""
        if not conditions and ids is None:
            return None
        key: tuple[str, str] | None = None
        if ids is None and not time_dependent(conditions):
            key = (self.module_name, repr(conditions))  # repr: True and 1 are not one value
            cached = _FILTERS.get(key)
            if cached is not None:
                return cached
        built = self._build_filter(conditions, ids)
        if key is not None:
            if len(_FILTERS) >= _FILTER_CACHE:
                _FILTERS.clear()
            _FILTERS[key] = built
        return built

    def _build_filter(self, conditions: list[Condition], ids: Sequence[str] | None) -> Any:
        m = self.models
        must: list[Any] = []
        if ids is not None:
            if self.module_name == "qdrant_edge":
                must.append(m.HasIdCondition(set(ids)))
            else:
                must.append(m.HasIdCondition(has_id=list(ids)))
        must.extend(self._condition(c) for c in conditions)
        return m.Filter(must=must)

    def _condition(self, c: Condition) -> Any:
        """One parsed condition as the driver's condition (an ``Or`` as a nested ``Filter``
        with ``should``: a point matches when any of its clauses' ``must`` holds)."""
        m = self.models
        if isinstance(c, Equals):
            return m.FieldCondition(key=c.key, match=m.MatchValue(value=c.value))
        if isinstance(c, AnyOf):
            return m.FieldCondition(key=c.key, match=m.MatchAny(any=_any_values(c)))
        if isinstance(c, Range):
            rng = getattr(m, self.range_class)(gte=c.gte, gt=c.gt, lte=c.lte, lt=c.lt)
            return m.FieldCondition(key=c.key, range=rng)
        if isinstance(c, IsEmpty):
            if self.module_name == "qdrant_edge":
                return m.IsEmptyCondition(key=c.key)
            return m.IsEmptyCondition(is_empty=m.PayloadField(key=c.key))
        if isinstance(c, Or):
            should = [m.Filter(must=[self._condition(x) for x in cl]) for cl in c.clauses]
            return m.Filter(should=should)
        raise TypeError(f"unknown filter condition {c!r}")  # pragma: no cover

    def search_params(
        self, exact: bool, *, hnsw_ef: int | None = None, oversampling: float | None = None
    ) -> Any:
        """Exact search, or the int8 copies with ``QUANT_OVERSAMPLING`` (or ``oversampling``)
        and float rescoring; ``hnsw_ef`` None = the engine's default beam width."""
        m = self.models
        if exact:
            return m.SearchParams(exact=True)
        quant = m.QuantizationSearchParams(
            rescore=True, oversampling=oversampling or QUANT_OVERSAMPLING
        )
        return m.SearchParams(hnsw_ef=hnsw_ef, quantization=quant)

    def sparse_vector(self, sv: SparseVector) -> Any:
        """The driver's ``SparseVector``."""
        if self.module_name == "qdrant_edge":
            return self.models.SparseVector(list(sv.indices), list(sv.values))
        return self.models.SparseVector(indices=list(sv.indices), values=list(sv.values))

    def point_vector(self, dense: list[float], sparse: SparseVector | None) -> Any:
        """A point's vector: the plain dense list, or the named form with the sparse one."""
        if sparse is None or not len(sparse):
            return dense
        return {"": dense, SPARSE_NAME: self.sparse_vector(sparse)}

    def payload_indexes(self) -> dict[str, Any]:
        """``PAYLOAD_INDEXES`` with each kind as the driver's ``PayloadSchemaType`` member."""
        schema = self.models.PayloadSchemaType
        kinds = {
            "keyword": getattr(schema, self.keyword_schema),
            "float": getattr(schema, self.float_schema),
        }
        return {field: kinds[kind] for field, kind in PAYLOAD_INDEXES.items()}


EDGE = QdrantModels("qdrant_edge", "RangeFloat", "Keyword", "Float")
SERVER = QdrantModels("qdrant_client.models", "Range", "KEYWORD", "FLOAT")


@functools.cache
def _import(name: str) -> Any:
    return importlib.import_module(name)


def _any_values(c: AnyOf) -> list[str] | list[int]:
    """MatchAny takes one type: all strings, else all integers."""
    if all(isinstance(v, str) for v in c.values):
        return [str(v) for v in c.values]
    return [int(v) for v in c.values]


def to_hit(p: Any, rank: int | None = None) -> Hit:
    """A scored point of either driver as a :class:`Hit`."""
    return Hit(id=str(p.id), score=float(p.score), payload=dict(p.payload or {}), rank=rank)


def to_record(r: Any, with_vectors: bool) -> PointRecord:
    """A stored point of either driver as a :class:`PointRecord`."""
    vec = r.vector if with_vectors else None
    sparse: SparseVector | None = None
    if isinstance(vec, dict):  # named-vector form: the dense vector is the default one ""
        sv = vec.get(SPARSE_NAME)
        if sv is not None and len(sv.indices):
            sparse = SparseVector(
                tuple(int(i) for i in sv.indices), tuple(float(v) for v in sv.values)
            )
        vec = vec.get("")
    return PointRecord(id=str(r.id), vector=vec, payload=dict(r.payload or {}), sparse=sparse)


# --- retrieval modes ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Leg:
    """One plain query of a retrieval: the dense or the sparse vector, the caller's filter,
    restricted to ``ids`` when given (rescoring known points: exact). ``query`` replaces the
    dense query vector (the feedback pass); ``vectors`` asks for the points' dense vectors."""

    kind: str  # "dense" | "sparse"
    limit: int
    ids: tuple[Any, ...] | None = None
    payload: bool = False
    query: tuple[float, ...] | None = None
    vectors: bool = False


# (id, score, payload or None, dense vector or None) per point, best first; one list per leg,
# in order. The id is the driver's own (a UUID object from Edge: turning hundreds into strings
# per query costs more than the searches), made a string only for the returned hits.
Row = tuple[Any, float, dict[str, Any] | None, Any]
Rows = list[Row]
RunLegs = Callable[[list[Leg]], list[Rows]]


def dense_of(vector: Any) -> list[float] | None:
    """The dense part of a point's vector as either driver returns it (a list, or the named
    form with the default vector under ``""``)."""
    if isinstance(vector, dict):
        vector = vector.get("")
    return None if vector is None else [float(v) for v in vector]


def retrieve(
    run: RunLegs,
    *,
    mode: str,
    limit: int,
    fusion: str,
    weight: float = defaults.HYBRID_DENSE_WEIGHT,
    query: Sequence[float] | None = None,
    feedback: int = 0,
    feedback_weight: float = defaults.HYBRID_FEEDBACK_WEIGHT,
) -> list[Hit]:
    """Sparse or hybrid retrieval over a backend's batched query runner ``run``.

    Every hit gets ``score`` = its dense cosine, ``sparse_score`` = its BM25 dot product (0.0
    when it shares no term with the query) and ``rank``. Scores a list did not return are
    fetched in one second batch restricted to those ids, so they are exact, not guessed. The
    candidate lists carry ids and scores only: payloads (hundreds of them, the costly part of
    an answer) are read for the returned hits alone, in that second batch.

    hybrid + ``rrf``: sum of 1 / (RRF_K + rank) over the two candidate lists.
    hybrid + ``weighted``: ``weight`` * cosine + (1 - ``weight``) * sparse / max sparse of
    the candidates (every candidate's both scores fetched first).

    hybrid + ``feedback`` > 0 (pseudo-relevance feedback, with ``query`` the dense query
    vector): the first pass ranks the two candidate lists as they came (a score a list did
    not return counts as that list's lowest: no completion batch), and the dense vectors of its
    best ``feedback`` points, which the two candidate lists carry (both legs ask for vectors:
    each list is searched once, the sparse posting lists walked once; the best ``feedback``
    of the union are always in it), move the query: ``q' = q/|q| + feedback_weight *
    mean(v/|v|)``. The dense leg runs again with ``q'`` and the lists are fused again, exactly
    as above, ranked by the cosine to ``q'``. ``Hit.score`` stays the cosine to ``q`` (the
    confidence thresholds are calibrated on it). Costs one engine batch more than without.
    """
    if mode == "sparse":
        rows = run([Leg("sparse", limit)])[0]
        wanted = list(_ids(rows))
        sparse = _scores(rows)
        cos: dict[Any, float] = {}
    else:
        n = max(limit * HYBRID_CANDIDATES, HYBRID_MIN_CANDIDATES)
        if feedback > 0 and query is not None:
            # the lists themselves carry the vectors: a separate top-2*feedback leg per list
            # walked the sparse posting lists a second time (~0.5 ms of a route's 2 searches)
            dense_rows, sparse_rows = run(
                [Leg("dense", n, vectors=True), Leg("sparse", n, vectors=True)]
            )
            cos, sparse = _scores(dense_rows), _scores(sparse_rows)
            first = _rough_fuse(dense_rows, sparse_rows, fusion, weight, feedback)
            vectors = {r[0]: r[3] for r in (*dense_rows, *sparse_rows) if r[3] is not None}
            moved = _feedback_query(run, query, first, vectors, feedback_weight)
        else:
            dense_rows, sparse_rows = run([Leg("dense", n), Leg("sparse", n)])
            cos, sparse = _scores(dense_rows), _scores(sparse_rows)
            moved = None
        if moved is None:
            wanted = _fuse(run, dense_rows, sparse_rows, cos, sparse, fusion, weight, limit)
        else:
            dense2 = run([Leg("dense", n, query=moved)])[0]
            cos2 = _scores(dense2)
            wanted = _fuse(
                run, dense2, sparse_rows, cos2, sparse, fusion, weight, limit, query=moved
            )
    payloads = _complete(run, wanted, cos, sparse, payloads=True)
    return [
        Hit(id=str(i), score=cos[i], payload=payloads.get(i, {}), sparse_score=sparse[i], rank=r)
        for r, i in enumerate(wanted, 1)
    ]


def _rough_fuse(
    dense_rows: Rows, sparse_rows: Rows, fusion: str, weight: float, limit: int
) -> list[Any]:
    """The best ``limit`` ids of the two lists with no completion batch: a score a list did
    not return counts as that list's lowest (an upper bound for the cosine, a near-zero BM25).
    Good enough to pick feedback points; the final ranking is :func:`_fuse`'s."""
    if fusion != "weighted":
        return _fuse(lambda _legs: [], dense_rows, sparse_rows, {}, {}, fusion, weight, limit)
    cos, sparse = _scores(dense_rows), _scores(sparse_rows)
    low_cos = min(cos.values(), default=0.0)
    low_sparse = min(sparse.values(), default=0.0)
    top = max(sparse.values(), default=0.0) or 1.0
    union = list(dict.fromkeys([*_ids(dense_rows), *_ids(sparse_rows)]))
    fused = {
        i: weight * cos.get(i, low_cos) + (1.0 - weight) * sparse.get(i, low_sparse) / top
        for i in union
    }
    return sorted(union, key=lambda i: (-fused[i], i))[:limit]


def _fuse(
    run: RunLegs,
    dense_rows: Rows,
    sparse_rows: Rows,
    cos: dict[Any, float],
    sparse: dict[Any, float],
    fusion: str,
    weight: float,
    limit: int,
    *,
    query: tuple[float, ...] | None = None,
) -> list[Any]:
    """The best ``limit`` ids of two candidate lists; ``cos``/``sparse`` gain the scores
    fetched on the way (``cos`` holds the cosine to ``query`` when given)."""
    if fusion == "weighted":
        union = list(dict.fromkeys([*_ids(dense_rows), *_ids(sparse_rows)]))
        _complete(run, union, cos, sparse, query=query)
        top = max((sparse[i] for i in union), default=0.0) or 1.0
        fused = {i: weight * cos[i] + (1.0 - weight) * sparse[i] / top for i in union}
        return sorted(union, key=lambda i: (-fused[i], -cos[i], i))[:limit]
    rrf: dict[Any, float] = {}
    for lst in (dense_rows, sparse_rows):
        for r, row in enumerate(lst, 1):
            rrf[row[0]] = rrf.get(row[0], 0.0) + 1.0 / (RRF_K + r)
    return sorted(rrf, key=lambda i: (-rrf[i], -cos.get(i, -2.0), i))[:limit]


def _feedback_query(
    run: RunLegs,
    query: Sequence[float],
    top: list[Any],
    vectors: dict[Any, Any],
    weight: float,
) -> tuple[float, ...] | None:
    """Rocchio: the query moved towards the mean of the ``top`` points' unit vectors (taken
    from ``vectors``; the few missing there fetched in one batch)."""
    missing = tuple(i for i in top if i not in vectors)
    if missing:
        rows = run([Leg("dense", len(missing), missing, vectors=True)])[0]
        vectors = {**vectors, **{r[0]: r[3] for r in rows}}
    vecs = []
    for i in top:  # the dense part as the driver gave it: numpy converts it in one go
        v = vectors.get(i)
        v = v.get("") if isinstance(v, dict) else v
        if v is not None and len(v):
            vecs.append(v)
    q = np.asarray(query, dtype=np.float64)
    qn = math.sqrt(float(q @ q))
    if not vecs or qn == 0.0:
        return None
    m = np.asarray(vecs, dtype=np.float64)
    m /= np.maximum(np.sqrt(np.einsum("ij,ij->i", m, m))[:, None], 1e-12)
    moved = q / qn + weight * m.mean(axis=0)
    norm = math.sqrt(float(moved @ moved))
    return None if norm == 0.0 else tuple((moved / norm).tolist())


def _complete(
    run: RunLegs,
    ids: list[Any],
    cos: dict[Any, float],
    sparse: dict[Any, float],
    *,
    payloads: bool = False,
    query: tuple[float, ...] | None = None,
) -> dict[Any, dict[str, Any]]:
    """Fetch the dense/sparse scores of ``ids`` that the candidate lists did not carry; with
    ``payloads``, also every one's payload (through an exact dense leg over all of them)."""
    need_cos = tuple(i for i in ids if i not in cos) if not payloads else tuple(ids)
    need_sparse = tuple(i for i in ids if i not in sparse)
    legs = [Leg("dense", len(need_cos), need_cos, payloads, query=query)] if need_cos else []
    legs += [Leg("sparse", len(need_sparse), need_sparse)] if need_sparse else []
    out: dict[Any, dict[str, Any]] = {}
    if legs:
        for leg, rows in zip(legs, run(legs), strict=True):
            (cos if leg.kind == "dense" else sparse).update(_scores(rows))
            if leg.payload:
                out = {r[0]: r[2] or {} for r in rows}
    for i in need_cos:
        cos.setdefault(i, 0.0)  # a point without a dense vector: cannot happen in upsert
    for i in need_sparse:
        sparse.setdefault(i, 0.0)  # no term in common with the query
    return out


def _scores(rows: Rows) -> dict[Any, float]:
    return {r[0]: r[1] for r in rows}


def _ids(rows: Rows) -> tuple[Any, ...]:
    return tuple(r[0] for r in rows)


_WARNED_DENSE_ONLY: set[str] = set()


def warn_dense_only(name: str) -> None:
    """Once per collection and process: a sparse/hybrid search on a dense-only collection."""
    if name not in _WARNED_DENSE_ONLY:
        _WARNED_DENSE_ONLY.add(name)
        log.warning(
            "collection %r has no sparse vectors: sparse and hybrid searches run as dense "
            "(`ctx add-sparse` adds them without re-embedding)",
            name,
        )
