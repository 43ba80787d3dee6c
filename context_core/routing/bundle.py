"""The values a route returns: :class:`Fragment` (one provenanced piece) and :class:`ContextBundle`.

Kept apart from :mod:`context_core.routing.router` because they are the contract the agent, the
service
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

A preference fragment (L2 key kind ``pref``) is ``"L2:pref:{<user id>}:<type>"`` with content
``{value, confidence, last_updated}``, relevance and confidence = the preference's confidence,
label ``"preference"``.

**Bundle budget** (:func:`apply_budget`): a bundle holds at most ``max_fragments`` fragments
(``CTX_BUNDLE_MAX_FRAGMENTS``, default 3; ``IntentSpec.max_fragments`` overrides it per
intent). Every fragment the route found gets a priority; the best ``max_fragments`` are
delivered and the others are listed in ``context_used["by_reference"]`` as
``{layer, source, relevance, label}``, never with their content (the agent may route again
with a larger budget, or read the key, if it needs one). Priority, best first
(:data:`PRIORITY`), ties broken by relevance (higher first) and then by the order the route
read them (the intent's order):

1. required L2 keys: the step cannot be done right without them;
2. the task contract: the user's goal and constraints as agreed;
3. confident L3 hits, by score;
4. shared-namespace entries, in the intent's order;
5. optional L2 keys (a cached API response, a series, preferences by their confidence);
6. low-confidence L3 hits ("for reference"; hot answers are here), by score;
7. L1 session fields: last, because the agent already holds its own session state (it sends
   it with every request), so an L1 field listed by reference costs it nothing.

Required keys are never pushed out: when an intent requires more keys than its budget, all of
them are delivered and nothing else (:class:`~context_core.routing.intents.IntentSpec` refuses a
``max_fragments`` below its required key count). Delivered fragments keep the route's order
(L1, L2, NS, L3), so the bundle reads the same whatever was cut.

**Fallback** (the design's ``on_fallback``): :func:`teaching_cue` spots a step query that refers
to something the user taught earlier ("as I told you", "remember what I said", "上次",
"我教过你" ...). When such a query finds no usable main-collection L3 hit (none at or above
skip) in a search that ran without error, the route sets ``context_used["fallback"] =
{"triggered": true, "reason": ..., "confirm_at": "/v1/sessions/<sid>/confirmations"}``: the
agent should answer, ask the user to confirm, and post the confirmed answer there (it lands in
hot knowledge). When not triggered, ``context_used`` has **no** ``fallback`` key; the trace
record's ``fallback`` is then null.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from context_core.routing.bundle_delta import BundleDelta, delta_wire
from context_core.session.wire import BundleWire, FragmentWire, encode_json
from context_core.traces import ReferenceTrace

if TYPE_CHECKING:
    from context_core.routing.prompts import RenderedPrompt

__all__ = [
    "LOW_CONFIDENCE_NOTE",
    "PRIORITY",
    "ContextBundle",
    "Fragment",
    "Layer",
    "Tier",
    "apply_budget",
    "confirm_path",
    "hit_timestamp",
    "hot_note",
    "hours_since",
    "reference_entry",
    "teaching_cue",
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
    # L3 only: the hit's calibrated probability (None without a relevance model) and which
    # signal its label came from ("cosine" or "p_relevant").
    p_relevant: float | None = None
    confidence_signal: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The wire form: the fields of :class:`~context_core.session.wire.FragmentWire`."""
        return {name: getattr(self, name) for name in _FRAGMENT_FIELDS}


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
    # Optional L2 keys the route looked for and did not find (a required miss raises).
    # Not on the wire: for service metrics (how many keys the step went without).
    l2_missing: tuple[str, ...] = ()
    # Set when the route was asked for a delta (context_core.routing.delta): the bundle's id, its
    # base and which fragments the base held unchanged. ``fragments`` stay the full bundle.
    delta: BundleDelta | None = None
    # The bundle rendered into its intent's template (context_core.routing.prompts), if any.
    prompt: RenderedPrompt | None = None

    def by_layer(self, layer: Layer) -> tuple[Fragment, ...]:
        return tuple(f for f in self.fragments if f.layer == layer)

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(f.source for f in self.fragments)

    def to_dict(self) -> dict[str, Any]:
        """The wire form: the fields of :class:`~context_core.session.wire.BundleWire`, which the
        service publishes as ``POST /v1/context``'s response."""
        out = {name: getattr(self, name) for name in _BUNDLE_FIELDS}
        out["fragments"] = [f.to_dict() for f in self.fragments]
        out["prompt"] = None if self.prompt is None else self.prompt.to_dict()
        return out

    def to_json(self) -> bytes:
        """:meth:`to_dict` as compact UTF-8 JSON
        (:func:`~context_core.session.wire.encode_json`)."""
        return encode_json(self.to_dict())

    def to_delta_dict(self) -> dict[str, Any]:
        """The delta wire form (:class:`~context_core.session.wire.BundleDeltaWire`) of a bundle
        routed with ``delta=True``; :meth:`to_dict` stays the full bundle."""
        if self.delta is None:
            raise ValueError("to_delta_dict: the bundle was routed without delta=True")
        full = self.to_dict()
        return delta_wire(full, full["fragments"], self.delta)


