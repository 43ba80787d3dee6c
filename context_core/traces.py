"""Route traces: one JSON line per routing decision, the raw material of CER.

Evaluation computes the Context Effectiveness Rate from these files, so the schema is a
contract: every record is validated against the pydantic models below *before* it is written,
and an invalid record raises instead of leaving a line evaluation would trip over.

Files: ``<CTX_DATA_DIR>/traces/traces-YYYY-MM-DD.jsonl`` (UTC date of the record). Two kinds
of record share a file:

``kind = "route"`` (written by :class:`context_core.routing.router.ContextRouter` on every route),
schema 3::

    {"schema": 3, "kind": "route", "trace_id": "<uuid4 hex>", "ts": "<ISO-8601 UTC>",
     "session_id": str, "step": int, "intent": str, "agent_id": str | null,
     "l2": {"requested": [key], "required": [key], "found": [key], "missing": [key],
            "expired": [key], "contract_lost": bool},
     "l3": {"requested": bool, "query": str (gateway-cleaned), "used": bool,
            "error": str | null, "confidence_signal": "cosine"|"p_relevant" (if requested),
            "hits": [{"id", "score", "label", "source", "section", "p_relevant"?}]},
     "ns": {"requested": [ref], "found": [ref], "denied": [ref]},
     "fragments": [{"layer": "L1"|"L2"|"L3"|"NS", "source", "confidence", "label",
                    "cites": [str]}],
     "by_reference": [{"layer", "source", "relevance", "label"}],
     "fallback": {"triggered": true, "reason": str, "confirm_at": str} | null,
     "confidence": {"accept": float, "skip": float, "source": str, "model": str | null,
                    "rule": "design"|"per_hit",
                    "relevance"?: {"accept", "skip", "source", "model", "kind", "features"},
                    "version"?: str | null,
                    "shadow"?: {"version", "accept", "skip", "signal", "labels": [label]}},
     "degraded": bool,
     "timings_ms": {"l1", "l2", "l3", "total"},
     "prompt"?: {"template": str, "bindings": [{"field", "layer": "l1"|"l2"|"l3", "key",
                 "status": "bound"|"notice"|"omitted", "fragments": [index]}]}}

``l2`` keys are full Redis keys (``wm:{<sid>}:<kind>:<id>``; preferences
``pref:{<org>:<uid>}:<type>``, ``pref:{<org>:<uid>}:*`` for "all of the user's"). ``required``
is the subset of ``requested`` the intent *requires* (``L2KeySpec.required``); the other
requested keys were asked for opportunistically (a cached API response, the sensor series before
it was fetched) and their absence is not a loading failure. ``expired`` lists missing keys this
session had written and that are gone (decided in Redis, ``SessionMemory.key_expired``, so
evaluation can tell decay from never-written whichever process routed); a key is in ``missing``
whenever absent, expired or not. ``contract_lost`` is true when the intent asked for the task
contract and this session's contract is expired: a live session lost its goal, which CER counts
as a loading failure even though the contract key is optional. ``ns`` refs are
``"<namespace>/<key>"``. ``l3.hits`` lists every hit with its label, including the ones dropped
as below skip; ``l3.used`` says whether any L3 fragment reached the bundle.

``fragments`` are the fragments *delivered* (within the bundle budget); ``by_reference`` the
ones the budget left out, without content or cites (an output citing them did not get them
from this bundle). ``fallback`` is the bundle's fallback section when the route triggered it,
else null. ``confidence`` is the threshold pair and rule the route labelled hits with, with
their provenance (file path or defaults) and the model the file was calibrated for; CER judges
a schema-3 record against *its* ``accept``. When a fitted relevance model labelled the hits
(:mod:`context_core.routing.relevance`), ``l3.confidence_signal`` is ``"p_relevant"``, each hit
carries
its ``p_relevant`` and ``confidence.relevance`` holds the model's cut points on it; the cosine
pair stays in ``confidence`` (``score`` is still the cosine). Records without these keys were
labelled by cosine. ``confidence.version`` names the promoted calibration version
(``reports/calibrations/<version>``, see :mod:`evaluation.promotion`) whose thresholds labelled
the hits (null: defaults or a file from before versioning), so CER and health reports can be
split by it; ``confidence.shadow`` is present while a candidate runs in shadow and holds the
labels it would have given the same hits.

``fragments[].cites`` are the fragment's **citable tokens**: what an output that used the
fragment would repeat, so CER can check use from the trace alone (see
:func:`fragment_cites`). At most 16 short tokens per fragment, never whole values or free
text: the fragment's key or point id (what the bundle's ``context_used`` lists), the L3 page
id and title, and from the content only whitespace-free pieces that contain a digit
(``PUMP-0042``, ``2026-08-14``, ``10816-3``) and numbers rounded to two decimals (``5.27``;
integers below 100 and epoch timestamps are left out as too common to be evidence). Plain
words are never tokens. Every token passes the sanitize gateway again when the record is
written; a token the gateway redacts or masks is dropped.
Why plain tokens and not hashes: the tokens are low-entropy (device ids, small numbers), so
an unsalted hash would be reversed by enumeration and only pretend to protect them, while
plain tokens let a failing step's report say what it could have cited. The step output,
stored next to the route record, already carries the same kind of values.

Older schemas stay valid and are still read by evaluation. Schema 2 has no
``l2.contract_lost``, ``by_reference``, ``fallback`` or ``confidence``. Schema 1 has, in
addition, no ``l2.required`` and no ``fragments[].cites``; CER treats every requested key of a
schema-1 record as required. ``TraceWriter.write_route`` stamps a record that names no schema
with the schema its fields follow: 3 when it has ``confidence``, else 2 when its ``l2`` has
``required``, else 1.

``kind = "step_output"`` (written by :meth:`TraceWriter.record_output` once the agent has
produced the step's output, so CER can check the context was *used*; the same shape in both
schemas)::

    {"schema": 3, "kind": "step_output", "trace_id", "ts", "session_id", "step", "output": str}

Query text, citable tokens and step outputs pass the sanitize gateway before they touch disk.

Client-supplied strings never reach the file raw: key names, ``session_id`` and the L3 error
pass the gateway; a ``trace_id`` must match ``[A-Za-z0-9._-]{1,64}`` and survive the gateway,
else a new id replaces it. With ``hash_keys`` (``CTX_TRACE_HASH_KEYS``, on for writers built
from settings) key segments carrying request values (``<device>`` in
``wm:{<sid>}:series:<device>.vibration``, ``<key>`` in ``ns:{<ns>}:kv:<key>`` and
``<ns>/<key>``) become ``#`` + 12 hex of their SHA-256 (HMAC under ``CTX_AUDIT_HMAC_KEY``),
the same in ``l2``, ``ns``, ``fragments[].source``, ``by_reference[].source`` and ``cites``;
in a preference key ``pref:{<org>:<uid>}:<type>`` the (org, user) pair is hashed. API
digests, step numbers, ``current`` and unfilled placeholders (``<{device}.vibration>``) are kept.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import itertools
import json
import logging
import math
import os
import re
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from context_core.errors import DataValidationError

if TYPE_CHECKING:
    from context_core.config import Settings
    from context_core.gateway.sanitize import Gateway

__all__ = [
    "SCHEMA_VERSION",
    "SUPPORTED_SCHEMAS",
    "RouteTrace",
    "RouteTraceV1",
    "RouteTraceV2",
    "StepOutputTrace",
    "TraceWriter",
    "citable_tokens",
    "fragment_cites",
    "fragment_entry",
    "new_trace_id",
    "read_traces",
    "trace_file",
    "valid_trace_id",
    "validate_record",
]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3
SUPPORTED_SCHEMAS = (1, 2, 3)
FILE_PREFIX = "traces-"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class L2TraceV1(_Strict):
    requested: list[str]
    found: list[str]
    missing: list[str]
    expired: list[str]


class L2TraceV2(L2TraceV1):
    required: list[str]


class L2Trace(L2TraceV2):
    contract_lost: bool


class L3Hit(_Strict):
    id: str
    score: float
    label: Literal["confident", "low_confidence", "below_skip"]
    source: str
    section: str | None
    p_relevant: float | None = None  # present when a relevance model labelled the hits


class L3Trace(_Strict):
    requested: bool
    query: str
    hits: list[L3Hit]
    used: bool
    error: str | None
    # what labelled the hits (present when L3 was requested): cosine thresholds or p_relevant
    confidence_signal: Literal["cosine", "p_relevant"] | None = None


class NsTrace(_Strict):
    requested: list[str]
    found: list[str]
    denied: list[str]


class FragmentTraceV1(_Strict):
    layer: Literal["L1", "L2", "L3", "NS"]
    source: str
    confidence: float
    label: str


class FragmentTrace(FragmentTraceV1):
    cites: list[str]


class ReferenceTrace(_Strict):
    layer: Literal["L1", "L2", "L3", "NS"]
    source: str
    relevance: float
    label: str


class FallbackTrace(_Strict):
    triggered: bool
    reason: str
    confirm_at: str


class RelevanceTrace(_Strict):
    """The relevance model's cut points on ``p_relevant`` when it labelled the route's hits."""

    accept: float
    skip: float
    source: str
    model: str | None
    kind: Literal["logistic", "isotonic"]
    features: list[str]


class ShadowTrace(_Strict):
    """How a calibration running in shadow would have labelled the route's hits (in
    ``l3.hits`` order); the route itself used the calibration in force."""

    version: str
    accept: float
    skip: float
    signal: Literal["cosine", "p_relevant"]
    labels: list[Literal["confident", "low_confidence", "below_skip"]]
    p_relevant: list[float] | None = None  # the candidate's p per hit (signal p_relevant)


class ConfidenceTrace(_Strict):
    accept: float
    skip: float
    source: str
    model: str | None
    rule: Literal["design", "per_hit"]
    relevance: RelevanceTrace | None = None
    version: str | None = None  # the promoted calibration that labelled the hits
    shadow: ShadowTrace | None = None


class PromptBindingTrace(_Strict):
    """One field of the route's prompt: ``fragments`` indexes the record's ``fragments`` whose
    values the prompt holds (empty for L1 fields, read from the session state)."""

    field: str
    layer: Literal["l1", "l2", "l3"]
    key: str
    status: Literal["bound", "notice", "omitted"]
    fragments: list[int]


class PromptTrace(_Strict):
    """The bundle's prompt (``context_core.routing.prompts``) as CER reads it: which template,
    and which delivered fragments each field bound."""

    template: str
    bindings: list[PromptBindingTrace]


class Timings(_Strict):
    l1: float = Field(ge=0)
    l2: float = Field(ge=0)
    l3: float = Field(ge=0)
    total: float = Field(ge=0)


class RouteTraceV2(_Strict):
    """A schema-2 route record: no ``l2.contract_lost``, ``by_reference``, ``fallback``,
    ``confidence``."""

    schema_: Literal[2] = Field(alias="schema")
    kind: Literal["route"]
    trace_id: str = Field(min_length=1)
    ts: str
    session_id: str = Field(min_length=1)
    step: int
    intent: str = Field(min_length=1)
    agent_id: str | None
    l2: L2TraceV2
    l3: L3Trace
    ns: NsTrace
    fragments: list[FragmentTrace]
    degraded: bool
    timings_ms: Timings


class RouteTrace(RouteTraceV2):
    """One routing decision (``kind = "route"``), schema 3 (the one written now)."""

    schema_: Literal[3] = Field(alias="schema")  # type: ignore[assignment]
    l2: L2Trace
    by_reference: list[ReferenceTrace]
    fallback: FallbackTrace | None
    confidence: ConfidenceTrace
    prompt: PromptTrace | None = None  # absent: no template for the intent, or an older record


class RouteTraceV1(RouteTraceV2):
    """A schema-1 route record: no ``l2.required``, no ``fragments[].cites``."""

    schema_: Literal[1] = Field(alias="schema")  # type: ignore[assignment]
    l2: L2TraceV1  # type: ignore[assignment]
    fragments: list[FragmentTraceV1]  # type: ignore[assignment]


class StepOutputTrace(_Strict):
    """The agent's output for a routed step (``kind = "step_output"``), every schema."""

    schema_: Literal[1, 2, 3] = Field(alias="schema")
    kind: Literal["step_output"]
    trace_id: str = Field(min_length=1)
    ts: str
    session_id: str = Field(min_length=1)
    step: int
    output: str


