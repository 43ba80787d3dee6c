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
from dataclasses import dataclass
from typing import Any

from context_core.knowledge.store import (
    PAYLOAD_INDEXES,
    QUANT_OVERSAMPLING,
    AnyOf,
    Condition,
    Equals,
    Hit,
    PointRecord,
    Range,
)

__all__ = ["EDGE", "SERVER", "QdrantModels", "to_hit", "to_record"]


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

    def filter(self, conditions: list[Condition]) -> Any:
        """The driver's ``Filter`` for parsed conditions (all must hold); None for none."""
        if not conditions:
            return None
        m = self.models
        must: list[Any] = []
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


def to_hit(p: Any) -> Hit:
    """A scored point of either driver as a :class:`Hit`."""
    return Hit(id=str(p.id), score=float(p.score), payload=dict(p.payload or {}))


def to_record(r: Any, with_vectors: bool) -> PointRecord:
    """A stored point of either driver as a :class:`PointRecord`."""
    vec = r.vector if with_vectors else None
    if isinstance(vec, dict):  # named-vector form: our collections use the default vector ""
        vec = vec.get("")
    return PointRecord(id=str(r.id), vector=vec, payload=dict(r.payload or {}))
