"""Lifecycle events: what happens to L1, L2 and L3 when a session moves through its life.

An agent framework reports events; this module applies their effects so every session decays
and recovers the same way. The effects are data (:data:`EFFECTS`, rendered into the README),
readable by humans and by the health report, and each one is implemented by exactly one
handler below.

The table is the contract; in short: ``session_start`` writes contract version 1;
``tool_call`` appends a trace pair and stores the result in L2; ``user_correction`` drops
the newest 3 pairs and writes a corrected contract version; ``user_message`` runs the
correction rule (:func:`context_core.lifecycle.corrections.detect_correction`: a negation or
correction
cue, a value contradicting the contract, confidence above ``correction_min_confidence``) and,
when it holds, applies ``user_correction`` with the detected fields (the effects report the
detection either way); ``context_overflow`` trims the trace and shortens low-priority TTLs;
``session_timeout`` clears the trace and deletes every L2 key but the contract (marked
``expired``, kept, resumed by the next activity) and its history; ``goal_achieved`` clears
the trace, archives the contract as ``completed``, writes ``last_completed_task`` to the
user's preferences, upserts confirmed answers to L3 (:meth:`LifecycleManager.confirm_answers`)
and lets the other L2 keys expire after a grace period; ``error_recovery`` keeps the newest
pair and locks the contract, ``recovery_complete`` unlocks it.

Compliance (when the manager has a ``compliance`` store, :mod:`context_core.access.compliance`):
``session_start`` reads the effective profile of the session's org and user once and keeps a
snapshot in L2 (kind ``compliance``, under the session's hash tag; effects ``compliance``);
``tool_call`` refuses a tool outside the snapshot's ``approved_tools`` before anything is
applied (:class:`~context_core.access.compliance.ToolNotApprovedError`), and confirmed answers
(``goal_achieved``, :meth:`LifecycleManager.confirm_answers`) holding one of its
``blocked_keywords`` are refused (:class:`~context_core.access.compliance.BlockedKeywordError`). A
snapshot gone (expired, timed out) is read again from the store. The org is the caller's
(``org_id``: the service passes the agent key's ``org``), ``"default"`` when none is given.

Triggers computed by the platform, not the client:

* **Activity**: every event except ``session_timeout`` and ``goal_achieved`` touches the
  session (:meth:`SessionMemory.touch`): the contract's 2 h TTL slides, an expired contract
  resumes, and the session's last activity is recorded for the idle sweep.
* **Overflow**: after every event that leaves a trace, the trace's tokens are counted (the
  embedding model's tokenizer, ``count_tokens``; else the heuristic of
  :mod:`context_core.lifecycle.tokens`). Over ``max_trace_tokens`` (2000), the oldest pairs are
  evicted
  until it fits and low-priority TTLs are shortened, as ``context_overflow`` does; the
  effects say so under ``overflow``.
* **Idle timeout**: :meth:`LifecycleManager.sweep_idle` times out every session untouched
  for ``idle_s`` (90 s) with ``session_timeout``'s L2 semantics; the service runs it
  periodically (the L1 state lives with the client, so the caller marks it).

Hot answers record the agent that wrote them (from the session's server-set auth context,
never from the payload) and land in that agent's private scope unless the agent holds
``write`` on the answer's ``namespace`` (checked with the manager's ``namespaces`` registry).
An answer's ``source`` is only a claim (stored as ``claimed_source``); the hot point's source
is server-made.

"Low priority" L2 data is what can be fetched again (raw API responses, sensor series); step
results, the contract and pending tasks are the session's own work and keep their TTLs.

TTL changes and deletion go through the session's own view (:meth:`SessionMemory.expire_all`
with ``only_shorten=True``, i.e. ``EXPIRE ... LT``, and :meth:`SessionMemory.timeout`), which
find the keys in the session's key index: a TTL is only ever shortened, no value is read,
nothing here builds a key pattern or scans the keyspace, so an event costs O(keys of this
session) whatever else lives in Redis.
"""

from __future__ import annotations

import functools
import inspect
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from context_core import defaults
from context_core.access.subjects import subject_id
from context_core.access.subjects import subject_key as load_subject_key
from context_core.errors import (
    ConfigError,
    ContextError,
    UnknownEventError,
    VersionConflictError,
)
from context_core.lifecycle.corrections import DEFAULT_MIN_CONFIDENCE, detect_correction
from context_core.lifecycle.tokens import TraceTokenCounter, pair_tokens
from context_core.working_memory.keys import check_sid