_MODELS: dict[tuple[str, int], type[_Strict]] = {
    ("route", 3): RouteTrace,
    ("route", 2): RouteTraceV2,
    ("route", 1): RouteTraceV1,
    ("step_output", 3): StepOutputTrace,
    ("step_output", 2): StepOutputTrace,
    ("step_output", 1): StepOutputTrace,
}
_KINDS = ("route", "step_output")


def validate_record(record: dict[str, Any]) -> None:
    """Raise :class:`DataValidationError` naming the bad fields if ``record`` breaks its schema.

    The record's own ``"schema"`` (1, 2 or 3) picks the model; all stay readable.
    """
    kind = record.get("kind")
    if kind not in _KINDS:
        raise DataValidationError(
            "trace record has no valid 'kind'",
            [f"kind={kind!r}; expected one of {sorted(_KINDS)}"],
        )
    version = record.get("schema")
    model = _MODELS.get((str(kind), version)) if type(version) is int else None
    if model is None:
        raise DataValidationError(
            f"{kind} trace record has an unknown schema",
            [f"schema={version!r}; expected one of {list(SUPPORTED_SCHEMAS)}"],
        )
    try:
        model.model_validate(record)
        dt.datetime.fromisoformat(record["ts"])
    except ValidationError as e:
        raise DataValidationError(
            f"{kind} trace record breaks schema {version}",
            [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()],
        ) from e
    except ValueError as e:
        raise DataValidationError(
            f"{kind} trace record breaks schema {version}", [f"ts: {e}"]
        ) from e


