"""The wire forms: one model per concept that leaves the process as JSON, and one encoder.

Each concept is declared once, here (or in its own module, for the trace records of
:mod:`context_core.traces`), and both the library code that produces it and the HTTP service
(its request/response models and the OpenAPI it publishes) use that declaration:

* **L1 on the wire**, :class:`WireState`: a :class:`~context_core.session.state.SessionState`
  without its gateway, auth context and offload, plus ``version``/``nonce`` (the service's
  replay check) and ``sig``, an HMAC-SHA256 over every other field. :meth:`WireState.of`
  signs a state, :meth:`WireState.verify` checks one, :meth:`WireState.to_state` rebuilds
  L1 (untrusted: the gateway cleans every field again). Its fields are read from the state by
  name, so a field added to one and not the other fails the wire tests.
* **The context bundle**, :class:`BundleWire` (with :class:`FragmentWire` and
  :class:`ContextUsed`): :meth:`context_core.routing.bundle.ContextBundle.to_dict` writes exactly
  its
  fields, and the service publishes it as ``POST /v1/context``'s response.

Serializing is :func:`encode_json`: compact UTF-8 JSON from msgspec's C encoder, with
non-finite floats as null (as pydantic writes them) and numpy-style scalars as numbers. The
hot endpoints encode once with it and skip FastAPI's response validation; the contract tests
check the bytes against the published schema instead.

No FastAPI here: the library stays usable without the service.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import numbers
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from context_core.session.state import ApiResultPointer, SessionState, TraceItem
from context_core.traces import FallbackTrace, ReferenceTrace

if TYPE_CHECKING:
    from context_core.gateway.sanitize import Gateway
    from context_core.session.state import AuthContext, TraceOffload

__all__ = [
    "BUNDLE_ID_PATTERN",
    "ID_PATTERN",
    "NO_NONCE",
    "BundleDeltaWire",
    "BundleWire",
    "ContextUsed",
    "DeltaFragmentWire",
    "FragmentRef",
    "FragmentWire",
    "PromptBindingWire",
    "PromptWire",
    "WireApiResult",
    "WireState",
    "WireTraceItem",
    "check_unicode",
    "encode_json",
]

ID_PATTERN = r"^[A-Za-z0-9._-]+$"
"""Session and call ids: the characters an L2 key segment may hold (no colon or brace)."""

NO_NONCE = "0" * 32
"""The nonce of a state that never meets the service's replay check (tests, tools)."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def check_unicode(value: str) -> str:
    """Refuse lone surrogates (valid in JSON escapes, but not encodable as UTF-8)."""
    if value.isascii():
        return value
    m = _SURROGATE.search(value)
    if m is not None:
        raise PydanticCustomError(
            "string_surrogate",
            "string holds a lone UTF-16 surrogate at character {position}; send valid Unicode text",
            {"position": m.start()},
        )
    return value


