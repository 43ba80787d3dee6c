"""The L2 stores: :class:`WorkingMemory` (one per Redis client) and its per-session views.

:class:`SessionMemory` is bound to one validated session id and builds every key itself, so
it is the only door to ``wm:{<sid>}:...`` keys; no method takes a raw key for reading.

Value layout:

* ``api``      String, JSON ``{"stored_at": <epoch>, "data": <cleaned response>}``
* ``step``     Hash, one JSON-encoded value per field plus ``_stored_at``; at most
  ``max_step_bytes`` (``CTX_MAX_STEP_RESULT_BYTES``) of field values, else refused
* ``result``   String like ``api``: a tool call's full result, when L1 keeps only a pointer
* ``series``   Sorted Set, member ``"<ts>|<value>"``, score ``ts``; newest N kept
* ``pending``  Set of task ids, no TTL (ident ``tasks``)
* ``contract`` Hash ``current`` (``f:<name>`` JSON fields + ``_version``, ``_corrected``,
  ``_locked``, ``_updated_at``, ``_status``) living ``contract_ttl_s`` (2 h) from the
  session's last activity, and List ``history`` (one JSON snapshot per version) kept
  ``contract_history_ttl_s`` (30 d) for audit; see :mod:`.contract`
* ``plan``     Hash ``current``: the last applied plan with absolute start times
  (:meth:`AnchoredPlan.to_hash`), kept as long as the longest TTL it hands out
* ``index``    Set ``wm:{<sid>}:index`` of the session's key names (no ident: it is not
  a value). Every write lists its key there in the same script; :meth:`SessionMemory.keys`,
  :meth:`~SessionMemory.expire_all` and :meth:`~SessionMemory.clear` read it instead of
  scanning the keyspace. Invariants and lifetime: :mod:`.index`.
* ``expired``  Set ``wm:{<sid>}:expired`` of keys a sweep found expired or a timeout
  deleted (:meth:`SessionMemory.key_expired`); :mod:`.index`
* ``ctx:activity`` (global, outside every session's slot) Sorted Set of session ids by
  last activity, for the idle sweep; :mod:`.lifetime`

No view holds state beyond its session id: the router, the lifecycle handlers and each
process of the HTTP service make a fresh ``wm.session(sid)`` per call, so anything a later
call needs (the plan included) lives in Redis.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from context_core import defaults
from context_core.errors import (
    ContextError,
    ContextMissError,
)
from context_core.redis.ops import Op, cmd, ok
from context_core.working_memory.index import (
    API_PUT_LUA,
    PENDING_ADD_LUA,
    PENDING_REMOVE_LUA,
    PLAN_APPLY_LUA,
    SERIES_ADD_LUA,
)
from context_core.working_memory.keys import (
    RESERVED_PREFIX,
    canonical,
    check_sid,
    check_size,
    ttl_from_pttl,
)
from context_core.working_memory.lifetime import (
    LifetimeOps,
)
from context_core.working_memory.plan import (
    STEP_PUT_LUA,
    AnchoredPlan,
    StepPlan,
)
from context_core.working_memory.preferences import Preferences
from context_core.working_memory.store import Store
from context_core.working_memory.values import Loaded, decode_point, hash_loaded, string_loaded

__all__ = ["SessionMemory", "WorkingMemory"]

#: Defaults of the task contract's lifetime and the idle timeout (the ``Settings`` values).
DEFAULT_CONTRACT_TTL_S = defaults.WM_CONTRACT_TTL_S
DEFAULT_CONTRACT_HISTORY_TTL_S = defaults.WM_CONTRACT_HISTORY_TTL_S
DEFAULT_IDLE_S = defaults.SESSION_IDLE_S

# --------------------------------------------------------------------------------------
# stores
# --------------------------------------------------------------------------------------


class WorkingMemory(Store):
    """Factory for per-session and per-user views over one Redis client: the
    :class:`~context_core.working_memory.store.Store` (client, settings, round trips) and its
    two doors, :meth:`session` and :meth:`preferences`."""

    def session(self, session_id: str) -> SessionMemory:
        """The only door to ``wm:{<session_id>}:...`` keys."""
        return SessionMemory(self, check_sid(session_id))

    def preferences(self, org_id: str, user_id: str) -> Preferences:
        """The preferences of user ``user_id`` of organisation ``org_id`` (the org comes from
        the caller's credential; the user id is canonicalised, see
        :func:`context_core.gateway.identity.canonical_user_id`)."""
        return Preferences(self, org_id, user_id)


class SessionMemory(LifetimeOps):
    """One session's working memory. Builds every key itself from its (read-only) session id.

    A view keeps nothing but its session id: the plan given to :meth:`apply_plan` is stored
    in Redis, so a step written later through any view, in any process, gets the plan's TTL.
    The task contract (:class:`.contract.ContractOps`), the key index
    (:class:`.index.IndexOps`) and activity/timeout (:class:`.lifetime.LifetimeOps`) are
    mixed in from their modules.
    """

    __slots__ = ()

    # ---- API responses (String) ---------------------------------------------------------
    def put_api_response(
        self,
        endpoint: str,
        params: Mapping[str, Any],
        response: Any,
        *,
        ttl_s: int | None = None,
    ) -> str:
        """Store a cleaned, size-capped response; returns its key."""
        key = self.api_key(endpoint, params)
        data = self._gw.clean_response(response, where=f"L2.api {endpoint}")
        body = canonical({"stored_at": self.wm._now(), "data": data})
        self.wm._write_later(
            f"SET {key}",
            self.wm.script(API_PUT_LUA),
            keys=[key, self._idx],
            args=[body, self._ttl(ttl_s)],
        )
        return key

    def put_call_result(
        self, call_id: str, data: Any, *, max_bytes: int, ttl_s: int | None = None
    ) -> str:
        """A tool call's full result (``result:<call_id>``, read back with ``load``), kept
        here when L1 holds only a pointer. Cleaned, and refused over ``max_bytes``."""
        key = self.key("result", call_id)
        cleaned = self._gw.clean(data, where=f"L2.result {call_id}")
        body = canonical({"stored_at": self.wm._now(), "data": cleaned})
        check_size(f"tool result {call_id!r}", len(body.encode()), max_bytes, "BODY")
        self.wm._write_later(
            f"SET {key}",
            self.wm.script(API_PUT_LUA),
            keys=[key, self._idx],
            args=[body, self._ttl(ttl_s)],
        )
        return key

    def get_api_response(self, endpoint: str, params: Mapping[str, Any]) -> Loaded:
        return self._load_string(self.api_key(endpoint, params))

    def _load_string(self, key: str) -> Loaded:
        return self.wm.run(self.string_op(key), f"GET {key}")

    def string_op(self, key: str) -> Op[Loaded]:
        """Operation (:mod:`context_core.redis.ops`): one of this session's String values
        (GET + PTTL); a miss raises :class:`ContextMissError`."""
        raw, pttl = ok((yield [cmd("GET", self._own(key)), cmd("PTTL", key)]))
        if raw is None:
            raise ContextMissError(key)
        return string_loaded(key, raw, pttl)

    # ---- step results (Hash) ------------------------------------------------------------
    def put_step_result(
        self, step_id: str, fields: Mapping[str, Any], *, ttl_s: int | None = None
    ) -> str:
        """Replace the step's result hash; returns its key.

        TTL: ``ttl_s`` if given; else, when the session's stored plan has steps depending on
        this one, ``max(min_ttl_s, (latest dependent's start - now) x factor)``; else the
        default. The plan is read, and the key listed in the session's key index, inside
        the same Lua call as the write: one round trip, atomic with respect to a concurrent
        :meth:`apply_plan`.
        """
        key = self.key("step", step_id)
        if not fields:
            raise ContextError(f"put_step_result({step_id!r}): fields must not be empty")
        bad = [k for k in fields if not isinstance(k, str) or k.startswith(RESERVED_PREFIX)]
        if bad:
            raise ContextError(
                f"put_step_result({step_id!r}): field names must be strings not starting "
                f"with '_' (reserved), got {bad!r}"
            )
        cleaned = self._gw.clean(dict(fields), where=f"L2.step {step_id}")
        mapping = {k: canonical(v) for k, v in cleaned.items()}
        size = sum(len(v.encode()) for v in mapping.values())
        check_size(f"step result {step_id!r}", size, self.wm.max_step_bytes, "STEP_RESULT")
        now = self.wm._now()
        mapping["_stored_at"] = repr(now)
        explicit = "" if ttl_s is None else str(self._ttl(ttl_s))
        wm = self.wm
        args: list[str | int] = [repr(now), explicit, wm.default_ttl_s, step_id, wm.min_ttl_s]
        for field, value in mapping.items():
            args += [field, value]
        self.wm._write_later(
            f"HSET {key}",
            self.wm.script(STEP_PUT_LUA),
            keys=[key, self._plan_key(), self._idx],
            args=args,
        )
        return key

    def get_step_result(self, step_id: str) -> Loaded:
        return self._load_hash(self.key("step", step_id))

    def _load_hash(self, key: str) -> Loaded:
        return self.wm.run(self.hash_op(key), f"HGETALL {key}")

    def hash_op(self, key: str) -> Op[Loaded]:
        """Operation: one of this session's Hash values (HGETALL + PTTL); a miss raises
        :class:`ContextMissError`."""
        h, pttl = ok((yield [cmd("HGETALL", self._own(key)), cmd("PTTL", key)]))
        if not h:
            raise ContextMissError(key)
        return hash_loaded(key, h, pttl)

    def fetch_bundle(
        self,
        step_ids: Sequence[str] = (),
        api_requests: Sequence[tuple[str, Mapping[str, Any]]] = (),
        *,
        missing_ok: bool = False,
    ) -> dict[str, Loaded]:
        """Step results and API responses in ONE round trip, keyed by Redis key.

        A miss raises :class:`ContextMissError` naming the first missing key, unless
        ``missing_ok`` (then missing keys are simply absent from the result).
        """
        plan = [("h", self.key("step", s)) for s in step_ids]
        plan += [("s", self.api_key(e, p)) for e, p in api_requests]
        if not plan:
            return {}
        with self.wm._guard("bundle fetch"):
            pipe = self._r.pipeline(transaction=False)
            for t, k in plan:
                (pipe.hgetall(k) if t == "h" else pipe.get(k)).pttl(k)
            raw = pipe.execute()
        out: dict[str, Loaded] = {}
        for i, (t, k) in enumerate(plan):
            val, pttl = raw[2 * i], raw[2 * i + 1]
            if not val:
                if missing_ok:
                    continue
                raise ContextMissError(k)
            out[k] = hash_loaded(k, val, pttl) if t == "h" else string_loaded(k, val, pttl)
        return out

    def load(self, kind: str, ident: str) -> Loaded:
        """Read any of this session's values by kind and ident; ContextMissError on a miss."""
        key = self.key(kind, ident)
        with self.wm._guard(f"TYPE {key}"):
            typ = self._r.type(key)
        if typ == "none":
            raise ContextMissError(key)
        if typ == "string":
            return self._load_string(key)
        if typ == "hash":
            return self._load_hash(key)
        with self.wm._guard(f"read {key}"):
            pipe = self._r.pipeline(transaction=False)
            if typ == "zset":
                pipe.zrange(key, 0, -1, withscores=True)
            elif typ == "set":
                pipe.smembers(key)
            elif typ == "list":
                pipe.lrange(key, 0, -1)
            else:
                raise ContextError(f"load: {key} has unsupported type {typ}")
            pipe.pttl(key)
            val, pttl = pipe.execute()
        if typ == "zset":
            val = [decode_point(m) for m, _ in val]
        elif typ == "set":
            val = set(val)
        elif typ == "list":
            val = [json.loads(v) for v in val]
        if not val:
            raise ContextMissError(key)
        return Loaded(key, val, 0.0, ttl_from_pttl(pttl))

    # ---- series (Sorted Set) ------------------------------------------------------------
    def add_series_point(self, series: str, ts: float, value: float) -> None:
        """Add a point and trim to the newest ``series_window`` points, atomically."""
        self.add_series_points(series, [(ts, value)])

    def add_series_points(self, series: str, points: Sequence[tuple[float, float]]) -> None:
        """Add ``(ts, value)`` points and trim to the newest ``series_window``, atomically and
        in one round trip (a tool result usually brings several points of one series)."""
        key = self.key("series", series)
        numbers: list[tuple[float, float]] = []
        for ts, value in points:
            try:
                ts_f, val_f = float(ts), float(value)
            except (TypeError, ValueError) as e:
                raise ContextError(
                    f"add_series_point({series!r}): ts and value must be numbers"
                ) from e
            if not (math.isfinite(ts_f) and math.isfinite(val_f)):
                raise ContextError(f"add_series_point({series!r}): ts/value must be finite")
            numbers.append((ts_f, val_f))
        if not numbers:
            return
        # Numbers only, so nothing to redact, but the write path still passes the gateway.
        cleaned = self._gw.clean(tuple(numbers), where=f"L2.series {series}")
        args: list[Any] = [self.wm.series_window, self.wm.default_ttl_s]
        for ts_f, val_f in cleaned:
            args += [repr(ts_f), f"{ts_f!r}|{val_f!r}"]
        self.wm._write_later(
            f"ZADD {key}", self.wm.script(SERIES_ADD_LUA), keys=[key, self._idx], args=args
        )

    def series(self, series: str, since: float | None = None) -> list[tuple[float, float]]:
        """Points ``(ts, value)`` oldest first, optionally from ``since`` (inclusive)."""
        key = self.key("series", series)
        return self.wm.run(self.series_op(series, since), f"ZRANGEBYSCORE {key}")

    def series_op(self, series: str, since: float | None = None) -> Op[list[tuple[float, float]]]:
        """Operation: :meth:`series`."""
        key = self.key("series", series)
        lo = "-inf" if since is None else repr(float(since))
        (members,) = ok((yield [cmd("ZRANGEBYSCORE", key, lo, "+inf")]))
        return [decode_point(m) for m in members]

    # ---- pending tasks (Set, no TTL) ----------------------------------------------------
    def _pending_member(self, task_id: str) -> str:
        member = self._gw.clean_text(str(task_id), where="L2.pending")
        if not member.strip():
            raise ContextError("pending task id must be a non-empty string")
        return member

    def add_pending(self, task_id: str) -> None:
        key = self.key("pending", "tasks")
        member = self._pending_member(task_id)
        self.wm._write_later(
            f"SADD {key}", self.wm.script(PENDING_ADD_LUA), keys=[key, self._idx], args=[member]
        )

    def remove_pending(self, task_id: str) -> bool:
        """Forget a task id. When the last one goes the Set is gone, and the key index,
        kept without TTL while it existed, gets its longest member's TTL back."""
        key = self.key("pending", "tasks")
        member = self._pending_member(task_id)
        with self.wm._guard(f"SREM {key}", flush=False):
            removed, still_there = self.wm._write(
                self.wm.script(PENDING_REMOVE_LUA), keys=[key], args=[member]
            )
        if removed and not still_there:
            self._sweep("refit")
        return bool(removed)

    def pending(self) -> set[str]:
        key = self.key("pending", "tasks")
        with self.wm._guard(f"SMEMBERS {key}"):
            return set(self._r.smembers(key))

    # ---- plans and TTLs -----------------------------------------------------------------
    def _plan_key(self) -> str:
        return self.key("plan", "current")

    def apply_plan(self, plan: StepPlan, *, factor: float = 2.0) -> dict[str, int]:
        """Store ``plan`` (replacing the previous one) and re-EXPIRE its steps' outputs.

        The plan is stored with absolute start times (``now`` + ``est_start_s``) and the
        factor, so later writes through any view get the TTL for the time *they* happen.
        Plan, TTLs and EXPIREs change in one Lua call. Returns ``{step_id: ttl_s}`` for the
        step results that exist (others get the plan's TTL when written).
        """
        now = self.wm._now()
        anchored = AnchoredPlan.anchor(plan, now=now, factor=factor)
        default, floor = self.wm.default_ttl_s, self.wm.min_ttl_s
        keys = {s: self.key("step", s) for s in plan.steps}  # validates every step id
        ttls = {
            s: anchored.ttl(s, now=now, default_ttl_s=default, min_ttl_s=floor) for s in plan.steps
        }
        stored = anchored.to_hash()
        # Ids and numbers only, but the write still passes the gateway; if it would change
        # anything (an id that looks like a secret or a phone number) the plan is refused
        # rather than stored inconsistent with the step keys.
        if self._gw.clean(list(stored.items()), where="L2.plan") != list(stored.items()):
            raise ContextError(
                f"apply_plan: a step id of session {self.session_id!r} looks like a secret "
                "or personal data; use neutral step ids such as 's1' or 'diagnose'"
            )
        plan_key = self._plan_key()
        keep = anchored.keep_s(now=now, default_ttl_s=default, min_ttl_s=floor)
        args: list[str | int] = [keep, *(ttls[s] for s in keys)]
        for field, value in stored.items():
            args += [field, value]
        with self.wm._guard(f"apply_plan {plan_key}", flush=False):
            done = self.wm._write(
                self.wm.script(PLAN_APPLY_LUA),
                keys=[plan_key, self._idx, *keys.values()],
                args=args,
            )
        return {s: ttls[s] for s, ok in zip(keys, done, strict=True) if ok}

    def current_plan(self) -> AnchoredPlan | None:
        """The stored plan (``None`` if none was applied or it expired); see
        :meth:`AnchoredPlan.relative` for its starts as seconds from now."""
        return self.wm.run(self.plan_op(), f"HGETALL {self._plan_key()}")

    def plan_op(self) -> Op[AnchoredPlan | None]:
        """Operation: :meth:`current_plan`."""
        (h,) = ok((yield [cmd("HGETALL", self._plan_key())]))
        return AnchoredPlan.from_hash(h)

    def ttl(self, key: str) -> float | None:
        """Seconds left on one of this session's keys; None = no expiry; miss raises."""
        self._own(key)
        with self.wm._guard(f"PTTL {key}"):
            pttl = self._r.pttl(key)
        if pttl == -2:
            raise ContextMissError(key)
        return ttl_from_pttl(pttl)