# --- citable tokens ------------------------------------------------------------------------

MAX_CITES = 16  # per fragment: enough for the ids and leading numbers, bounded record size
_MAX_TOKEN = 64
_MAX_TITLE = 80
_EPOCH_LIKE = 1e9  # numbers this large are timestamps: nobody cites them
_HAS_DIGIT = re.compile(r"\d").search
_DELIMS = re.compile(r"[,;()\[\]{}\"'<>|=]+")  # inside a whitespace-free piece (e.g. JSON)
_STRIP = ".:/-_!?*"


def _number_token(value: float) -> str | None:
    """A number as an output would print it; None when it is too common to be evidence.

    Integers need three digits (``12`` is everywhere), decimals two significant digits
    (``0.5`` likewise); epoch-sized numbers are timestamps nobody cites.
    """
    if not math.isfinite(value) or abs(value) >= _EPOCH_LIKE:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return str(value) if abs(value) >= 100 else None
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    significant = text.lstrip("-").lstrip("0.").replace(".", "")
    return text if len(significant) >= 2 else None


def _text_tokens(text: str) -> Iterator[str]:
    """Identifier-like pieces of a string: whitespace-free, 3..64 chars, containing a digit.

    ``str.split`` plus a digit test keeps this cheap on the route's hot path; only pieces
    that hold punctuation (JSON payloads without spaces) are split further.
    """
    for piece in text.split():
        if not _HAS_DIGIT(piece):
            continue
        parts = _DELIMS.split(piece) if _DELIMS.search(piece) else (piece,)
        for part in parts:
            tok = part.strip(_STRIP)
            if 3 <= len(tok) <= _MAX_TOKEN and _HAS_DIGIT(tok):
                yield tok


