"""L1 session state: what an agent knows *right now*, in-process, immutable and never persisted.

Why immutable: an agent runs for an hour and hands its state to many helpers (router, tools,
lifecycle hooks). A frozen, slotted dataclass means nobody can change it behind the agent's
back; every change returns a new instance via :func:`dataclasses.replace`, so an old snapshot
stays valid for whoever holds it.

Why never persisted: the state carries an auth context and raw user input. Pickling, deep
copying or otherwise duplicating it out of the process raises :class:`PersistenceRefusedError`.
What must survive a restart belongs in L2 (working memory), through the gateway.

Why contextvars: one process serves many sessions on threads and asyncio tasks. The current
session is bound per context (:func:`bind_session`), so a thread or task only ever sees its own.

Everything that enters the state goes through the sanitize gateway, by construction: the
public methods clean what they add, and a direct constructor call or an outside
``dataclasses.replace`` re-cleans every text field in ``__post_init__``.

The action trace keeps the last :data:`TRACE_PAIRS` tool_call/tool_result *pairs*:

* a pair is identified by ``call_id``; its position is the position of its call;
* a call without a result yet is an *open* pair and counts like a closed one;
* when an 11th pair starts, the oldest pair (open or closed) is evicted whole, call and
  result together, so the trace never holds half a pair;
* a result for an unknown ``call_id`` (never recorded, or evicted while open) and a second
  result for the same call raise :class:`ContextError` rather than being silently dropped.

L1 keeps pointers, not entities. A state built with ``offload=TraceOffload(max_bytes, store)``
keeps a tool call's args or result in the trace only while its cleaned JSON is at most
``max_bytes``; a bigger one is handed to ``store`` (which writes it to L2 and returns the
key) and the trace item holds ``{"l2_key", "sha256", "bytes"}`` instead, so the state stays
small however big the tool output was. ``last_api_result`` keeps status + sha256 either way.
Without an offload (plain library use) payloads stay inline, as before.

Cooperating agents (planner, executor, verifier) share one task contract in L2; each one's
``shared_state_ref`` is the contract version it last read or wrote (``None``: it has not
looked), set by the helpers of :mod:`context_core.working_memory.contract_sync`, so a write
can name the version it acted on and a stale one is refused.
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from context_core.errors import ContextError, InputTooDeepError, PersistenceRefusedError
from context_core.gateway.identity import DEFAULT_ORG, canonical_user_id
from context_core.gateway.sanitize import Gateway, mask_mobile

__all__ = [
    "TRACE_PAIRS",
    "ApiResultPointer",
    "AuthContext",
    "OffloadedPayload",
    "SessionState",
    "TraceItem",
    "TraceOffload",
    "bind_session",
    "clean_trace_text",
    "current_session",
    "normalize_url",
    "strip_emoji",
    "update_current",
]

TRACE_PAIRS = 10
"""How many tool_call/tool_result pairs the trace keeps."""

_REFUSAL = (
    "L1 session state is in-process only and is never pickled, deep-copied or written to "
    "disk (it carries the auth context and raw user input); store what must survive in L2 "
    "working memory (WorkingMemory.session(...).put_step_result) instead"
)


def _refuse(*_args: object, **_kwargs: object) -> NoReturn:
    raise PersistenceRefusedError(_REFUSAL)


# --------------------------------------------------------------------------------------
# trace input cleaning
# --------------------------------------------------------------------------------------

# Emoji and their glue: pictographs, symbols, dingbats, flags, skin tones, variation
# selectors, zero-width joiner, keycap, tag characters.
_EMOJI = re.compile(
    "["
    "\U0001f000-\U0001faff"  # mahjong .. symbols & pictographs ext-A (incl. skin tones)
    "\U0001f1e6-\U0001f1ff"  # regional indicators (flags)
    "\u2600-\u27bf"  # misc symbols, dingbats
    "\u2300-\u23ff"  # misc technical (watch, hourglass, ...)
    "\u2b00-\u2bff"  # arrows & stars used as emoji
    "\ufe0e\ufe0f"  # variation selectors
    "\u200d"  # zero-width joiner
    "\u20e3"  # combining keycap
    "\U000e0020-\U000e007f"  # tag characters (subdivision flags)
    "]+"
)
_URL = re.compile(r"""(?i)\b[a-z][a-z0-9+.\-]*://[^\s<>"'`]+""")
_URL_TRAILING = ".,;:!?)]}"
_TRACKING_PARAMS = frozenset({"gclid", "fbclid", "msclkid", "mc_eid", "mc_cid"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def strip_emoji(text: str) -> str:
    """Remove emoji (and the joiners/selectors that glue them), collapsing the gap left."""
    if text.isascii():
        return text
    stripped = _EMOJI.sub("", text)
    if stripped == text:
        return text
    return re.sub(r"[ \t]{2,}", " ", stripped).strip()


def _normalize_one_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return url  # not a parseable URL: leave it for the gateway
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    userinfo = ""
    if parts.username:
        # Credentials in a URL are a secret; keep the user name only.
        userinfo = f"{parts.username}@"
    netloc = userinfo + host
    if port is not None and _DEFAULT_PORTS.get(scheme) != port:
        netloc = f"{netloc}:{port}"
    query_pairs = [
        (k, v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
        if not k.lower().startswith("utm_") and k.lower() not in _TRACKING_PARAMS
    ]
    query = urlencode(sorted(query_pairs))
    return urlunsplit((scheme, netloc, parts.path, query, ""))


def normalize_url(url: str) -> str:
    """Canonical form of one URL, so the same resource looks the same in every trace.

    Lowercase scheme and host, default port dropped, user password dropped, fragment dropped,
    query parameters sorted, tracking parameters (``utm_*``, gclid, fbclid, msclkid, mc_*)
    removed. Unparseable input is returned unchanged.
    """
    return _normalize_one_url(url)


def _normalize_urls(text: str) -> str:
    if "://" not in text:
        return text

    def repl(m: re.Match[str]) -> str:
        raw = m.group(0)
        tail = ""
        while raw and raw[-1] in _URL_TRAILING:
            tail = raw[-1] + tail
            raw = raw[:-1]
        return _normalize_one_url(raw) + tail

    return _URL.sub(repl, text)


#: Texts :func:`clean_trace_text` leaves exactly as they are (bounded, as the gateway's own
#: memo of clean text): a session's signed state comes back with every request, and its
#: trace items were cleaned when they entered L1.
_TRACE_TEXT_UNCHANGED: dict[str, None] = {}
_TRACE_MEMO_MAX_ITEMS = 8192
_TRACE_MEMO_MAX_LEN = 2048


def clean_trace_text(text: str) -> str:
    """Trace-specific cleaning (emoji, URLs, mobile numbers); the gateway runs afterwards."""
    if type(text) is str and text in _TRACE_TEXT_UNCHANGED:
        return text
    out = mask_mobile(_normalize_urls(strip_emoji(text)))
    if out == text and type(text) is str and len(text) <= _TRACE_MEMO_MAX_LEN:
        if len(_TRACE_TEXT_UNCHANGED) >= _TRACE_MEMO_MAX_ITEMS:
            _TRACE_TEXT_UNCHANGED.clear()
        _TRACE_TEXT_UNCHANGED[text] = None
    return out


_MAX_TRACE_DEPTH = 200


def _deep_trace_clean(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return clean_trace_text(value)
    if depth >= _MAX_TRACE_DEPTH and isinstance(value, Mapping | list | tuple | set | frozenset):
        raise InputTooDeepError(
            f"trace payload is nested deeper than {_MAX_TRACE_DEPTH} levels; flatten it"
        )
    if isinstance(value, Mapping):
        return {
            (clean_trace_text(k) if isinstance(k, str) else k): _deep_trace_clean(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [_deep_trace_clean(v, depth + 1) for v in value]
    return value


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


# --------------------------------------------------------------------------------------
# value objects
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ApiResultPointer:
    """Status plus a hash of the (cleaned) last API result: L1 points at data, never holds it."""

    status: str
    data_sha256: str


@dataclass(frozen=True, slots=True)
class TraceItem:
    """One half of a tool_call/tool_result pair. ``payload`` is cleaned canonical JSON."""

    kind: Literal["tool_call", "tool_result"]
    name: str
    payload: str
    ts: float
    call_id: str
    status: str | None = None  # results only


@dataclass(frozen=True, slots=True)
class OffloadedPayload:
    """A trace payload that went to L2: its key, and sha256/size of its cleaned JSON."""

    l2_key: str
    sha256: str
    bytes: int


@dataclass(frozen=True, slots=True)
class TraceOffload:
    """Where trace payloads over ``max_bytes`` (cleaned, canonical JSON, UTF-8) go.

    ``store(ident, cleaned_value)`` writes the value to L2 and returns its key; ``ident`` is
    the call id for a result and ``<call id>.args`` for arguments. ``stored`` records what
    went out (ident -> :class:`OffloadedPayload`) for the caller that built the offload.
    """

    max_bytes: int
    store: Callable[[str, Any], str]
    stored: dict[str, OffloadedPayload] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AuthValues:
    """An opened :class:`AuthContext`: plain values, for the call that needs them only."""

    agent_id: str
    scopes: tuple[str, ...]
    token_sha256: str = field(repr=False)
    org: str


# The key that keeps auth contexts encrypted in this process's memory: random per process,
# never written anywhere. What this does and does not protect against: docs/security.md.
_AUTH_KEY = AESGCM.generate_key(bit_length=256)
_AUTH_AAD = b"ctx-auth-context/v1"


class AuthContext:
    """Who the agent acts for. Holds a token *hash*, never a token; refuses persistence.

    Kept encrypted in memory (AES-GCM under a random per-process key): the object holds only
    ciphertext, and each attribute read (``agent_id``, ``scopes``, ``token_sha256``, ``org``)
    or :meth:`open` decrypts for that call, so the values are in plaintext only while the code
    that needs them runs. Kept apart from the rest of the state: excluded from ``repr`` and
    equality of :class:`SessionState`; its own repr shows the agent id and scopes only.
    """

    __slots__ = ("_box",)
    _box: bytes

    def __init__(
        self,
        agent_id: str,
        scopes: tuple[str, ...] = (),
        token_sha256: str = "",
        org: str = DEFAULT_ORG,
    ) -> None:
        plain = json.dumps([agent_id, list(scopes), token_sha256, org]).encode()
        nonce = os.urandom(12)
        box = nonce + AESGCM(_AUTH_KEY).encrypt(nonce, plain, _AUTH_AAD)
        object.__setattr__(self, "_box", box)

    def open(self) -> AuthValues:
        """The values, decrypted now (keep the result no longer than the call needs it)."""
        box = self._box
        agent_id, scopes, token_sha256, org = json.loads(
            AESGCM(_AUTH_KEY).decrypt(box[:12], box[12:], _AUTH_AAD)
        )
        return AuthValues(agent_id, tuple(scopes), token_sha256, org)

    @property
    def agent_id(self) -> str:
        return self.open().agent_id

    @property
    def scopes(self) -> tuple[str, ...]:
        return self.open().scopes

    @property
    def token_sha256(self) -> str:
        return self.open().token_sha256

    @property
    def org(self) -> str:
        """The organisation the agent acts for: from its API key, never from a request body.
        Every user-keyed record the session reaches is the user's *in this organisation*."""
        return self.open().org

    @classmethod
    def from_token(
        cls, agent_id: str, token: str, scopes: tuple[str, ...] = (), *, org: str = DEFAULT_ORG
    ) -> AuthContext:
        """Hash ``token`` right away so the raw credential never enters the state."""
        return cls(agent_id, tuple(scopes), hashlib.sha256(token.encode()).hexdigest(), org)

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AuthContext):
            return NotImplemented
        return self.open() == other.open()

    def __hash__(self) -> int:
        return hash(self.open())

    def __repr__(self) -> str:
        v = self.open()
        return f"AuthContext(agent_id={v.agent_id!r}, scopes={v.scopes!r})"

    __reduce__ = _refuse
    __reduce_ex__ = _refuse
    __getstate__ = _refuse
    __deepcopy__ = _refuse


ANONYMOUS = AuthContext(agent_id="anonymous")

# Set while a method of SessionState builds its successor from already-cleaned parts, so
# __post_init__ can skip the (full) re-clean. Any other construction re-cleans everything.
_TRUSTED_BUILD: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "ctx_l1_trusted_build", default=False
)

_IDENTITY_FIELDS = frozenset({"session_id", "user_id", "start_time", "gateway", "auth_context"})
_ADVANCE_FIELDS = frozenset(
    {"current_step", "last_device_id", "last_api_result", "user_query", "shared_state_ref"}
)
_DEVICE_PREFIX = re.compile(r"[A-Za-z]+")


@dataclass(frozen=True, slots=True)
class SessionState:
    """The agent's L1 state. Build it with :meth:`start`; change it with the methods below.

    ``gateway`` and ``auth_context`` are keyword-only, hidden from ``repr`` and ignored by
    equality: two states are equal when what the agent *knows* is equal.
    """

    session_id: str
    user_id: str
    start_time: float
    user_query: str
    current_step: int = 0
    last_device_id: str | None = None
    last_api_result: ApiResultPointer | None = None
    trace: tuple[TraceItem, ...] = ()
    shared_state_ref: int | None = None
    gateway: Gateway = field(kw_only=True, repr=False, compare=False)
    auth_context: AuthContext = field(default=ANONYMOUS, kw_only=True, repr=False, compare=False)
    offload: TraceOffload | None = field(default=None, kw_only=True, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.gateway, Gateway):
            raise ContextError(
                "SessionState needs a Gateway (gateway=...): every value entering L1 is "
                "cleaned by it; build the state with SessionState.start(..., gateway=gw)"
            )
        if not isinstance(self.auth_context, AuthContext):
            raise ContextError("SessionState.auth_context must be an AuthContext")
        if self.offload is not None and not isinstance(self.offload, TraceOffload):
            raise ContextError("SessionState.offload must be a TraceOffload or None")
        if not isinstance(self.current_step, int) or self.current_step < 0:
            raise ContextError(
                f"SessionState.current_step must be a non-negative int, got {self.current_step!r}"
            )
        if self.last_api_result is not None and not isinstance(
            self.last_api_result, ApiResultPointer
        ):
            raise ContextError("SessionState.last_api_result must be an ApiResultPointer or None")
        if not isinstance(self.trace, tuple) or not all(
            isinstance(i, TraceItem) for i in self.trace
        ):
            raise ContextError("SessionState.trace must be a tuple of TraceItem")
        if len(self.trace) > 2 * TRACE_PAIRS:
            raise ContextError(f"SessionState.trace holds at most {TRACE_PAIRS} pairs")
        _check_ref(self.shared_state_ref, "SessionState.shared_state_ref")
        if _TRUSTED_BUILD.get():
            return
        # Untrusted construction (direct call or an outside dataclasses.replace): clean all.
        gw = self.gateway
        where = "L1.state"
        object.__setattr__(self, "user_query", gw.clean_text(self.user_query, where=where))
        if self.last_device_id is not None:
            object.__setattr__(
                self, "last_device_id", gw.clean_text(self.last_device_id, where=where)
            )
        cleaned = []
        for item in self.trace:
            name = gw.clean_text(clean_trace_text(item.name), where="L1.trace")
            payload = gw.clean_text(clean_trace_text(item.payload), where="L1.trace")
            if name != item.name or payload != item.payload:  # else the item stays as it is
                item = dataclasses.replace(item, name=name, payload=payload)
            cleaned.append(item)
        object.__setattr__(self, "trace", tuple(cleaned))

    # ---- persistence refusal ------------------------------------------------------------
    __reduce__ = _refuse
    __reduce_ex__ = _refuse
    __getstate__ = _refuse
    __setstate__ = _refuse
    __deepcopy__ = _refuse

    def __copy__(self) -> SessionState:
        """A shallow copy of an immutable in-process object is the object itself."""
        return self

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        session_id: str,
        user_id: str,
        user_query: str,
        *,
        gateway: Gateway,
        auth: AuthContext | None = None,
        start_time: float | None = None,
    ) -> SessionState:
        """A fresh state for a new session; the user query is cleaned by the gateway."""
        if not isinstance(session_id, str) or not session_id.strip():
            raise ContextError("SessionState.start: session_id must be a non-empty string")
        return cls(
            session_id=session_id,
            user_id=canonical_user_id(user_id),
            start_time=time.time() if start_time is None else float(start_time),
            user_query=user_query,
            gateway=gateway,
            auth_context=auth or ANONYMOUS,
        )

    def _successor(self, **changes: Any) -> SessionState:
        token = _TRUSTED_BUILD.set(True)
        try:
            return dataclasses.replace(self, **changes)
        finally:
            _TRUSTED_BUILD.reset(token)

    # ---- changes ------------------------------------------------------------------------
    def advance(self, **changes: Any) -> SessionState:
        """A new state with ``changes`` applied (current_step, last_device_id, user_query,
        last_api_result, shared_state_ref). Identity fields and the trace cannot be changed
        here."""
        bad = set(changes) - _ADVANCE_FIELDS
        if bad:
            fixed = sorted(bad & _IDENTITY_FIELDS)
            hint = (
                f"{', '.join(fixed)} identify the session and never change; start a new one"
                if fixed
                else "use record_tool_call/record_tool_result for the trace"
                if "trace" in bad
                else f"allowed: {', '.join(sorted(_ADVANCE_FIELDS))}"
            )
            raise ContextError(f"advance(): cannot change {', '.join(sorted(bad))}; {hint}")
        gw = self.gateway
        if "user_query" in changes:
            changes["user_query"] = gw.clean_text(str(changes["user_query"]), where="L1.state")
        if changes.get("last_device_id") is not None:
            changes["last_device_id"] = gw.clean_text(
                str(changes["last_device_id"]), where="L1.state"
            )
        ptr = changes.get("last_api_result")
        if ptr is not None and not isinstance(ptr, ApiResultPointer):
            raise ContextError("advance(): last_api_result must be an ApiResultPointer or None")
        step = changes.get("current_step", self.current_step)
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ContextError(f"advance(): current_step must be a non-negative int, got {step!r}")
        if "shared_state_ref" in changes:
            _check_ref(changes["shared_state_ref"], "advance(): shared_state_ref")
        return self._successor(**changes)

    def _clean_payload(self, value: Any, ident: str) -> tuple[str, str]:
        """The trace payload (cleaned canonical JSON, or a pointer to its L2 copy when it is
        over the offload's size) and the sha256 of the cleaned JSON."""
        cleaned = self.gateway.clean(_deep_trace_clean(value), where="L1.trace")
        payload = _canonical_json(cleaned)
        raw = payload.encode()
        digest = hashlib.sha256(raw).hexdigest()
        off = self.offload
        if off is not None and len(raw) > off.max_bytes:
            ref = OffloadedPayload(off.store(ident, cleaned), digest, len(raw))
            off.stored[ident] = ref
            payload = _canonical_json(
                {"l2_key": ref.l2_key, "sha256": ref.sha256, "bytes": ref.bytes}
            )
        return payload, digest

    def record_tool_call(self, name: str, args: Any, *, call_id: str) -> SessionState:
        """Append an open pair; evicts the oldest pair(s) beyond :data:`TRACE_PAIRS`."""
        if not call_id:
            raise ContextError("record_tool_call: call_id must be a non-empty string")
        if any(i.call_id == call_id for i in self.trace):
            raise ContextError(f"record_tool_call: call_id {call_id!r} is already in the trace")
        item = TraceItem(
            kind="tool_call",
            name=self.gateway.clean_text(clean_trace_text(str(name)), where="L1.trace"),
            payload=self._clean_payload(args, f"{call_id}.args")[0],
            ts=time.time(),
            call_id=call_id,
        )
        return self._successor(trace=_bound_pairs((*self.trace, item), TRACE_PAIRS))

    def record_tool_result(self, call_id: str, result: Any, *, status: str) -> SessionState:
        """Close the open pair ``call_id`` and point ``last_api_result`` at the result."""
        call = next((i for i in self.trace if i.call_id == call_id and i.kind == "tool_call"), None)
        if call is None:
            raise ContextError(
                f"record_tool_result: no tool_call {call_id!r} in the trace (never recorded, "
                f"or evicted while open after {TRACE_PAIRS} newer calls)"
            )
        if any(i.call_id == call_id and i.kind == "tool_result" for i in self.trace):
            raise ContextError(f"record_tool_result: call {call_id!r} already has a result")
        payload, digest = self._clean_payload(result, call_id)
        clean_status = self.gateway.clean_text(str(status), where="L1.trace")
        item = TraceItem(
            kind="tool_result",
            name=call.name,
            payload=payload,
            ts=time.time(),
            call_id=call_id,
            status=clean_status,
        )
        pointer = ApiResultPointer(status=clean_status, data_sha256=digest)
        return self._successor(trace=(*self.trace, item), last_api_result=pointer)

    def drop_last_trace_items(self, n: int) -> SessionState:
        """Drop the newest ``n`` *pairs* (a pair is never split, so ``n`` counts pairs)."""
        if n < 0:
            raise ContextError(f"drop_last_trace_items: n must be >= 0, got {n}")
        order = _pair_order(self.trace)
        keep = set(order[: max(0, len(order) - n)])
        return self._successor(trace=tuple(i for i in self.trace if i.call_id in keep))

    def keep_last_trace_items(self, n: int) -> SessionState:
        """Keep only the newest ``n`` *pairs* (e.g. on context_overflow)."""
        if n < 0:
            raise ContextError(f"keep_last_trace_items: n must be >= 0, got {n}")
        return self._successor(trace=_bound_pairs(self.trace, n))

    # ---- derived ------------------------------------------------------------------------
    @property
    def device_prefix(self) -> str | None:
        """Leading letters of ``last_device_id``, upper-cased ("pump-0042" -> "PUMP").

        The router uses it as the default L3 section filter.
        """
        if not self.last_device_id:
            return None
        m = _DEVICE_PREFIX.match(self.last_device_id)
        return m.group(0).upper() if m else None

    @property
    def open_calls(self) -> tuple[str, ...]:
        """call_ids of pairs still waiting for their result, oldest first."""
        closed = {i.call_id for i in self.trace if i.kind == "tool_result"}
        return tuple(
            i.call_id for i in self.trace if i.kind == "tool_call" and i.call_id not in closed
        )

    @property
    def trace_pairs(self) -> int:
        return sum(1 for i in self.trace if i.kind == "tool_call")


# ``dataclass(frozen=True, slots=True)`` on CPython before 3.11.4 replaces a class's own
# ``__getstate__``/``__setstate__`` with its pickling helpers (fixed upstream in gh-104035).
# Set the refusal again after the decorator ran, so every 3.11 patch level refuses alike.
for _cls in (AuthContext, SessionState):
    for _name in ("__getstate__", "__setstate__"):
        setattr(_cls, _name, _refuse)
del _cls, _name


def _check_ref(ref: object, what: str) -> None:
    """A task-contract version: a non-negative int, or None (never looked)."""
    if ref is not None and (not isinstance(ref, int) or isinstance(ref, bool) or ref < 0):
        raise ContextError(f"{what} must be a non-negative int (a contract version) or None")


def _pair_order(trace: tuple[TraceItem, ...]) -> list[str]:
    """call_ids in the order their calls were recorded (oldest first)."""
    return [i.call_id for i in trace if i.kind == "tool_call"]


def _bound_pairs(trace: tuple[TraceItem, ...], n: int) -> tuple[TraceItem, ...]:
    order = _pair_order(trace)
    if len(order) <= n:
        return trace
    keep = set(order[len(order) - n :]) if n else set()
    return tuple(i for i in trace if i.call_id in keep)


# --------------------------------------------------------------------------------------
# per-context binding
# --------------------------------------------------------------------------------------

_CURRENT: contextvars.ContextVar[SessionState | None] = contextvars.ContextVar(
    "ctx_current_session", default=None
)


def current_session() -> SessionState:
    """The session bound to this thread/task; :class:`ContextError` when none is bound."""
    state = _CURRENT.get()
    if state is None:
        raise ContextError(
            "no L1 session is bound in this context; wrap the work in "
            "`with bind_session(state):` (each thread/asyncio task binds its own)"
        )
    return state


@contextmanager
def bind_session(state: SessionState) -> Iterator[SessionState]:
    """Bind ``state`` as the current session for this context, restoring the old on exit."""
    if not isinstance(state, SessionState):
        raise ContextError(f"bind_session expects a SessionState, got {type(state).__name__}")
    token = _CURRENT.set(state)
    try:
        yield state
    finally:
        _CURRENT.reset(token)


def update_current(new: SessionState) -> None:
    """Replace the bound state with its successor ``new`` (same session only)."""
    old = current_session()
    if not isinstance(new, SessionState):
        raise ContextError(f"update_current expects a SessionState, got {type(new).__name__}")
    if new.session_id != old.session_id:
        raise ContextError(
            f"update_current: bound session is {old.session_id!r}, refusing to swap in "
            f"{new.session_id!r}; use bind_session for another session"
        )
    _CURRENT.set(new)
