"""The L2 store under every view: one Redis client, the settings, and the round trips.

:class:`Store` is what the session view's mixins (:mod:`.base`, :mod:`.index`,
:mod:`.contract`, :mod:`.lifetime`) and :class:`~.preferences.Preferences` use of their
store; :class:`~.memory.WorkingMemory` adds the two doors (``session()`` and
``preferences()``). It sits below the views, so none of them imports :mod:`.memory`.

**Scripts.** The store registers no script up front: each module owns the Lua of the keys it
writes and asks for it with :meth:`Store.script` (registered on first use, once per store),
so the store does not collect other modules' scripts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Self, TypeVar

from redis.commands.core import Script

from context_core import defaults
from context_core.audit_trail import audit_path
from context_core.config import Settings
from context_core.errors import BackendUnavailableError, ConfigError
from context_core.gateway.sanitize import Gateway
from context_core.redis.connection import (
    REDIS_ERRORS,
    RedisClient,
    RedisProvider,
    client_location,
    connection_kwargs,
)
from context_core.redis.ops import Cmd, Op, cmd
from context_core.redis.ops import call as _call_script
from context_core.redis.ops import run_all as _run_ops
from context_core.redis.ops import script as _script_cmd
from context_core.working_memory.keys import ACTIVITY_KEY, DEFAULT_MAX_STEP_BYTES, check_sid

__all__ = ["Store"]

T = TypeVar("T")

#: The open :meth:`Store.deferred` scope of this thread/task: its store and the writes it
#: holds back.
_DEFERRED: ContextVar[tuple[Store, list[Cmd]] | None] = ContextVar("ctx_wm_deferred", default=None)


class Store:
    """Factory for per-session and per-user views over one Redis client.

    The client must decode responses (``RedisProvider.client()`` gives one). Session views
    are cheap and stateless: make one per call. ``now`` is the clock for stored timestamps,
    plan arithmetic and session activity (injectable so tests can move time without
    sleeping). ``contract_ttl_s`` / ``contract_history_ttl_s`` are the task contract's and
    its history's lifetimes (:mod:`.contract`), ``idle_s`` how long a session may go without
    activity before the idle sweep times it out, ``activity_key`` the Sorted Set recording
    activity (``ctx:activity``; another name keeps a test's or a tenant's sweep to its own
    sessions) (:mod:`.lifetime`).

    The client may be a :class:`redis.cluster.RedisCluster`: every script declares keys of one
    session (one ``{<sid>}`` hash tag, so one slot) or one user (``{<uid>}``), and the global
    activity Set is only ever written by a command of its own. ``min_replicas`` /
    ``replica_wait_ms`` (``CTX_REDIS_MIN_REPLICAS`` / ``CTX_REDIS_REPLICA_WAIT_MS``): every
    write script is followed by ``WAIT`` and fails
    (:class:`~context_core.redis.connection.ReplicaAckError`, a 503 in the service) when fewer
    replicas acknowledged it; :func:`context_core.redis.connection.call_script` says what that does
    and does not guarantee. The activity ZADD of :meth:`SessionMemory.touch` is not waited
    for (every request sends it again).
    """

    def __init__(
        self,
        client: RedisClient,
        gateway: Gateway,
        *,
        default_ttl_s: int = defaults.WM_DEFAULT_TTL_S,
        series_window: int = defaults.WM_SERIES_WINDOW,
        min_ttl_s: int = defaults.WM_MIN_TTL_S,
        now: Callable[[], float] = time.time,
        max_step_bytes: int = DEFAULT_MAX_STEP_BYTES,
        contract_ttl_s: int = defaults.WM_CONTRACT_TTL_S,
        contract_history_ttl_s: int = defaults.WM_CONTRACT_HISTORY_TTL_S,
        contract_history_versions: int = defaults.WM_CONTRACT_HISTORY_VERSIONS,
        contract_history_days: float = defaults.WM_CONTRACT_HISTORY_DAYS,
        history_audit_path: Path | None = None,
        idle_s: float = defaults.SESSION_IDLE_S,
        activity_key: str = ACTIVITY_KEY,
        min_replicas: int = 0,
        replica_wait_ms: int = 100,
    ) -> None:
        if not connection_kwargs(client).get("decode_responses"):
            raise ConfigError(
                "WorkingMemory needs a redis client with decode_responses=True "
                "(RedisProvider.client() returns one)"
            )
        if default_ttl_s <= 0 or series_window <= 0 or min_ttl_s <= 0:
            raise ConfigError(
                "CTX_WM_DEFAULT_TTL_S, CTX_WM_SERIES_WINDOW and CTX_WM_MIN_TTL_S must be "
                f"positive, got {default_ttl_s}, {series_window} and {min_ttl_s}"
            )
        if contract_ttl_s <= 0 or idle_s <= 0:
            raise ConfigError(
                "CTX_WM_CONTRACT_TTL_S and CTX_SESSION_IDLE_S must be positive, got "
                f"{contract_ttl_s} and {idle_s}"
            )
        if contract_history_ttl_s < contract_ttl_s:
            raise ConfigError(
                f"CTX_WM_CONTRACT_HISTORY_TTL_S ({contract_history_ttl_s}) must be at least "
                f"CTX_WM_CONTRACT_TTL_S ({contract_ttl_s}): the audit history outlives the "
                "contract it records"
            )
        # Any: redis-py's stubs type replies as bytes | str whatever decode_responses says.
        self._client: Any = client
        self._gateway = gateway
        self.default_ttl_s = int(default_ttl_s)
        self.series_window = int(series_window)
        self.min_ttl_s = int(min_ttl_s)
        self.contract_ttl_s = int(contract_ttl_s)
        self.contract_history_ttl_s = int(contract_history_ttl_s)
        if contract_history_versions < 1 or contract_history_days <= 0:
            raise ConfigError(
                "CTX_WM_CONTRACT_HISTORY_VERSIONS must be >= 1 and CTX_WM_CONTRACT_HISTORY_DAYS "
                f"positive, got {contract_history_versions} and {contract_history_days}"
            )
        self.contract_history_versions = int(contract_history_versions)
        self.contract_history_days = float(contract_history_days)
        self.history_audit_path = history_audit_path
        self.idle_s = float(idle_s)
        if not isinstance(activity_key, str) or not activity_key or "{" in activity_key:
            raise ConfigError(f"activity_key must be a plain key name, got {activity_key!r}")
        self.activity_key = activity_key
        if max_step_bytes <= 0:
            raise ConfigError(f"CTX_MAX_STEP_RESULT_BYTES must be positive, got {max_step_bytes}")
        self.max_step_bytes = int(max_step_bytes)
        self._now = now
        self._scripts: dict[str, Script] = {}
        if min_replicas < 0 or replica_wait_ms <= 0:
            raise ConfigError(
                "CTX_REDIS_MIN_REPLICAS must be >= 0 and CTX_REDIS_REPLICA_WAIT_MS positive, "
                f"got {min_replicas} and {replica_wait_ms}"
            )
        self.min_replicas = int(min_replicas)
        self.replica_wait_ms = int(replica_wait_ms)
        self.url = client_location(client)  # no password, safe to show

    @classmethod
    def from_settings(cls, settings: Settings, provider: RedisProvider, gateway: Gateway) -> Self:
        return cls(
            provider.client(decode_responses=True),
            gateway,
            **cls.settings_kwargs(settings),
        )

    @staticmethod
    def settings_kwargs(settings: Settings) -> dict[str, Any]:
        """The constructor's keyword arguments from ``settings`` (for callers that build
        their own client, like the service with its fail-fast timeouts)."""
        return {
            "default_ttl_s": settings.wm_default_ttl_s,
            "series_window": settings.wm_series_window,
            "min_ttl_s": settings.wm_min_ttl_s,
            "max_step_bytes": settings.max_step_result_bytes,
            "contract_ttl_s": settings.wm_contract_ttl_s,
            "contract_history_ttl_s": settings.wm_contract_history_ttl_s,
            "contract_history_versions": settings.wm_contract_history_versions,
            "contract_history_days": settings.wm_contract_history_days,
            "history_audit_path": audit_path(settings.data_dir),
            "idle_s": settings.session_idle_s,
            "min_replicas": settings.redis_min_replicas,
            "replica_wait_ms": settings.redis_replica_wait_ms,
        }

    def now(self) -> float:
        """The store's clock (``now=`` of the constructor): what timestamps and activity use."""
        return float(self._now())

    def history_bounds(self, now: float | None = None) -> tuple[int, float]:
        """The contract history's bound at ``now`` (default: the clock): versions kept, and
        the oldest ``_updated_at`` kept (``contract_history_days`` before it)."""
        at = self.now() if now is None else float(now)
        return self.contract_history_versions, at - self.contract_history_days * 86_400.0

    # ---- session activity (global Sorted Set ctx:activity, see .lifetime) -----------------
    def idle_sessions(self, now: float | None = None, limit: int = 500) -> list[str]:
        """Sessions whose last activity is older than ``idle_s`` (oldest first, at most
        ``limit``), from ``ctx:activity``: O(log n + limit), no scan."""
        cutoff = (self._now() if now is None else float(now)) - self.idle_s
        if limit <= 0:
            return []
        key = self.activity_key
        found = self._one(
            cmd("ZRANGEBYSCORE", key, "-inf", repr(cutoff), "LIMIT", 0, limit),
            f"ZRANGEBYSCORE {key}",
        )
        return list(found)

    def last_activity(self, session_id: str) -> float | None:
        """Epoch seconds of the session's last activity, ``None`` if not recorded."""
        key = self.activity_key
        score = self._one(cmd("ZSCORE", key, session_id), f"ZSCORE {key}")
        return None if score is None else float(score)

    def forget_activity(self, session_id: str) -> None:
        """Remove the session from ``ctx:activity`` (timed out, or its goal reached)."""
        key = self.activity_key
        self._one(cmd("ZREM", key, session_id), f"ZREM {key}")

    def _one(self, command: Cmd, what: str) -> Any:
        """One command, one round trip (awaited on the service's event loop); its reply."""
        return self.run(_reply_of(command), what)

    def forget_activity_cmds(self, session_id: str) -> list[Cmd]:
        """:meth:`forget_activity` as commands, for a caller's own round trip."""
        return [cmd("ZREM", self.activity_key, check_sid(session_id))]

    def script(self, lua: str) -> Script:
        """The registered script of ``lua`` on this store's client (made on first use). Each
        module owns the scripts of the keys it writes and names them here by their text."""
        found = self._scripts.get(lua)
        if found is None:
            found = self._scripts[lua] = self._client.register_script(lua)
        return found

    # ---- round trips (see context_core.redis.ops) ----------------------------------------
    def run(self, op: Op[T], what: str) -> T:
        """Run one operation on this store's client (its rounds, one round trip each, the
        writes a :meth:`deferred` scope holds back at the head of the first); Redis failures
        are :class:`BackendUnavailableError` naming ``what``."""
        return self.run_all([op], what)[0]  # type: ignore[no-any-return]

    def run_all(self, ops: Sequence[Op[Any]], what: str) -> list[Any]:
        """:func:`context_core.redis.ops.run_all` on this store's client (see :meth:`run`)."""
        with self._guard(what, flush=False):
            return _run_ops(
                self._client,
                ops,
                min_replicas=self.min_replicas,
                wait_ms=self.replica_wait_ms,
                first=self._take_deferred(),
            )

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Hold this thread's fire-and-forget L2 writes (step results, API responses, series
        points, session activity) back and send them together: at the head of the next
        operation's round trip inside the scope, or when the scope ends. Every other Redis
        operation of this store flushes them first, so the order of operations is the one the
        code wrote; only the number of round trips changes. If the block raises, the writes
        still held are dropped (none of them was sent); the ones already sent stay.

        The HTTP service wraps an event in one scope: its writes go to Redis in one round
        trip instead of one each. Scopes nest; a thread sees only its own."""
        outer = _DEFERRED.get()
        if outer is not None and outer[0] is self:
            yield  # already deferring: the outer scope flushes
            return
        token = _DEFERRED.set((self, []))
        try:
            yield
            self.flush()
        finally:
            _DEFERRED.reset(token)

    def flush(self) -> None:
        """Send the writes the current :meth:`deferred` scope holds (one round trip)."""
        queued = self._take_deferred()
        if queued:
            with self._guard("deferred writes", flush=False):
                _run_ops(
                    self._client,
                    [],
                    min_replicas=self.min_replicas,
                    wait_ms=self.replica_wait_ms,
                    first=queued,
                )

    def defer(self, command: Cmd) -> bool:
        """Queue ``command`` (a fire-and-forget write, possibly of another part on the same
        client, like the service's state publication) in the open :meth:`deferred` scope;
        False (nothing queued) when there is none."""
        scope = _DEFERRED.get()
        if scope is None or scope[0] is not self:
            return False
        scope[1].append(command)
        return True

    @property
    def deferring(self) -> bool:
        """True inside this thread's :meth:`deferred` scope of this store."""
        scope = _DEFERRED.get()
        return scope is not None and scope[0] is self

    def _take_deferred(self) -> list[Cmd]:
        scope = _DEFERRED.get()
        if scope is None or scope[0] is not self or not scope[1]:
            return []
        queued = list(scope[1])
        scope[1].clear()
        return queued

    def _write(self, script: Script, *, keys: list[str], args: list[Any]) -> Any:
        """Run a write script, then ``WAIT`` for ``min_replicas`` when set (see the class
        doc); call inside :meth:`_guard`. Writes held back by a :meth:`deferred` scope go
        first, in the same round trip."""
        queued = self._take_deferred()
        if queued:
            return _run_ops(
                self._client,
                [_reply_of(_script_cmd(script, keys, args, durable=True))],
                min_replicas=self.min_replicas,
                wait_ms=self.replica_wait_ms,
                first=queued,
            )[0]
        return _call_script(
            self._client,
            script,
            keys,
            args,
            durable=True,
            min_replicas=self.min_replicas,
            wait_ms=self.replica_wait_ms,
        )

    def _write_later(self, what: str, script: Script, *, keys: list[str], args: list[Any]) -> None:
        """A write whose reply nobody needs: held back inside a :meth:`deferred` scope, else
        run now (as :meth:`_write`, guarded with ``what``)."""
        if self.defer(_script_cmd(script, keys, args, durable=True)):
            return
        with self._guard(what):
            self._write(script, keys=keys, args=args)

    @contextmanager
    def _guard(self, op: str, *, flush: bool = True) -> Iterator[None]:
        try:
            if flush:
                self.flush()  # held-back writes before any other operation: same order
            yield
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(
                f"Redis at {self.url} failed during {op}: {e}; check the server is up and "
                "CTX_REDIS_URL points at it"
            ) from e


def _reply_of(command: Cmd) -> Op[Any]:
    """The operation that sends ``command`` and returns its reply (raising an error reply)."""
    (reply,) = yield [command]
    if isinstance(reply, Exception):
        raise reply
    return reply