def _walk_tokens(value: Any) -> Iterator[str]:
    """Tokens of nested mappings/sequences in document order (explicit stack, no recursion)."""
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        if v is None or isinstance(v, bool):
            continue
        if isinstance(v, str):
            yield from _text_tokens(v)
        elif isinstance(v, int | float):
            tok = _number_token(v)
            if tok is not None:
                yield tok
        elif isinstance(v, list | tuple):
            stack.extend(reversed(v))
        elif isinstance(v, dict | Mapping):  # dict first: the ABC check is the slow one
            stack.extend(reversed(list(v.values())))


def citable_tokens(value: Any, *, limit: int = MAX_CITES) -> list[str]:
    """Tokens of ``value`` an output citing it would repeat (first ``limit``, de-duplicated).

    Strings give their identifier-like pieces that contain a digit (so plain words never
    count), numbers give their value rounded to two decimals; mappings and sequences are
    walked in order. Epoch-sized numbers and one- or two-character numbers are left out.
    """
    return _take(_walk_tokens(value), limit)


def _take(tokens: Iterable[str], limit: int) -> list[str]:
    out: dict[str, None] = {}
    for tok in tokens:
        if len(out) >= limit:
            break
        out.setdefault(tok, None)
    return list(out)


def fragment_cites(layer: str, source: str, content: Any, *, limit: int = MAX_CITES) -> list[str]:
    """The citable tokens of one bundle fragment (stored as ``fragments[].cites``).

    L2/NS: the Redis key, then tokens of the value. L3: the point id, the page id and the
    title, then tokens of the chunk text. L1: tokens of the value only (a field name such as
    ``session.user_query`` is not evidence of use).
    """
    memo_key = _l3_memo_key(layer, source, content, limit)
    if memo_key is not None:
        hit = _L3_CITES.get(memo_key)
        if hit is not None:
            return list(hit)
    head: list[str] = []
    body: Any = content
    if layer in ("L2", "NS"):
        head.append(source.partition(":")[2])
    elif layer == "L3":
        head.append(source.rpartition(":")[2])
        if isinstance(content, Mapping):
            head += [str(content.get("page") or ""), str(content.get("title") or "")]
            body = content.get("text", "")
    head = [h for h in head if h and len(h) <= _MAX_TITLE]
    cites = _take(itertools.chain(head, _walk_tokens(body)), limit)
    if memo_key is not None:
        if len(_L3_CITES) >= _L3_CITES_MAX:
            _L3_CITES.clear()
        _L3_CITES[memo_key] = tuple(cites)
    return cites


