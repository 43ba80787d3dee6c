"""Lifecycle events: what happens to L1, L2 and L3 when a session moves through its life.

An agent framework reports events; this module applies their effects so every session decays
and recovers the same way. The effects are data (:data:`EFFECTS`), readable by humans and
by the health report, and each one is implemented by exactly one handler below.

* ``session_start``: a new L1 state; L2 task contract version 1 ``{goal: <query>, ...}``.
* ``tool_call``: L1 gets the call/result pair and ``current_step`` advances; L2 stores the
  response under its api key, the result under ``step:<n>`` and any sensor series points.
* ``user_correction``: L1 drops the newest 3 trace pairs; L2 writes a new contract version
  marked ``corrected``.
* ``context_overflow``: L1 trace trimmed to the newest N pairs; low-priority L2 TTLs shortened.
* ``session_timeout``: every L2 key of the session deleted; L1 returned as is (caller drops it).
* ``goal_achieved``: confirmed answers upserted to L3 ``hot_knowledge`` (``confirmed=True``);
  every L2 key of the session expires after a grace period. Each answer records the agent that
  wrote it (from the session's server-set auth context, never from the payload) and lands in
  that agent's private scope unless the agent holds ``write`` on the answer's ``namespace``
  (checked with the manager's ``namespaces`` registry). The answer's ``source`` is only a claim
  (stored as ``claimed_source``); the hot point's source is server-made.
* ``error_recovery``: L1 keeps only the newest trace pair; the L2 contract is locked.

"Low priority" L2 data is what can be fetched again (raw API responses, sensor series); step
results, the contract and pending tasks are the session's own work and keep their TTLs.

TTL changes and deletion go through the session's own view
(:meth:`SessionMemory.expire_all` with ``only_shorten=True``, i.e. ``EXPIRE ... LT``, and
:meth:`SessionMemory.clear`), which find the keys in the session's key index: a TTL is only
ever shortened, no value is read, nothing here builds a key pattern or scans the keyspace,
so an event costs O(keys of this session) whatever else lives in Redis.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from context_core.errors import ConfigError, ContextError, UnknownEventError

if TYPE_CHECKING:
    from context_core.gateway import Gateway
    from context_core.knowledge.memory import AclSource, KnowledgeMemory
    from context_core.session import AuthContext, SessionState
    from context_core.working_memory import SessionMemory, WorkingMemory

__all__ = ["EFFECTS", "EventEffect", "EventResult", "LifecycleEvent", "LifecycleManager"]


class LifecycleEvent(StrEnum):
    SESSION_START = "session_start"
    TOOL_CALL = "tool_call"
    USER_CORRECTION = "user_correction"
    CONTEXT_OVERFLOW = "context_overflow"
    SESSION_TIMEOUT = "session_timeout"
    GOAL_ACHIEVED = "goal_achieved"
    ERROR_RECOVERY = "error_recovery"


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
                "task contract version 1 with the goal",
                "-",
            ),
            EventEffect(
                LifecycleEvent.TOOL_CALL,
                "call/result pair appended to the trace; current_step advances",
                "response stored under the api key, result under step:<n>, series points added",
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
                "trace trimmed to the newest N pairs",
                "api and series TTLs shortened (low priority)",
                "-",
            ),
            EventEffect(
                LifecycleEvent.SESSION_TIMEOUT, "unchanged", "all session keys deleted", "-"
            ),
            EventEffect(
                LifecycleEvent.GOAL_ACHIEVED,
                "unchanged",
                "all session keys expire after a grace period",
                "confirmed answers upserted to hot_knowledge",
            ),
            EventEffect(
                LifecycleEvent.ERROR_RECOVERY,
                "only the newest trace pair kept",
                "task contract locked against writes",
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


class LifecycleManager:
    """Applies lifecycle events. ``handle`` returns the new state; ``apply`` adds effects.

    Every L2 effect goes through ``wm.session(sid)``: the manager never touches Redis itself.
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
    ) -> None:
        for name, v in (
            ("overflow_keep_pairs", overflow_keep_pairs),
            ("low_priority_ttl_s", low_priority_ttl_s),
            ("goal_grace_s", goal_grace_s),
            ("correction_drop_pairs", correction_drop_pairs),
        ):
            if v < 0 or (name.endswith("_s") and v == 0):
                raise ConfigError(f"LifecycleManager: {name} must be positive, got {v}")
        self.wm = wm
        self.gateway = gateway
        self.knowledge = knowledge
        self.namespaces = namespaces
        self.overflow_keep_pairs = overflow_keep_pairs
        self.low_priority_ttl_s = low_priority_ttl_s
        self.goal_grace_s = goal_grace_s
        self.correction_drop_pairs = correction_drop_pairs
        self._handlers: dict[LifecycleEvent, Callable[..., EventResult]] = {
            LifecycleEvent.SESSION_START: self._session_start,
            LifecycleEvent.TOOL_CALL: self._tool_call,
            LifecycleEvent.USER_CORRECTION: self._user_correction,
            LifecycleEvent.CONTEXT_OVERFLOW: self._context_overflow,
            LifecycleEvent.SESSION_TIMEOUT: self._session_timeout,
            LifecycleEvent.GOAL_ACHIEVED: self._goal_achieved,
            LifecycleEvent.ERROR_RECOVERY: self._error_recovery,
        }

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
        try:
            inspect.signature(handler).bind(state, **payload)
        except TypeError as e:
            accepted = [p for p in inspect.signature(handler).parameters if p != "state"]
            raise ContextError(
                f"{ev.value}: bad payload ({e}); accepted: {', '.join(accepted) or 'none'}"
            ) from e
        return handler(state, **payload)

    def handle(
        self, event: str | LifecycleEvent, state: SessionState | None, **payload: Any
    ) -> SessionState:
        return self.apply(event, state, **payload).state

    # --- helpers ----------------------------------------------------------------------
    def _sm(self, state: SessionState) -> SessionMemory:
        return self.wm.session(state.session_id)

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
    ) -> EventResult:
        from context_core.session import SessionState

        if state is not None:
            raise ContextError("session_start: a session is already running (state given)")
        new = SessionState.start(session_id, user_id, user_query, gateway=self.gateway, auth=auth)
        if device_id:
            new = new.advance(last_device_id=device_id)
        sm = self._sm(new)
        current = sm.contract()
        fields = {"goal": new.user_query, **dict(contract or {})}
        c = sm.update_contract(fields, expected_version=current.version)
        return EventResult(
            LifecycleEvent.SESSION_START, new, {"contract_version": c.version, "contract": c.fields}
        )

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
    ) -> EventResult:
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
            for ts, value in points:
                sm.add_series_point(series_name, ts, value)
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
        if user_query:
            new = new.advance(user_query=user_query)
        return EventResult(
            LifecycleEvent.USER_CORRECTION,
            new,
            {"contract_version": c.version, "dropped_pairs": before - new.trace_pairs},
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
        deleted = self._sm(state).clear()
        return EventResult(LifecycleEvent.SESSION_TIMEOUT, state, {"deleted": deleted})

    @staticmethod
    def _writer(state: SessionState) -> str | None:
        """The agent behind the session: its auth context, set by the server from the API
        key (never by the client). A state started without one writes as the system."""
        from context_core.session import ANONYMOUS

        auth = state.auth_context
        return None if auth is ANONYMOUS or not auth.agent_id else auth.agent_id

    def _goal_achieved(
        self,
        state: SessionState,
        *,
        answers: Sequence[Mapping[str, Any]] = (),
        grace_s: int | None = None,
    ) -> EventResult:
        from context_core.knowledge.memory import SYSTEM_SCOPE, resolve_hot_scope

        hot_ids: list[str] = []
        scopes: list[str] = []
        if answers and self.knowledge is None:
            raise ConfigError(
                "goal_achieved with answers needs knowledge memory (LifecycleManager(knowledge=))"
            )
        for a in answers:
            if not a.get("text"):
                raise ContextError("goal_achieved: every answer needs a non-empty 'text'")
        writer = self._writer(state)
        for a in answers:
            assert self.knowledge is not None
            asked = a.get("namespace")
            scope = resolve_hot_scope(writer, str(asked) if asked else None, self.namespaces)
            shared = scope if scope != SYSTEM_SCOPE and ":" not in scope else None
            hot_ids.append(
                self.knowledge.upsert_hot(
                    str(a["text"]),
                    source=str(a.get("source") or ""),
                    section=str(a.get("section") or state.device_prefix or "GENERAL"),
                    title=str(a.get("title", "")),
                    confirmed=True,
                    written_by=writer,
                    namespace=shared,
                    namespaces=self.namespaces,
                )
            )
            scopes.append(scope)
        expiring = self._sm(state).expire_all(grace_s or self.goal_grace_s, only_shorten=True)
        return EventResult(
            LifecycleEvent.GOAL_ACHIEVED,
            state,
            {"hot_ids": hot_ids, "hot_scopes": scopes, "expiring": expiring},
        )

    def _error_recovery(self, state: SessionState) -> EventResult:
        new = state.keep_last_trace_items(1)
        self._sm(state).lock_contract()
        return EventResult(
            LifecycleEvent.ERROR_RECOVERY, new, {"kept_pairs": new.trace_pairs, "locked": True}
        )
