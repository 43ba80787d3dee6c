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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from context_core.knowledge.store import (
    PAYLOAD_INDEXES,
    QUANT_OVERSAMPLING,
    SPARSE_NAME,
    AnyOf,
    Condition,
    Equals,
    Hit,
    PointRecord,
    Range,
    SparseVector,
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
        point ``ids`` when given; None for no condition at all."""
        if not conditions and ids is None:
            return None
        m = self.models
        must: list[Any] = []
        if ids is not None:
            if self.module_name == "qdrant_edge":
                must.append(m.HasIdCondition(set(ids)))
            else:
                must.append(m.HasIdCondition(has_id=list(ids)))
        for c in conditions:
            if isinstance(c, Equals):
                must.append(m.FieldCondition(key=c.key, match=m.MatchValue(value=c.value)))
            elif isinstance(c, AnyOf):
                must.append(m.FieldCondition(key=c.key, match=m.MatchAny(any=_any_values(c))))
            elif isinstance(c, Range):
                rng = getattr(m, self.range_class)(gte=c.gte, gt=c.gt, lte=c.lte, lt=c.lt)
                must.append(m.FieldCondition(key=c.key, range=rng))
        return m.Filter(must=must)

    def search_params(self, exact: bool) -> Any:
        """Exact search, or the int8 copies with ``QUANT_OVERSAMPLING`` and float rescoring."""
        m = self.models
        if exact:
            return m.SearchParams(exact=True)
        return m.SearchParams(
            quantization=m.QuantizationSearchParams(rescore=True, oversampling=QUANT_OVERSAMPLING)
        )

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
    restricted to ``ids`` when given (rescoring known points: exact)."""

    kind: str  # "dense" | "sparse"
    limit: int
    ids: tuple[Any, ...] | None = None
    payload: bool = False


# (id, score, payload or None) per point, best first; one list per leg, in order. The id is
# the driver's own (a UUID object from Edge: turning hundreds into strings per query costs more
# than the searches), made a string only for the returned hits.
Rows = list[tuple[Any, float, dict[str, Any] | None]]
RunLegs = Callable[[list[Leg]], list[Rows]]


def retrieve(run: RunLegs, *, mode: str, limit: int, fusion: str, weight: float) -> list[Hit]:
    """Sparse or hybrid retrieval over a backend's batched query runner ``run``.

    Every hit gets ``score`` = its dense cosine, ``sparse_score`` = its BM25 dot product (0.0
    when it shares no term with the query) and ``rank``. Scores a list did not return are
    fetched in one second batch restricted to those ids, so they are exact, not guessed. The
    candidate lists carry ids and scores only: payloads (hundreds of them, the costly part of
    an answer) are read for the returned hits alone, in that second batch.

    hybrid + ``rrf``: sum of 1 / (RRF_K + rank) over the two candidate lists.
    hybrid + ``weighted``: ``weight`` * cosine + (1 - ``weight``) * sparse / max sparse of
    the candidates (every candidate's both scores fetched first).
    """
    if mode == "sparse":
        rows = run([Leg("sparse", limit)])[0]
        wanted = list(_ids(rows))
        sparse = _scores(rows)
        cos: dict[Any, float] = {}
    else:
        n = max(limit * HYBRID_CANDIDATES, HYBRID_MIN_CANDIDATES)
        dense_rows, sparse_rows = run([Leg("dense", n), Leg("sparse", n)])
        cos, sparse = _scores(dense_rows), _scores(sparse_rows)
        if fusion == "weighted":
            union = list(dict.fromkeys([*_ids(dense_rows), *_ids(sparse_rows)]))
            _complete(run, union, cos, sparse)
            top = max((sparse[i] for i in union), default=0.0) or 1.0
            fused = {i: weight * cos[i] + (1.0 - weight) * sparse[i] / top for i in union}
            wanted = sorted(union, key=lambda i: (-fused[i], -cos[i], i))[:limit]
        else:
            rrf: dict[Any, float] = {}
            for lst in (dense_rows, sparse_rows):
                for r, (i, _, _) in enumerate(lst, 1):
                    rrf[i] = rrf.get(i, 0.0) + 1.0 / (RRF_K + r)
            wanted = sorted(rrf, key=lambda i: (-rrf[i], -cos.get(i, -2.0), i))[:limit]
    payloads = _complete(run, wanted, cos, sparse, payloads=True)
    return [
        Hit(id=str(i), score=cos[i], payload=payloads.get(i, {}), sparse_score=sparse[i], rank=r)
        for r, i in enumerate(wanted, 1)
    ]


def _complete(
    run: RunLegs,
    ids: list[Any],
    cos: dict[Any, float],
    sparse: dict[Any, float],
    *,
    payloads: bool = False,
) -> dict[Any, dict[str, Any]]:
    """Fetch the dense/sparse scores of ``ids`` that the candidate lists did not carry; with
    ``payloads``, also every one's payload (through an exact dense leg over all of them)."""
    need_cos = tuple(i for i in ids if i not in cos) if not payloads else tuple(ids)
    need_sparse = tuple(i for i in ids if i not in sparse)
    legs = [Leg("dense", len(need_cos), need_cos, payloads)] if need_cos else []
    legs += [Leg("sparse", len(need_sparse), need_sparse)] if need_sparse else []
    out: dict[Any, dict[str, Any]] = {}
    if legs:
        for leg, rows in zip(legs, run(legs), strict=True):
            (cos if leg.kind == "dense" else sparse).update(_scores(rows))
            if leg.payload:
                out = {i: p or {} for i, _, p in rows}
    for i in need_cos:
        cos.setdefault(i, 0.0)  # a point without a dense vector: cannot happen in upsert
    for i in need_sparse:
        sparse.setdefault(i, 0.0)  # no term in common with the query
    return out


def _scores(rows: Rows) -> dict[Any, float]:
    return {i: s for i, s, _ in rows}


def _ids(rows: Rows) -> tuple[Any, ...]:
    return tuple(i for i, _, _ in rows)


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
