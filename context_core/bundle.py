"""The values a route returns: :class:`Fragment` (one provenanced piece) and :class:`ContextBundle`.

Kept apart from :mod:`context_core.router` because they are the contract the agent, the service
and the evaluation code read, while the router is only one producer of them.

Fragment provenance: ``source`` is ``"L1:session.<field>"``, ``"L2:<redis key>"``,
``"L3:<collection>:<point id>"`` or ``"NS:<redis key>"``. L1/L2/NS fragments are exact-key
reads: relevance 1.0, confidence 1.0, label ``"exact"``. ``freshness_hours`` is the age of the
value (L2 ``stored_at``, L3 ``updated_at_ts``/``updated_at``, series: newest point); ``-1.0``
means the age is unknown.

An L3 fragment from hot knowledge (answers confirmed during sessions, not yet merged into
main) is ``"L3:hot_knowledge:<id>"``: its label is at most ``low_confidence``, its content adds
``trust = "unreviewed"``, ``written_by`` (agent id, None for a system write) and ``namespace``
(its trust scope), and its note says so (:func:`hot_note`). ``content["page"]`` of such a
fragment is the server-made ``hot-<sha>`` id, never a page id a client claimed. A merged answer
in main carries ``trust = "reviewed"`` and ``merged_from``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "LOW_CONFIDENCE_NOTE",
    "ContextBundle",
    "Fragment",
    "Layer",
    "hit_timestamp",
    "hot_note",
    "hours_since",
]

LOW_CONFIDENCE_NOTE = "for reference; real-time data wins"
Layer = Literal["L1", "L2", "L3", "NS"]


@dataclass(frozen=True)
class Fragment:
    """One piece of context with its provenance."""

    layer: Layer
    source: str
    content: Any
    relevance: float
    freshness_hours: float
    confidence: float
    label: str
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "source": self.source,
            "content": self.content,
            "relevance": self.relevance,
            "freshness_hours": self.freshness_hours,
            "confidence": self.confidence,
            "label": self.label,
            "note": self.note,
        }


@dataclass(frozen=True)
class ContextBundle:
    """What the agent gets for one step. ``context_used`` is what its output should cite."""

    session_id: str
    step: int
    intent: str
    fragments: tuple[Fragment, ...]
    degraded: bool
    timings_ms: dict[str, float]
    context_used: dict[str, Any]
    trace_id: str
    resolved_intent: str = ""

    def by_layer(self, layer: Layer) -> tuple[Fragment, ...]:
        return tuple(f for f in self.fragments if f.layer == layer)

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(f.source for f in self.fragments)

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "step": self.step,
            "intent": self.intent,
            "resolved_intent": self.resolved_intent,
            "fragments": [f.to_dict() for f in self.fragments],
            "degraded": self.degraded,
            "timings_ms": dict(self.timings_ms),
            "context_used": self.context_used,
            "trace_id": self.trace_id,
        }


def hours_since(ts: float | None, now: float) -> float:
    """Age in hours of a value stamped ``ts`` (epoch seconds); ``-1.0`` when unknown."""
    if not ts:
        return -1.0
    return round(max(0.0, now - ts) / 3600.0, 4)


def hit_timestamp(payload: Mapping[str, Any]) -> float | None:
    """When an L3 point was last updated: ``updated_at_ts``, else the ISO ``updated_at``."""
    ts = payload.get("updated_at_ts")
    if isinstance(ts, int | float) and not isinstance(ts, bool):
        return float(ts)
    raw = payload.get("updated_at")
    if isinstance(raw, str):
        try:
            parsed = dt.datetime.fromisoformat(raw)
        except ValueError:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.UTC)
        return parsed.timestamp()
    return None


def hot_note(written_by: str | None, namespace: object) -> str:
    """The note on a hot fragment: low-confidence, unreviewed, and who wrote it where."""
    who = f"agent {written_by!r}" if written_by else "the system"
    where = f" in {namespace!r}" if namespace else ""
    return f"{LOW_CONFIDENCE_NOTE}; unreviewed hot answer written by {who}{where}"