#: The cites of L3 chunks, by point and content: the same few chunks answer many routes.
_L3_CITES: dict[tuple[Any, ...], tuple[str, ...]] = {}
_L3_CITES_MAX = 4096


def _l3_memo_key(layer: str, source: str, content: Any, limit: int) -> tuple[Any, ...] | None:
    """What an L3 fragment's cites depend on, when it is only strings (else None: computed)."""
    if layer != "L3" or type(content) is not dict:
        return None
    page, title, text = content.get("page"), content.get("title"), content.get("text", "")
    if type(text) is not str or not all(v is None or type(v) is str for v in (page, title)):
        return None
    return (source, page, title, text, limit)


_FRAGMENT_TRACE_FIELDS = tuple(FragmentTraceV1.model_fields)


def fragment_entry(frag: Any) -> dict[str, Any]:
    """A delivered fragment (:class:`~context_core.routing.bundle.Fragment`) as a route record lists
    it: the fields of :class:`FragmentTrace`, ``cites`` computed from its content."""
    out = {name: getattr(frag, name) for name in _FRAGMENT_TRACE_FIELDS}
    out["cites"] = fragment_cites(frag.layer, frag.source, frag.content)
    return out


def new_trace_id() -> str:
    return uuid.uuid4().hex


_TRACE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_OUR_TRACE_ID = re.compile(r"[0-9a-f]{32}")  # new_trace_id()


def valid_trace_id(value: object) -> bool:
    """A trace id a client may send back: 1-64 characters from ``A-Z a-z 0-9 . _ -``."""
    return isinstance(value, str) and _TRACE_ID.fullmatch(value) is not None


# --- key names in records --------------------------------------------------------------------