if TYPE_CHECKING:
    from context_core.access.compliance import ComplianceStore, EffectiveProfile
    from context_core.config import Settings
    from context_core.gateway.sanitize import Gateway
    from context_core.knowledge.memory import AclSource, KnowledgeMemory
    from context_core.session.state import AuthContext, SessionState
    from context_core.working_memory import SessionMemory, WorkingMemory

__all__ = [
    "EFFECTS",
    "LAST_COMPLETED_TASK",
    "EventEffect",
    "EventResult",
    "LifecycleEvent",
    "LifecycleManager",
    "payload_parameters",
]

#: The user preference ``goal_achieved`` writes (``pref:{<uid>}:last_completed_task``).
LAST_COMPLETED_TASK = "last_completed_task"


class LifecycleEvent(StrEnum):
    SESSION_START = "session_start"
    TOOL_CALL = "tool_call"
    USER_CORRECTION = "user_correction"
    CONTEXT_OVERFLOW = "context_overflow"
    SESSION_TIMEOUT = "session_timeout"
    GOAL_ACHIEVED = "goal_achieved"
    ERROR_RECOVERY = "error_recovery"
    USER_MESSAGE = "user_message"
    RECOVERY_COMPLETE = "recovery_complete"


#: Events that end the session's activity: no touch, no overflow check (the trace is cleared).
_ENDING = frozenset({LifecycleEvent.SESSION_TIMEOUT, LifecycleEvent.GOAL_ACHIEVED})


@dataclass(frozen=True, slots=True)
class EventEffect:
    """The documented effect of one event on each layer."""

    event: LifecycleEvent
    l1: str
    l2: str
    l3: str


EFFECTS: Mapping[LifecycleEvent, EventEffect] = MappingProxyType(
    {
        e.event: e
        for e in (
            EventEffect(
                LifecycleEvent.SESSION_START,
                "new SessionState",
                "task contract version 1 with the goal (lives 2 h from the last activity, "
                "history 30 d); activity recorded",
                "-",
            ),
            EventEffect(
                LifecycleEvent.TOOL_CALL,
                "call/result pair appended to the trace; current_step advances",
                "response stored under the api key, result under step:<n>, series points "
                "added; contract TTL refreshed",
                "-",
            ),
            EventEffect(
                LifecycleEvent.USER_CORRECTION,
                "newest 3 trace pairs dropped",
                "new contract version marked corrected",
                "-",
            ),
            EventEffect(
                LifecycleEvent.CONTEXT_OVERFLOW,
                "trace trimmed to the newest N pairs; also automatic after any event that "
                "leaves the trace over 2000 tokens (embedding tokenizer): oldest pairs evicted",
                "api and series TTLs shortened (low priority)",
                "-",
            ),
            EventEffect(
                LifecycleEvent.SESSION_TIMEOUT,
                "trace cleared",
                "every key deleted except the task contract (marked expired, kept; the next "
                "activity resumes it) and its history; also run by the idle sweep (90 s)",
                "-",
            ),
            EventEffect(
                LifecycleEvent.GOAL_ACHIEVED,
                "trace cleared",
                "contract archived to its history as completed; last_completed_task written "
                "to the user's preferences; other keys expire after the grace period",
                "confirmed answers upserted to hot_knowledge (trust-scoped)",
            ),
            EventEffect(
                LifecycleEvent.ERROR_RECOVERY,
                "only the newest trace pair kept",
                "task contract locked against writes",
                "-",
            ),
            EventEffect(
                LifecycleEvent.USER_MESSAGE,
                "if the message corrects the contract: newest 3 trace pairs dropped; "
                "else unchanged",
                "if it corrects the contract (negation + value contradicting it, confidence "
                "> 0.6): new contract version with the detected fields, marked corrected",
                "-",
            ),
            EventEffect(
                LifecycleEvent.RECOVERY_COMPLETE,
                "unchanged",
                "task contract unlocked",
                "-",
            ),
        )
    }
)

LOW_PRIORITY_KINDS = ("api", "series")


@dataclass(frozen=True, slots=True)
class EventResult:
    """The new L1 state plus what the event did (keys written, expired, hot point ids)."""

    event: LifecycleEvent
    state: SessionState
    effects: dict[str, Any] = field(default_factory=dict)