_FRAGMENT_FIELDS = tuple(FragmentWire.model_fields)
_BUNDLE_FIELDS = tuple(BundleWire.model_fields)


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


# --- bundle budget ----------------------------------------------------------------------------

Tier = Literal["required", "contract", "confident_l3", "namespace", "optional_l2", "low_l3", "l1"]
#: Budget priority, best first (see the module docstring for why this order).
PRIORITY: tuple[Tier, ...] = (
    "required",
    "contract",
    "confident_l3",
    "namespace",
    "optional_l2",
    "low_l3",
    "l1",
)
_RANK = {t: i for i, t in enumerate(PRIORITY)}
_REFERENCE_FIELDS = tuple(ReferenceTrace.model_fields)


def reference_entry(frag: Fragment) -> dict[str, Any]:
    """How a fragment left out by the budget is listed: where it is, never what it holds
    (the fields of :class:`~context_core.traces.ReferenceTrace`, in the bundle's
    ``context_used`` and in the route's trace record alike)."""
    return {name: getattr(frag, name) for name in _REFERENCE_FIELDS}


def apply_budget(
    ranked: Sequence[tuple[Tier, Fragment]], max_fragments: int
) -> tuple[list[Fragment], list[Fragment]]:
    """Split a route's fragments into (delivered, by reference) under the budget.

    ``ranked`` is every fragment the route found, in route order, each with its tier.
    Delivered fragments keep that order; the by-reference list is in priority order. All
    ``required`` fragments are delivered even beyond ``max_fragments``. Deterministic: the
    same input always gives the same split.
    """
    if max_fragments < 0:
        raise ValueError(f"max_fragments must be >= 0, got {max_fragments}")
    n_required = sum(1 for tier, _ in ranked if tier == "required")
    budget = max(max_fragments, n_required)
    order = sorted(
        range(len(ranked)),
        key=lambda i: (_RANK[ranked[i][0]], -ranked[i][1].relevance, i),
    )
    keep = set(order[:budget])
    delivered = [f for i, (_, f) in enumerate(ranked) if i in keep]
    by_reference = [ranked[i][1] for i in order[budget:]]
    return delivered, by_reference


# --- fallback trigger ---------------------------------------------------------------------------

_VERBS_EN = r"(?:told|showed|shown|taught|explained|said|mentioned|described)"
_TEACHING_CUES: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        # as I told you / like I showed you / as I explained
        rf"\b(?:as|like)\s+i(?:'ve|\s+have)?\s+(?:already\s+)?{_VERBS_EN}"
        r"(?:\s+(?:to\s+)?you\b)?\b",
        # remember what I said / remember how I showed you
        rf"\bremember\s+(?:what|how|when|that)\s+i\s+{_VERBS_EN}\b",
        # earlier I explained / last time, I told you / previously I showed
        rf"\b(?:earlier|previously|last\s+time)\s*,?\s+i\s+(?:already\s+)?{_VERBS_EN}\b",
        # I already told you / I've taught you / I have explained this before
        rf"\bi(?:'ve|\s+have)?\s+already\s+{_VERBS_EN}\b",
        rf"\bi(?:'ve|\s+have)?\s+{_VERBS_EN}\s+you\s+(?:this\s+|that\s+|it\s+)?"
        r"(?:before|earlier|already|last\s+time|previously)\b",
        r"\bi\s+taught\s+you\b",
        r"\bas\s+(?:we|i)\s+discussed\b",
        # Chinese: 上次 (last time) + 我/跟你/说/教..., 之前/以前/刚才 + 说过/讲过/教过,
        # 我教过你, 我(跟你)说过, 记得我说的, 像/正如我说的
        r"上次(?:我|跟你|和你|给你|你|说|讲|教|告诉|提到|提过)",
        r"(?:之前|以前|刚才|前面|早先)(?:我)?(?:已经)?(?:跟你|和你|给你)?(?:说|讲|提|教|告诉|演示)过",
        r"我(?:已经)?(?:跟你|和你|给你)?(?:说|讲|教|告诉|演示)过(?:你)?",
        r"记得我(?:说|讲|教|告诉)",
        r"(?:像|正如|就像|如)我(?:之前|以前|刚才)?(?:说|讲|教)的",
    )
)


def teaching_cue(text: str) -> str | None:
    """The phrase in ``text`` that refers to something the user taught earlier, else None.

    English and Chinese cues ("as I told you", "like I showed you", "remember what I said",
    "earlier I explained", "上次", "我之前说过", "我教过你" ...). Pure and cheap: a handful of
    regexes, first match wins.
    """
    if not text:
        return None
    for rx in _TEACHING_CUES:
        m = rx.search(text)
        if m:
            return m.group(0)
    return None


def confirm_path(session_id: str) -> str:
    """Where an agent posts the user-confirmed answer of a fallback."""
    return f"/v1/sessions/{session_id}/confirmations"