_WM_KEY = re.compile(r"(wm:\{[^{}]*\}:[a-z][a-z0-9_]*:)(.+)", re.S)
_NS_KEY = re.compile(r"(ns:\{[^{}]*\}:kv:|[^/]*/)(.+)", re.S)  # a Redis key or a ref
_PREF_KEY = re.compile(r"pref:\{([^{}]*)\}(:.*)", re.S)  # the user id is hashed
# Idents carrying no request value: API digest, step number, contract, our hash, placeholder.
_KEEP_IDENT = re.compile(r"[0-9a-f]{64}|\d{1,9}|current|#[0-9a-f]{12}|<[^<>]*\{[^<>]*>", re.S)


class _KeyNames:
    """Key names (``wm:``/``ns:`` keys, ``<ns>/<key>`` refs, ``L2:``/``NS:`` sources) as a
    record may hold them; cached, since the route is the hot path."""

    def __init__(self, gateway: Gateway, *, hash_keys: bool, hash_key: bytes | None) -> None:
        self.gateway, self.hash_keys, self._hash_key = gateway, hash_keys, hash_key
        self._cache: dict[str, str] = {}

    def digest(self, text: str) -> str:
        data = text.encode("utf-8", "surrogatepass")
        if self._hash_key is not None:
            return "#" + hmac.new(self._hash_key, data, hashlib.sha256).hexdigest()[:12]
        return "#" + hashlib.sha256(data).hexdigest()[:12]

    def map(self, text: Any) -> Any:
        if not isinstance(text, str):
            return text  # validation names the bad field
        hit = self._cache.get(text)
        if hit is None:
            hit = self.gateway.clean_text(self._hashed(text), where="trace.key")
            if len(self._cache) >= 4096:
                self._cache.clear()
            self._cache[text] = hit
        return hit

    def _hashed(self, text: str) -> str:
        layer, sep, key = text.partition(":")
        if sep and layer in ("L1", "L2", "L3", "NS"):  # a fragment source
            return f"{layer}:{self._hashed(key)}" if layer in ("L2", "NS") else text
        if not self.hash_keys:
            return text
        if m := _WM_KEY.fullmatch(text):
            keep = _KEEP_IDENT.fullmatch(m.group(2))
            return m.group(1) + (m.group(2) if keep else self.digest(m.group(2)))
        if m := _PREF_KEY.fullmatch(text):
            return f"pref:{{{self.digest(m.group(1))}}}{m.group(2)}"
        if m := _NS_KEY.fullmatch(text):
            return m.group(1) + self.digest(m.group(2))
        return self.digest(text)


_LINE_ENCODER = msgspec.json.Encoder()


def utc_now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def trace_file(traces_dir: Path, day: dt.date) -> Path:
    return traces_dir / f"{FILE_PREFIX}{day.isoformat()}.jsonl"