# --- encoding ---------------------------------------------------------------------------------


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, BaseModel):  # the wire models below
        return obj.model_dump()
    if isinstance(obj, numbers.Integral):  # numpy integers from a vector store
        return int(obj)
    if isinstance(obj, numbers.Real):  # numpy floats
        return float(obj)
    if isinstance(obj, set | frozenset):
        return list(obj)
    tolist = getattr(obj, "tolist", None)  # numpy arrays
    if callable(tolist):
        return tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON-serializable")


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON of ``value`` (NaN and infinities become null).

    Raises :class:`TypeError` for a value JSON cannot hold; callers with a more forgiving
    encoder (the service's) fall back to it."""
    if isinstance(value, BaseModel):  # pydantic's own serializer, no dict in between
        return value.__pydantic_serializer__.to_json(value)
    try:
        return _ENCODER.encode(value)
    except msgspec.EncodeError as e:
        raise TypeError(str(e)) from e


# --- L1 on the wire ---------------------------------------------------------------------------

SessionId = Annotated[str, Field(min_length=1, max_length=128, pattern=ID_PATTERN)]
CallId = Annotated[str, Field(min_length=1, max_length=128, pattern=ID_PATTERN)]
Nonce = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
WireId = Annotated[str, Field(min_length=1, max_length=128), AfterValidator(check_unicode)]
WireName = Annotated[str, Field(max_length=1000), AfterValidator(check_unicode)]
WireText = Annotated[str, Field(max_length=256 * 1024), AfterValidator(check_unicode)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", from_attributes=True)


class WireApiResult(_Wire):
    """:class:`~context_core.session.state.ApiResultPointer` on the wire."""

    status: WireName
    data_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class WireTraceItem(_Wire):
    """:class:`~context_core.session.state.TraceItem` on the wire."""

    kind: Literal["tool_call", "tool_result"]
    name: WireName
    payload: WireText
    ts: float
    call_id: CallId
    status: WireName | None = None


_CHECK_FIELDS = ("version", "nonce", "sig")
#: L1 fields added after signed states were in use: signed only when set (see signed_part).
_ADDED_FIELDS = ("shared_state_ref",)


class WireState(_Wire):
    """L1 as JSON. ``sig`` covers every other field; the auth context never travels.

    Its texts were cleaned by the gateway (which may lengthen them a little, e.g. a masked
    secret), so their limits are looser than the request fields they came from."""

    session_id: SessionId
    user_id: WireId
    start_time: float
    user_query: WireText
    current_step: int = Field(ge=0)
    last_device_id: WireName | None = None
    last_api_result: WireApiResult | None = None
    trace: list[WireTraceItem] = Field(default_factory=list, max_length=20)
    shared_state_ref: int | None = Field(
        None,
        ge=0,
        description="the task-contract version this agent last read or wrote (null: none)",
    )
    version: int = Field(0, ge=0, description="+1 per applied event; stale versions are refused")
    nonce: Nonce = Field(NO_NONCE, description="the session's incarnation")
    sig: str = Field(min_length=64, max_length=64)

    def signed_part(self) -> dict[str, Any]:
        """Every field but ``sig``; a field added after states were first signed is left
        out while it holds its default (null), so a state signed before it existed (and
        echoed without it) still verifies."""
        body = self.model_dump(exclude={"sig"})
        for name in _ADDED_FIELDS:
            if body.get(name) is None:
                body.pop(name, None)
        return body

    @classmethod
    def of(
        cls, state: SessionState, key: bytes, *, version: int = 0, nonce: str = NO_NONCE
    ) -> WireState:
        """``state`` signed with ``key``. ``version``/``nonce`` come from the session's record
        in Redis; the defaults are for states that never meet the replay check.

        One validation pass (limits, and coercion such as an int ``start_time`` to a float)
        makes the model exactly what a client's echo parses back to, so the signature is over
        the canonical bytes :meth:`verify` recomputes."""
        body: dict[str, Any] = {name: getattr(state, name) for name in L1_FIELDS}
        body.update(version=version, nonce=nonce, sig="0" * 64)
        wire = cls.model_validate(body)
        unsigned = wire.signed_part()
        wire.sig = _signature(key, unsigned)
        return wire

    def verify(self, key: bytes) -> bool:
        body = self.signed_part()
        if hmac.compare_digest(self.sig, _signature(key, body)):
            return True
        # a state signed over the earlier canonical form (see _legacy_signature)
        return hmac.compare_digest(self.sig, _legacy_signature(key, body))

    def to_state(
        self,
        *,
        gateway: Gateway,
        auth: AuthContext,
        offload: TraceOffload | None = None,
    ) -> SessionState:
        """Rebuild L1 (untrusted construction: the gateway cleans every field again).
        ``offload`` sends big trace payloads of later tool calls to L2."""
        fields = {name: getattr(self, name) for name in L1_FIELDS}
        ptr = self.last_api_result
        fields["last_api_result"] = (
            None if ptr is None else ApiResultPointer(**{n: getattr(ptr, n) for n in _PTR_FIELDS})
        )
        fields["trace"] = tuple(
            TraceItem(**{n: getattr(t, n) for n in _ITEM_FIELDS}) for t in self.trace
        )
        return SessionState(**fields, gateway=gateway, auth_context=auth, offload=offload)


L1_FIELDS: tuple[str, ...] = tuple(n for n in WireState.model_fields if n not in _CHECK_FIELDS)
"""The :class:`SessionState` fields that travel (everything but gateway, auth, offload)."""
_PTR_FIELDS = tuple(WireApiResult.model_fields)
_ITEM_FIELDS = tuple(WireTraceItem.model_fields)


#: The signed bytes: compact UTF-8 JSON with every object's keys sorted (msgspec's C encoder,
#: a tenth of ``json.dumps(sort_keys=True)``'s time on a session's state).
_CANONICAL = msgspec.json.Encoder(order="sorted")


def _signature(key: bytes, body: dict[str, Any]) -> str:
    return hmac.digest(key, _CANONICAL.encode(body), "sha256").hex()  # one-shot, in C


def _legacy_signature(key: bytes, body: dict[str, Any]) -> str:
    """The signature as states were signed before: over ``json.dumps`` of the same fields
    (the same bytes but for a float's exponent, ``1e+16`` where msgspec writes ``1e16``).
    :meth:`WireState.verify` accepts either, so states issued before an upgrade stay valid.
    Both are HMACs under this service's key over an encoding of the same fields, and each
    encoding parses back to its own fields only, so neither can vouch for other content
    (the service never signs a non-finite float, the one value the two write differently
    enough to matter)."""
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hmac.new(key, canon.encode("utf-8"), hashlib.sha256).hexdigest()


# --- the context bundle -----------------------------------------------------------------------


class _Out(BaseModel):
    """A response model: closed, so a key the producer adds without declaring it here fails
    the contract tests instead of reaching clients unpublished."""

    model_config = ConfigDict(extra="forbid")


class FragmentWire(_Out):
    """:class:`~context_core.routing.bundle.Fragment` on the wire (provenance in its ``source``)."""

    layer: Literal["L1", "L2", "L3", "NS"]
    source: str
    content: Any
    relevance: float
    freshness_hours: float = Field(description="age of the value in hours; -1.0 when unknown")
    confidence: float
    label: str
    note: str = ""
    p_relevant: float | None = Field(
        None,
        description="L3: the hit's calibrated probability of relevance, when a fitted "
        "relevance model is in force (else null)",
    )
    confidence_signal: Literal["cosine", "p_relevant"] | None = Field(
        None,
        description="L3: what the label came from: the cosine thresholds or the relevance "
        "model's cut points on p_relevant (null for other layers)",
    )


class ContextUsed(_Out):
    """What the step's output should cite: the delivered fragments by key or point id, the
    ones the budget left out (``by_reference``), and ``fallback`` when it triggered (absent
    otherwise)."""

    l1: list[str]
    l2: list[str]
    l3: list[str]
    l3_reference: list[str]
    ns: list[str]
    by_reference: list[ReferenceTrace]
    fallback: FallbackTrace | None = None


class PromptBindingWire(_Out):
    """One field of a rendered prompt: where its value came from and how it was bound."""

    field: str
    layer: Literal["l1", "l2", "l3"]
    key: str = Field(description="the L1 field, the L2 key kind[:ident] or the L3 title match")
    status: Literal["bound", "notice", "omitted"] = Field(
        description="bound: the value is in the text; notice: it is, marked 'for reference "
        "only; real-time data decides' (low confidence) or shown as not available; omitted: "
        "not in the text (missing or low confidence, by the field's policy)"
    )
    confidence: float | None = Field(
        description="the bound value's confidence (the highest of its fragments; 1.0 for "
        "exact reads), null when nothing was bound"
    )


class PromptWire(_Out):
    """The bundle rendered into its intent's prompt template (``context_core.routing.prompts``)."""

    intent: str = Field(description="the intent whose template rendered it (the resolved one)")
    template: str = Field(description="shipped/<intent>.j2 or operator/<intent>.j2")
    text: str
    bindings: list[PromptBindingWire]
    context_used: list[str] = Field(
        description="the sources whose values the text holds (L1:session.<field>, fragment sources)"
    )


class BundleWire(_Out):
    """:class:`~context_core.routing.bundle.ContextBundle` on the wire."""

    session_id: str
    step: int
    intent: str
    resolved_intent: str = Field(
        description="the intent whose spec was routed (an unknown intent routes as 'default')"
    )
    fragments: list[FragmentWire]
    degraded: bool
    timings_ms: dict[str, float]
    context_used: ContextUsed
    trace_id: str
    prompt: PromptWire | None = Field(
        None, description="the bundle rendered into its intent's prompt; null: no template"
    )


# --- the bundle as a delta (POST /v1/context with "delta": true; context_core.routing.delta)
# ---------

BUNDLE_ID_PATTERN = r"^[0-9]{1,12}\.[0-9a-f]{8}$"
"""A delta bundle's id: ``<seq>.<nonce>`` (its place in the session's bundle log, and 32
random bits so an id from before the log expired never matches a new entry)."""


class DeltaFragmentWire(FragmentWire):
    """A new or changed fragment of a delta bundle: the fragment in full, with its content
    hash and position in the full bundle. Its id is its ``source`` (``#2``, ``#3`` ... added
    to a repeated one, in bundle order: ``context_core.routing.delta.fragment_ids``)."""

    hash: str = Field(description="content hash (every field but freshness_hours)")
    pos: int = Field(ge=0, description="its index in the full bundle")


class FragmentRef(_Out):
    """An unchanged fragment of a delta bundle, by reference: the client holds its content
    from the base bundle (same id, same hash); only its age is new."""

    id: str = Field(description="the fragment's source (stable: layer + key or point id)")
    hash: str
    layer: Literal["L1", "L2", "L3", "NS"]
    freshness_hours: float = Field(description="the value's age now (the content is unchanged)")
    pos: int = Field(ge=0, description="its index in the full bundle")


class BundleDeltaWire(_Out):
    """The bundle as a delta against ``base_bundle_id`` (``context_core.routing.delta``): the full
    bundle is ``fragments`` and ``unchanged`` sorted by ``pos``, each reference replaced by
    the base's fragment of that id (with the reference's ``freshness_hours``). ``full``:
    there was no base (none asked for, unknown or expired): every fragment is in
    ``fragments``."""

    session_id: str
    step: int
    intent: str
    resolved_intent: str
    bundle_id: str = Field(description="send it as since_bundle to get the next delta")
    base_bundle_id: str | None = Field(description="the bundle this delta applies to")
    full: bool
    fragments: list[DeltaFragmentWire]
    unchanged: list[FragmentRef]
    removed: list[str] = Field(description="ids of the base's fragments no longer delivered")
    degraded: bool
    timings_ms: dict[str, float]
    context_used: ContextUsed
    trace_id: str
    prompt: PromptWire | None = Field(
        None, description="the full bundle rendered into its intent's prompt; null: no template"
    )