@functools.lru_cache(maxsize=64)
def _signature(handler: Callable[..., Any]) -> inspect.Signature:
    """The handler's signature (checked against every event's payload; computed once)."""
    return inspect.signature(handler)


_P = inspect.Parameter


@functools.lru_cache(maxsize=64)
def _payload_shape(
    handler: Callable[..., Any],
) -> tuple[str, frozenset[str], frozenset[str], bool] | None:
    """What a handler takes after the state, worked out once: the state's parameter name,
    the keyword names it accepts, those it requires, and whether it takes ``**kwargs``.
    None for a signature the quick check does not cover (``Signature.bind`` decides)."""
    params = list(_signature(handler).parameters.values())
    if not params or params[0].kind not in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD):
        return None
    names: set[str] = set()
    required: set[str] = set()
    var_kw = False
    for p in params[1:]:
        if p.kind is _P.VAR_KEYWORD:
            var_kw = True
        elif p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY):
            names.add(p.name)
            if p.default is _P.empty:
                required.add(p.name)
        else:  # more positional parameters
            return None
    return params[0].name, frozenset(names), frozenset(required), var_kw


def _payload_fits(handler: Callable[..., Any], payload: Mapping[str, Any]) -> bool:
    """Whether ``handler(state, **payload)`` binds, without binding it (``Signature.bind``
    per event was ~5 % of an event's CPU); False also when unsure, so the caller binds."""
    shape = _payload_shape(handler)
    if shape is None:
        return False
    first, names, required, var_kw = shape
    keys = payload.keys()
    if first in keys or not required <= keys:
        return False
    return var_kw or keys <= names