class TraceWriter:
    """Appends validated trace records to the daily JSONL file; safe across threads.

    Each record is encoded first and written with a single ``write`` on an ``O_APPEND``
    descriptor, so lines from several threads (or processes on one host) never interleave.
    """

    def __init__(
        self,
        traces_dir: Path,
        *,
        gateway: Gateway | None = None,
        hash_keys: bool = False,
        hash_key: bytes | None = None,
    ) -> None:
        if gateway is None:
            from context_core.gateway.sanitize import Gateway

            gateway = Gateway()
        self.traces_dir = Path(traces_dir)
        self._gateway = gateway
        self._names = _KeyNames(gateway, hash_keys=hash_keys, hash_key=hash_key)
        self._lock = threading.Lock()
        self._fd: int | None = None  # O_APPEND descriptor of the current day's file
        self._fd_day: dt.date | None = None
        self._fd_name = ""  # the open file's path, as a str for the per-record check
        self._fd_id: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the open file

    @classmethod
    def from_settings(cls, settings: Settings, gateway: Gateway | None = None) -> TraceWriter:
        key = settings.audit_hmac_key
        return cls(
            settings.traces_dir,
            gateway=gateway,
            hash_keys=settings.trace_hash_keys,
            hash_key=key.get_secret_value().encode() if key is not None else None,
        )

    def key_name(self, key: str) -> str:
        """How this writer records a Redis key, ref or fragment source (e.g. to match the key
        an output cites against a hashed record)."""
        return str(self._names.map(key))

    def _trace_id(self, value: Any, where: str) -> Any:
        """``value`` if it is one of ours or a valid id the gateway leaves alone, else new."""
        if not isinstance(value, str) or _OUR_TRACE_ID.fullmatch(value):
            return value  # a non-string is named by validation
        if valid_trace_id(value) and self._gateway.clean_text(value, where=where) == value:
            return value
        new = new_trace_id()
        log.warning("%s: invalid trace_id replaced by %s (the value is not recorded)", where, new)
        return new

    def clean_query(self, query: str) -> str:
        """The query text as it may be stored: secrets and PII removed by the gateway."""
        return self._gateway.clean_text(query, where="trace.l3.query")

    def write_route(self, record: dict[str, Any], *, validate: bool = True) -> dict[str, Any]:
        """Validate and append one ``route`` record (``l3.query`` is cleaned here).

        ``validate=False`` skips the schema check (~45 us on a bundle's record), for the
        router's own record: it is built from typed parts, and tests/test_router.py checks
        every record its routes write against the schema. The gateway cleaning below runs
        either way: the record's texts came from requests."""
        rec = dict(record)
        l2 = rec.get("l2")
        if "schema" not in rec:
            if "confidence" in rec:
                rec["schema"] = SCHEMA_VERSION
            elif isinstance(l2, Mapping) and "required" not in l2:
                rec["schema"] = 1
            else:
                rec["schema"] = 2
        rec.setdefault("kind", "route")
        rec.setdefault("ts", utc_now_iso())
        rec["trace_id"] = self._trace_id(rec.get("trace_id"), "trace.route")
        if isinstance(rec.get("session_id"), str):
            rec["session_id"] = self._gateway.clean_text(rec["session_id"], where="trace.sid")
        l3 = dict(rec.get("l3") or {})
        if isinstance(l3.get("query"), str):
            l3["query"] = self.clean_query(l3["query"])
        if isinstance(l3.get("error"), str):
            l3["error"] = self._gateway.clean_text(l3["error"], where="trace.l3.error")
        rec["l3"] = l3
        for block in ("l2", "ns"):
            if isinstance(rec.get(block), Mapping):
                rec[block] = {
                    k: [self._names.map(x) for x in v] if isinstance(v, list) else v
                    for k, v in rec[block].items()
                }
        frags = rec.get("fragments")
        if isinstance(frags, list):
            rec["fragments"] = [self._clean_fragment(f) for f in frags]
        refs = rec.get("by_reference")
        if isinstance(refs, list):
            rec["by_reference"] = [
                {**r, "source": self._names.map(r["source"])}
                if isinstance(r, Mapping) and "source" in r
                else r
                for r in refs
            ]
        fallback = rec.get("fallback")
        if isinstance(fallback, Mapping) and isinstance(fallback.get("confirm_at"), str):
            where = "trace.fallback"
            rec["fallback"] = {
                **fallback,
                "confirm_at": self._gateway.clean_text(fallback["confirm_at"], where=where),
                "reason": self._gateway.clean_text(str(fallback.get("reason", "")), where=where),
            }
        self._append(rec, validate=validate)
        return rec

    def _clean_fragment(self, frag: Any) -> Any:
        """Source through the key mapping; with hashing, the key in ``cites`` likewise."""
        if not isinstance(frag, Mapping) or not isinstance(frag.get("source"), str):
            return frag
        raw = frag["source"]
        out = {**frag, "source": self._names.map(raw)}
        cites = frag.get("cites")
        if self._names.hash_keys and isinstance(cites, list) and frag.get("layer") in ("L2", "NS"):
            key = raw.partition(":")[2]
            out["cites"] = [self._names.map(key) if c == key else c for c in cites]
        return self._clean_cites(out) if "cites" in out else out

    def _clean_cites(self, frag: Any) -> Any:
        """Cites pass the gateway again; a token it changes (redacts, masks) is dropped."""
        if not isinstance(frag, Mapping) or not isinstance(frag.get("cites"), list):
            return frag
        cleaned = self._gateway.clean(list(frag["cites"]), where="trace.fragments.cites")
        keep = [t for t, c in zip(frag["cites"], cleaned, strict=True) if t == c]
        return {**frag, "cites": keep}

    def record_output(self, trace_id: str, session_id: str, step: int, output: str) -> None:
        """Append the agent's output for the step routed under ``trace_id``."""
        rec = {
            "schema": SCHEMA_VERSION,
            "kind": "step_output",
            "trace_id": self._trace_id(trace_id, "trace.step_output"),
            "ts": utc_now_iso(),
            "session_id": self._gateway.clean_text(session_id, where="trace.sid"),
            "step": step,
            "output": self._gateway.clean_text(output, where="trace.step_output"),
        }
        self._append(rec)

    def _append(self, rec: dict[str, Any], *, validate: bool = True) -> None:
        if validate:
            validate_record(rec)
        day = dt.datetime.fromisoformat(rec["ts"]).astimezone(dt.UTC).date()
        # compact UTF-8 JSON on one line (msgspec: a seventh of json.dumps' time on a route
        # record; NaN, which no JSON reader takes, is written null)
        line = _LINE_ENCODER.encode(rec) + b"\n"
        with self._lock:
            # Keep the day's descriptor open (a route is hot path); reopen when the day
            # changes or the file at its path is no longer the one open (removed, rotated).
            if self._fd is None or day != self._fd_day or not self._fd_current():
                self._close_fd()
                path = trace_file(self.traces_dir, day)
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
                st = os.fstat(fd)
                self._fd, self._fd_day = fd, day
                self._fd_name, self._fd_id = str(path), (st.st_dev, st.st_ino)
            os.write(self._fd, line)

    def _fd_current(self) -> bool:
        """Whether the path of the open descriptor still names the file it opened: one
        ``stat`` on a prepared string (``Path.exists`` cost ~6x as much per record), which
        also sees a file rotated away and replaced by a new one under the same name."""
        try:
            st = os.stat(self._fd_name)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._fd_id

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._fd_day = None, None

    def close(self) -> None:
        """Close the open trace file (writing again reopens it)."""
        with self._lock:
            self._close_fd()

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)


def _as_utc(value: dt.datetime | dt.date | None, *, end: bool) -> dt.datetime | None:
    if value is None:
        return None
    if not isinstance(value, dt.datetime):
        t = dt.time.max if end else dt.time.min
        return dt.datetime.combine(value, t, tzinfo=dt.UTC)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def read_traces(
    traces_dir: Path,
    since: dt.datetime | dt.date | None = None,
    until: dt.datetime | dt.date | None = None,
    *,
    kind: Literal["route", "step_output"] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield records (oldest file first) with ``since <= ts <= until``; dates are inclusive.

    Naive datetimes are taken as UTC. Blank lines are skipped; a line that is not JSON raises
    :class:`DataValidationError` naming the file and line, since silently skipping it would
    bias CER.
    """
    lo, hi = _as_utc(since, end=False), _as_utc(until, end=True)
    files = sorted(Path(traces_dir).glob(f"{FILE_PREFIX}*.jsonl"))
    for path in files:
        try:
            day = dt.date.fromisoformat(path.stem.removeprefix(FILE_PREFIX))
        except ValueError:
            continue
        if (lo and day < lo.date()) or (hi and day > hi.date()):
            continue
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataValidationError(
                        f"trace file {path} has a corrupt line", [f"line {n}: {e}"]
                    ) from e
                if kind and rec.get("kind") != kind:
                    continue
                if lo or hi:
                    ts = dt.datetime.fromisoformat(rec["ts"])
                    if (lo and ts < lo) or (hi and ts > hi):
                        continue
                yield rec