class LifecycleManager:
    """Applies lifecycle events. ``handle`` returns the new state; ``apply`` adds effects.

    Every L2 effect goes through ``wm.session(sid)`` (and ``wm.preferences(org, uid)``): the
    manager never touches Redis itself. ``count_tokens`` is the embedding model's token
    counter (``Encoder.count_tokens``); None uses the heuristic of
    :mod:`context_core.lifecycle.tokens`.
    """

    def __init__(
        self,
        *,
        wm: WorkingMemory,
        gateway: Gateway,
        knowledge: KnowledgeMemory | None = None,
        namespaces: AclSource | None = None,
        overflow_keep_pairs: int = 3,
        low_priority_ttl_s: int = 60,
        goal_grace_s: int = 60,
        correction_drop_pairs: int = 3,
        count_tokens: Callable[[str], int] | None = None,
        max_trace_tokens: int = defaults.L1_MAX_TRACE_TOKENS,
        correction_min_confidence: float = DEFAULT_MIN_CONFIDENCE,
        compliance: ComplianceStore | None = None,
        subject_key: bytes | None = None,
    ) -> None:
        for name, v in (
            ("overflow_keep_pairs", overflow_keep_pairs),
            ("low_priority_ttl_s", low_priority_ttl_s),
            ("goal_grace_s", goal_grace_s),
            ("correction_drop_pairs", correction_drop_pairs),
        ):
            if v < 0 or (name.endswith("_s") and v == 0):
                raise ConfigError(f"LifecycleManager: {name} must be positive, got {v}")
        if max_trace_tokens <= 0:
            raise ConfigError(
                f"LifecycleManager: max_trace_tokens (CTX_L1_MAX_TRACE_TOKENS) must be "
                f"positive, got {max_trace_tokens}"
            )
        if not 0.0 <= correction_min_confidence <= 1.0:
            raise ConfigError(
                "LifecycleManager: correction_min_confidence (CTX_CORRECTION_MIN_CONFIDENCE) "
                f"must be in [0, 1], got {correction_min_confidence}"
            )
        self.wm = wm
        self.gateway = gateway
        self.knowledge = knowledge
        self.namespaces = namespaces
        # names the user of a confirmed answer in L3 by a keyed hash (erasure finds it)
        self.subject_key = subject_key
        self.compliance = compliance
        self.overflow_keep_pairs = overflow_keep_pairs
        self.low_priority_ttl_s = low_priority_ttl_s
        self.goal_grace_s = goal_grace_s
        self.correction_drop_pairs = correction_drop_pairs
        self.max_trace_tokens = int(max_trace_tokens)
        self.correction_min_confidence = float(correction_min_confidence)
        self.tokens = TraceTokenCounter(count_tokens)
        self._handlers: dict[LifecycleEvent, Callable[..., EventResult]] = {
            LifecycleEvent.SESSION_START: self._session_start,
            LifecycleEvent.TOOL_CALL: self._tool_call,
            LifecycleEvent.USER_CORRECTION: self._user_correction,
            LifecycleEvent.CONTEXT_OVERFLOW: self._context_overflow,
            LifecycleEvent.SESSION_TIMEOUT: self._session_timeout,
            LifecycleEvent.GOAL_ACHIEVED: self._goal_achieved,
            LifecycleEvent.ERROR_RECOVERY: self._error_recovery,
            LifecycleEvent.USER_MESSAGE: self._user_message,
            LifecycleEvent.RECOVERY_COMPLETE: self._recovery_complete,
        }

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        wm: WorkingMemory,
        gateway: Gateway,
        knowledge: KnowledgeMemory | None = None,
        namespaces: AclSource | None = None,
        count_tokens: Callable[[str], int] | None = None,
        compliance: ComplianceStore | None = None,
    ) -> LifecycleManager:
        """A manager with the trace budget and correction threshold of ``settings``
        (``CTX_L1_MAX_TRACE_TOKENS``, ``CTX_CORRECTION_MIN_CONFIDENCE``); pass the encoder's
        ``count_tokens`` so the budget is counted in the embedding model's tokens."""
        return cls(
            wm=wm,
            gateway=gateway,
            knowledge=knowledge,
            namespaces=namespaces,
            count_tokens=count_tokens,
            max_trace_tokens=settings.l1_max_trace_tokens,
            correction_min_confidence=settings.correction_min_confidence,
            compliance=compliance,
            subject_key=load_subject_key(settings),
        )

    # --- dispatch ---------------------------------------------------------------------
    @staticmethod
    def parse(event: str | LifecycleEvent) -> LifecycleEvent:
        try:
            return LifecycleEvent(event)
        except ValueError:
            valid = ", ".join(e.value for e in LifecycleEvent)
            raise UnknownEventError(
                f"unknown lifecycle event {event!r}; valid events: {valid}"
            ) from None

    def apply(
        self, event: str | LifecycleEvent, state: SessionState | None, **payload: Any
    ) -> EventResult:
        ev = self.parse(event)
        if state is None and ev is not LifecycleEvent.SESSION_START:
            raise ContextError(f"{ev.value} needs the session state; only session_start starts one")
        handler = self._handlers[ev]
        if not _payload_fits(handler, payload):  # the exact reason, from the signature
            sig = _signature(handler)
            try:
                sig.bind(state, **payload)
            except TypeError as e:
                accepted = [p for p in sig.parameters if p != "state"]
                raise ContextError(
                    f"{ev.value}: bad payload ({e}); accepted: {', '.join(accepted) or 'none'}"
                ) from e
        result = handler(state, **payload)
        if ev not in _ENDING:
            result = self._overflow_trigger(result)
            self._sm(result.state).touch()
        return result

    def handle(
        self, event: str | LifecycleEvent, state: SessionState | None, **payload: Any
    ) -> SessionState:
        return self.apply(event, state, **payload).state

    # --- helpers ----------------------------------------------------------------------
    def _sm(self, state: SessionState) -> SessionMemory:
        return self.wm.session(state.session_id)

    def trace_tokens(self, state: SessionState) -> int:
        """Tokens of ``state``'s L1 trace, as the overflow trigger counts them."""
        return self.tokens.trace(state)

    def compliance_snapshot(
        self, state: SessionState, org_id: str | None = None
    ) -> EffectiveProfile | None:
        """The session's compliance snapshot (L2); read again from the store and kept when it
        is gone. None without a compliance store."""
        from context_core.access.compliance import load_snapshot, store_snapshot

        if self.compliance is None:
            return None
        sm = self._sm(state)
        snap = load_snapshot(sm)
        if snap is None:
            snap = self.compliance.effective(org_id or state.auth_context.org, state.user_id)
            store_snapshot(sm, snap)
        return snap

    def _overflow_trigger(self, result: EventResult) -> EventResult:
        """Evict the oldest pairs while the trace is over ``max_trace_tokens``, and shorten
        the low-priority TTLs as ``context_overflow`` does."""
        state = result.state
        pairs = pair_tokens(state, self.tokens)
        before = sum(t for _, t in pairs)
        if before <= self.max_trace_tokens:
            return result
        evict, left = 0, before
        while left > self.max_trace_tokens and evict < len(pairs):
            left -= pairs[evict][1]
            evict += 1
        new = state.keep_last_trace_items(len(pairs) - evict)
        ttl = self.low_priority_ttl_s
        shortened = self._sm(state).expire_all(ttl, only_shorten=True, kinds=LOW_PRIORITY_KINDS)
        overflow = {
            "triggered": True,
            "tokens_before": before,
            "tokens_after": self.tokens.trace(new),
            "evicted_pairs": evict,
            "max_tokens": self.max_trace_tokens,
            "counted_with": self.tokens.source,
            "shortened": shortened,
            "ttl_s": ttl,
        }
        return EventResult(result.event, new, {**result.effects, "overflow": overflow})

    # --- handlers ---------------------------------------------------------------------
    def _session_start(
        self,
        state: SessionState | None,
        *,
        session_id: str,
        user_id: str,
        user_query: str,
        auth: AuthContext | None = None,
        contract: Mapping[str, Any] | None = None,
        device_id: str | None = None,
        org_id: str | None = None,
    ) -> EventResult:
        from context_core.access.compliance import store_snapshot
        from context_core.session.state import SessionState

        if state is not None:
            raise ContextError("session_start: a session is already running (state given)")
        new = SessionState.start(session_id, user_id, user_query, gateway=self.gateway, auth=auth)
        if device_id:
            new = new.advance(last_device_id=device_id)
        sm = self._sm(new)
        compliance: dict[str, Any] = {}
        if self.compliance is not None:  # the profile snapshot, read once (see module doc)
            snap = self.compliance.effective(org_id or new.auth_context.org, new.user_id)
            compliance = {
                "org_id": snap.org_id,
                "profile_version": snap.version,
                "snapshot_key": store_snapshot(sm, snap),
            }
        fields = {"goal": new.user_query, **dict(contract or {})}
        try:  # a new session has no contract yet: version 0, no read first
            c = sm.update_contract(fields, expected_version=0)
        except VersionConflictError as e:  # an id started again: merge into the live one
            c = sm.update_contract(fields, expected_version=int(e.current_version or 0))
        new = new.advance(shared_state_ref=c.version)  # the contract version this L1 acted on
        effects: dict[str, Any] = {"contract_version": c.version, "contract": c.fields}
        if compliance:
            effects["compliance"] = compliance
        return EventResult(LifecycleEvent.SESSION_START, new, effects)

    def _tool_call(
        self,
        state: SessionState,
        *,
        name: str,
        args: Mapping[str, Any],
        result: Any,
        status: str = "ok",
        call_id: str | None = None,
        store_step: bool = True,
        advance: bool = True,
        device_id: str | None = None,
        series: Mapping[str, Sequence[tuple[float, float]]] | None = None,
        ttl_s: int | None = None,
        org_id: str | None = None,
        snapshot: EffectiveProfile | None = None,
    ) -> EventResult:
        # ``snapshot``: the session's compliance snapshot as the caller already read it (the
        # service reads it with its access check,
        # :func:`context_core.access.compliance.snapshot_op`)
        snap = snapshot if snapshot is not None else self.compliance_snapshot(state, org_id)
        if snap is not None:  # refused before anything is applied
            from context_core.access.compliance import check_tool

            check_tool(snap, name)
        cid = call_id or uuid.uuid4().hex[:12]
        new = state.record_tool_call(name, dict(args), call_id=cid)
        new = new.record_tool_result(cid, result, status=status)
        sm = self._sm(new)
        effects: dict[str, Any] = {"call_id": cid}
        effects["api_key"] = sm.put_api_response(name, dict(args), result, ttl_s=ttl_s)
        if store_step:
            fields = dict(result) if isinstance(result, Mapping) and result else {"result": result}
            fields = {str(k): v for k, v in fields.items() if not str(k).startswith("_")}
            fields.setdefault("tool", name)
            effects["step_key"] = sm.put_step_result(str(new.current_step), fields, ttl_s=ttl_s)
        for series_name, points in (series or {}).items():
            sm.add_series_points(series_name, [(ts, value) for ts, value in points])
            effects.setdefault("series", []).append(sm.key("series", series_name))
        changes: dict[str, Any] = {}
        if advance:
            changes["current_step"] = new.current_step + 1
        if device_id:
            changes["last_device_id"] = device_id
        if changes:
            new = new.advance(**changes)
        return EventResult(LifecycleEvent.TOOL_CALL, new, effects)

    def _user_correction(
        self,
        state: SessionState,
        *,
        fields: Mapping[str, Any],
        user_query: str | None = None,
    ) -> EventResult:
        sm = self._sm(state)
        current = sm.contract()
        c = sm.update_contract(fields, expected_version=current.version, corrected=True)
        before = state.trace_pairs
        new = state.drop_last_trace_items(self.correction_drop_pairs)
        new = new.advance(shared_state_ref=c.version)
        if user_query:
            new = new.advance(user_query=user_query)
        return EventResult(
            LifecycleEvent.USER_CORRECTION,
            new,
            {"contract_version": c.version, "dropped_pairs": before - new.trace_pairs},
        )

    def _user_message(self, state: SessionState, *, text: str) -> EventResult:
        if not isinstance(text, str):
            raise ContextError("user_message: text must be a string")
        contract = self._sm(state).contract()
        found = detect_correction(
            text, contract.fields, min_confidence=self.correction_min_confidence
        )
        effects: dict[str, Any] = {"correction": found.to_dict()}
        if not found.detected:
            return EventResult(LifecycleEvent.USER_MESSAGE, state, effects)
        applied = self._user_correction(state, fields=found.fields)
        return EventResult(
            LifecycleEvent.USER_MESSAGE, applied.state, {**effects, **applied.effects}
        )

    def _context_overflow(
        self,
        state: SessionState,
        *,
        keep_pairs: int | None = None,
        low_priority_ttl_s: int | None = None,
    ) -> EventResult:
        keep = self.overflow_keep_pairs if keep_pairs is None else keep_pairs
        new = state.keep_last_trace_items(keep)
        ttl = low_priority_ttl_s or self.low_priority_ttl_s
        shortened = self._sm(state).expire_all(ttl, only_shorten=True, kinds=LOW_PRIORITY_KINDS)
        return EventResult(
            LifecycleEvent.CONTEXT_OVERFLOW,
            new,
            {"kept_pairs": new.trace_pairs, "shortened": shortened, "ttl_s": ttl},
        )

    def _session_timeout(self, state: SessionState) -> EventResult:
        effects = self._sm(state).timeout()
        return EventResult(
            LifecycleEvent.SESSION_TIMEOUT, state.keep_last_trace_items(0), dict(effects)
        )

    def timeout_session(self, session_id: str) -> dict[str, Any]:
        """``session_timeout`` for a session whose L1 state is not at hand (the idle sweep):
        the L2 part only. Returns ``{"session_id", "deleted", "contract_version",
        "contract_status"}``; the caller owns clearing the L1 trace."""
        return {"session_id": session_id, **self.wm.session(session_id).timeout()}

    def sweep_idle(self, now: float | None = None, limit: int = 500) -> list[str]:
        """Time out every session whose last activity is older than ``wm.idle_s`` (at most
        ``limit`` per call, oldest first); returns their ids.

        A session touched between the listing and its timeout is left alone (its score is
        read again just before). An id in the activity set that is not a valid session id
        (a hand edit) is dropped from the set. Safe to run from several workers at once (a
        second timeout of the same session deletes nothing more), but the service runs one.
        """
        at = self.wm.now() if now is None else float(now)
        cutoff = at - self.wm.idle_s
        done: list[str] = []
        for sid in self.wm.idle_sessions(at, limit):
            try:
                check_sid(sid)
            except ContextError:
                self.wm.forget_activity(sid)
                continue
            last = self.wm.last_activity(sid)
            if last is None or last > cutoff:
                continue
            self.timeout_session(sid)
            done.append(sid)
        return done

    @staticmethod
    def _writer(state: SessionState) -> str | None:
        """The agent behind the session: its auth context, set by the server from the API
        key (never by the client). A state started without one writes as the system."""
        from context_core.session.state import ANONYMOUS

        auth = state.auth_context
        return None if auth is ANONYMOUS or not auth.agent_id else auth.agent_id

    def confirm_answers(
        self,
        state: SessionState,
        answers: Sequence[Mapping[str, Any]],
        *,
        org_id: str | None = None,
    ) -> list[dict[str, str]]:
        """Upsert user-confirmed answers to L3 ``hot_knowledge`` (``confirmed=True``), each
        cleaned by the gateway on the way and trust-scoped: written as the session's agent
        (from its server-set auth context), into that agent's private scope unless it holds
        ``write`` on the answer's ``namespace``. Returns ``[{"id": point_id, "scope":
        scope}]`` in answer order. Every answer is checked before any is written, also
        against the compliance snapshot's ``blocked_keywords`` (text and title;
        :class:`~context_core.access.compliance.BlockedKeywordError` naming the field and keyword;
        ``org_id`` is used only when the snapshot must be read again)."""
        from context_core.knowledge.memory import SYSTEM_SCOPE, resolve_hot_scope

        if answers and self.knowledge is None:
            raise ConfigError(
                "confirmed answers need knowledge memory (LifecycleManager(knowledge=))"
            )
        for a in answers:
            if not a.get("text"):
                raise ContextError("confirmed answers: every answer needs a non-empty 'text'")
        snap = self.compliance_snapshot(state, org_id) if answers else None
        if snap is not None and snap.blocked_keywords:
            from context_core.access.compliance import check_text

            for i, a in enumerate(answers):
                for f in ("text", "title"):
                    check_text(snap, str(a.get(f) or ""), ("answers", i, f))
        writer = self._writer(state)
        subject = None
        if self.subject_key is not None and answers:
            org = org_id or state.auth_context.org
            subject = subject_id(self.subject_key, org, state.user_id)
        out: list[dict[str, str]] = []
        for a in answers:
            assert self.knowledge is not None
            asked = a.get("namespace")
            scope = resolve_hot_scope(writer, str(asked) if asked else None, self.namespaces)
            shared = scope if scope != SYSTEM_SCOPE and ":" not in scope else None
            point_id = self.knowledge.upsert_hot(
                str(a["text"]),
                source=str(a.get("source") or ""),
                section=str(a.get("section") or state.device_prefix or "GENERAL"),
                title=str(a.get("title", "")),
                confirmed=True,
                written_by=writer,
                namespace=shared,
                namespaces=self.namespaces,
                subject=subject,
            )
            out.append({"id": point_id, "scope": scope})
        return out

    def _goal_achieved(
        self,
        state: SessionState,
        *,
        answers: Sequence[Mapping[str, Any]] = (),
        grace_s: int | None = None,
        org_id: str | None = None,
    ) -> EventResult:
        confirmed = self.confirm_answers(state, answers, org_id=org_id)
        sm = self._sm(state)
        c = sm.complete_contract()
        fields = dict(c.fields)
        task = {
            "session_id": state.session_id,
            "goal": fields.pop("goal", state.user_query),
            "contract": fields,
            "version": c.version,
            "completed_at": self.wm.now(),
        }
        org = org_id or state.auth_context.org
        pref = self.wm.preferences(org, state.user_id).set(LAST_COMPLETED_TASK, task)
        history = sm.key("contract", "history")
        grace = grace_s or self.goal_grace_s
        expiring = sm.expire_all(grace, only_shorten=True, keep=[history])
        self.wm.forget_activity(state.session_id)
        return EventResult(
            LifecycleEvent.GOAL_ACHIEVED,
            state.keep_last_trace_items(0),
            {
                "hot_ids": [a["id"] for a in confirmed],
                "hot_scopes": [a["scope"] for a in confirmed],
                "expiring": expiring,
                "contract_version": c.version,
                "contract_status": c.status if c.version else "none",
                LAST_COMPLETED_TASK: pref.value,
            },
        )

    def _error_recovery(self, state: SessionState) -> EventResult:
        new = state.keep_last_trace_items(1)
        self._sm(state).lock_contract()
        return EventResult(
            LifecycleEvent.ERROR_RECOVERY, new, {"kept_pairs": new.trace_pairs, "locked": True}
        )

    def _recovery_complete(self, state: SessionState) -> EventResult:
        sm = self._sm(state)
        sm.unlock_contract()
        return EventResult(
            LifecycleEvent.RECOVERY_COMPLETE,
            state,
            {"locked": False, "contract_version": sm.contract().version},
        )


def payload_parameters(event: str | LifecycleEvent) -> dict[str, bool]:
    """The payload ``event`` accepts: each keyword parameter of its handler
    (``LifecycleManager._<event>``), True when required.

    The handler's signature is the one declaration of an event's payload: :meth:`apply`
    checks payloads against it, and the service's request models (one per event) are checked
    against it, and :data:`EFFECTS` against the events, by tests/test_wire.py."""
    ev = LifecycleManager.parse(event)
    sig = _signature(getattr(LifecycleManager, f"_{ev.value}"))
    return {
        name: p.default is inspect.Parameter.empty
        for name, p in sig.parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
