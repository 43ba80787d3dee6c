"""Who owns a service session, which signed state is its latest, and what an agent may spend.

One Hash per session, ``svc:{<sid>}:session``, holds ``owner`` (the agent id), ``inc`` (the
incarnation: a random nonce drawn each time the id is created) and ``ver`` (the version of
the latest signed L1 state, +1 per applied event). The signed state carries ``nonce`` and
``version`` too, so every request is one atomic script (:data:`ACCESS_LUA`) that checks
owner, incarnation and version together:

* another agent's session and a missing one answer the same (404 ``unknown_session``), so
  session ids don't leak between agents; creating an id that cannot be taken answers one
  409 ``session_id_unavailable`` whatever the reason (:meth:`OwnerBinding.claim`);
* a state from an earlier incarnation (the session was closed and created again) or an older
  version (replayed, or superseded by a later event) is ``stale_state`` (409);
* an event first takes a short lease (``svc:{<sid>}:lease``, SET NX PX) in the same script;
  two concurrent requests with the same state cannot both get it. The event then commits
  (:data:`COMMIT_LUA`: version +1 and the new signed state stored as ``svc:{<sid>}:state`` for
  re-fetching) or, on any failure, gives the lease back (the sent state stays valid). A
  crashed instance's lease simply expires.

All three keys share the ``{<sid>}`` hash tag with the session's L2 keys (``wm:{<sid>}:``), so
the scripts are legal on Redis Cluster and creation can refuse an id whose L2 data already
exists without an owner (a session made by library code on the same Redis): such a session is
never claimable through the service. Library code that wants agents to use one of its
sessions through the service binds it explicitly with :meth:`OwnerBinding.adopt`, stores the
state signed by :meth:`context_core.session.wire.WireState.of` with the returned nonce and
version 0 (the signing key is ``load_state_key`` in :mod:`.deps`) and hands the agent that state
sealed for its organisation (``Services.codec.seal``; the signed object itself is accepted only
until ``CTX_STATE_LEGACY_UNTIL``).

Quotas (:class:`AgentQuotas`) are per agent, on keys with the ``{<agent>}`` hash tag: a sorted
set of the agent's live sessions scored by expiry, and one counter per minute of request-body
bytes sent to writing endpoints. Both answer 429 with a Retry-After when exceeded.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import time
from typing import Any

from context_core.errors import (
    AccessDeniedError,
    BackendUnavailableError,
    QuotaExceededError,
    SessionExistsError,
    StaleStateError,
    UnknownSessionError,
)
from context_core.redis.connection import REDIS_ERRORS, RedisClient
from context_core.redis.ops import Cmd, Op, call, cmd, execute, ok, run, script
from context_core.working_memory.index import FIXED_KEYS, index_key
from context_core.working_memory.keys import session_prefix

__all__ = ["AgentQuotas", "Lease", "OwnerBinding", "new_nonce"]

LEASE_MS = 60_000
"""How long an event may hold a session's lease before another request may take it."""

# KEYS: 1 session hash, 2 latest state, 3 lease, 4.. the session's L2 index + fixed keys.
# ARGV: 1 agent, 2 ttl seconds, 3 nonce.
CLAIM_LUA = """
local h = redis.call('HMGET', KEYS[1], 'owner', 'closed_by')
if h[1] then return 'taken' end
if h[2] and h[2] ~= ARGV[1] then return 'taken' end
for i = 4, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 'taken' end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'inc', ARGV[3], 'ver', '0')
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('DEL', KEYS[2], KEYS[3])
return 'ok'
"""

# KEYS: 1 session hash, 2 latest state, 3 lease.
# ARGV: 1 mode (owner|read|write), 2 agent, 3 ttl s, 4 nonce, 5 version, 6 token, 7 lease ms.
ACCESS_LUA = """
local h = redis.call('HMGET', KEYS[1], 'owner', 'inc', 'ver')
if not h[1] or h[1] ~= ARGV[2] then return {'unknown', ''} end
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
if ARGV[1] == 'owner' then return {'ok', h[3]} end
if h[2] ~= ARGV[4] then return {'foreign', h[3]} end
if h[3] ~= ARGV[5] then return {'stale', h[3]} end
if ARGV[1] == 'read' then return {'ok', h[3]} end
if not redis.call('SET', KEYS[3], ARGV[6], 'NX', 'PX', ARGV[7]) then return {'busy', h[3]} end
return {'ok', h[3]}
"""

# KEYS: 1 session hash, 2 latest state, 3 lease.
# ARGV: 1 token, 2 nonce, 3 old version, 4 new version, 5 state JSON, 6 ttl s.
COMMIT_LUA = """
local lease = redis.call('GET', KEYS[3])
if lease and lease ~= ARGV[1] then return 'busy' end
local h = redis.call('HMGET', KEYS[1], 'inc', 'ver')
if h[1] ~= ARGV[2] or h[2] ~= ARGV[3] then return 'stale' end
redis.call('HSET', KEYS[1], 'ver', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('SET', KEYS[2], ARGV[5], 'EX', ARGV[6])
if lease then redis.call('DEL', KEYS[3]) end
return 'ok'
"""

# KEYS: 1 session hash, 2 latest state, 3 lease.
# ARGV: 1 nonce, 2 expected version, 3 new version, 4 state JSON, 5 ttl s.
# The server's own change of a session's state (the idle sweep): only while nobody holds the
# lease and the version is still the one the new state was made from.
REPLACE_LUA = """
if redis.call('EXISTS', KEYS[3]) == 1 then return 'busy' end
local h = redis.call('HMGET', KEYS[1], 'inc', 'ver')
if not h[1] then return 'unknown' end
if h[1] ~= ARGV[1] or h[2] ~= ARGV[2] then return 'stale' end
redis.call('HSET', KEYS[1], 'ver', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('SET', KEYS[2], ARGV[4], 'EX', ARGV[5])
return 'ok'
"""

# KEYS: 1 latest state.  ARGV: 1 state JSON, 2 ttl s.  (A script so that a durable write,
# CTX_REDIS_MIN_REPLICAS, can WAIT on the connection that wrote it.)
PUBLISH_LUA = """
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 1
"""

# KEYS: 1 lease.  ARGV: 1 token.
ABORT_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""


def new_nonce() -> str:
    return secrets.token_hex(16)


class Lease:
    """A held write lease: what :meth:`OwnerBinding.commit` / ``abort`` need."""

    __slots__ = ("nonce", "session_id", "token", "version")

    def __init__(self, session_id: str, nonce: str, version: int, token: str) -> None:
        self.session_id = session_id
        self.nonce = nonce
        self.version = version
        self.token = token


class OwnerBinding:
    """Owner, incarnation and latest version of each service session (see the module doc).

    ``min_replicas`` (``CTX_REDIS_MIN_REPLICAS``): creating a session, publishing its first
    state and committing an event's state each wait for that many replicas
    (:func:`context_core.redis.connection.call_script`), so an answer the agent received survives
    the loss of the master that gave it; the lease itself is not waited for (a lost lease
    only lets the same state be applied again).
    """

    def __init__(
        self,
        client: RedisClient,
        ttl_s: int,
        lease_ms: int = LEASE_MS,
        *,
        min_replicas: int = 0,
        replica_wait_ms: int = 100,
    ) -> None:
        self._r = client
        self.ttl_s = int(ttl_s)
        self.lease_ms = int(lease_ms)
        self.min_replicas = int(min_replicas)
        self.replica_wait_ms = int(replica_wait_ms)
        self._publish = client.register_script(PUBLISH_LUA)
        self._claim = client.register_script(CLAIM_LUA)
        self._access = client.register_script(ACCESS_LUA)
        self._commit = client.register_script(COMMIT_LUA)
        self._abort = client.register_script(ABORT_LUA)
        self._replace = client.register_script(REPLACE_LUA)

    # --- keys ----------------------------------------------------------------------------
    @staticmethod
    def key(session_id: str) -> str:
        return f"svc:{{{session_id}}}:session"

    @staticmethod
    def state_key(session_id: str) -> str:
        return f"svc:{{{session_id}}}:state"

    @staticmethod
    def lease_key(session_id: str) -> str:
        return f"svc:{{{session_id}}}:lease"

    def _keys(self, session_id: str) -> list[str]:
        return [self.key(session_id), self.state_key(session_id), self.lease_key(session_id)]

    def _run(
        self, what: str, script: Any, keys: list[str], args: list[Any], *, durable: bool = False
    ) -> Any:
        try:
            return call(
                self._r,
                script,
                keys,
                args,
                durable=durable,
                min_replicas=self.min_replicas if durable else 0,
                wait_ms=self.replica_wait_ms,
            )
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(f"Redis failed while {what}: {e}") from e

    # --- lifecycle of a binding ----------------------------------------------------------
    def claim(self, session_id: str, agent_id: str) -> str:
        """Bind a new session to ``agent_id``; returns its incarnation nonce.

        Every id that cannot be taken answers the same :class:`SessionExistsError` (409
        ``session_id_unavailable``, one message): the caller's own live id, another agent's,
        one another agent closed less than the session TTL ago (its tombstone, see
        :meth:`release_cmds`), one whose L2 data exists without an owner. So the answer never
        says whether some other agent is using an id: "unavailable" is also what a closed or
        orphaned id answers. The agent that closed an id may take it again at once.
        """
        prefix = session_prefix(session_id)
        wm_keys = [index_key(prefix), *(f"{prefix}{k}:{i}" for k, i in FIXED_KEYS)]
        nonce = new_nonce()
        status = self._run(
            "creating a session",
            self._claim,
            [*self._keys(session_id), *wm_keys],
            [agent_id, self.ttl_s, nonce],
            durable=True,
        )
        if status != "ok":
            raise SessionExistsError(session_id)
        return str(nonce)

    def adopt(self, session_id: str, agent_id: str) -> str:
        """Library code only: bind an existing session (e.g. one a LifecycleManager started
        on the same Redis) to ``agent_id`` so the agent can use it through the service.
        Refuses an id that already has an owner. Returns the nonce for the signed state."""
        nonce = new_nonce()
        try:
            ok = self._r.hsetnx(self.key(session_id), "owner", agent_id)
            if ok:
                self._r.hset(self.key(session_id), mapping={"inc": nonce, "ver": "0"})
                self._r.expire(self.key(session_id), self.ttl_s)
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(f"Redis failed while adopting a session: {e}") from e
        if not ok:
            raise AccessDeniedError(f"session {session_id!r} already has an owner")
        return nonce

    def release(self, session_id: str) -> None:
        try:
            self._r.delete(*self._keys(session_id))
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(f"Redis failed while closing session: {e}") from e

    # --- per request -----------------------------------------------------------------------
    def _access_check(
        self, mode: str, session_id: str, agent_id: str, nonce: str = "", version: int = 0
    ) -> tuple[int, str]:
        try:
            return run(self._r, self.access_op(mode, session_id, agent_id, nonce, version))
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(
                f"Redis failed while checking the session owner: {e}"
            ) from e

    def access_op(
        self, mode: str, session_id: str, agent_id: str, nonce: str = "", version: int = 0
    ) -> Op[tuple[int, str]]:
        """Operation (:mod:`context_core.redis.ops`): the access script for ``mode``
        (``owner``, ``read`` or ``write``: see :meth:`check`, :meth:`verify`,
        :meth:`reserve`); returns the latest version and the lease token (``write``)."""
        token = secrets.token_hex(8) if mode == "write" else ""
        (reply,) = ok(
            (
                yield [
                    script(
                        self._access,
                        self._keys(session_id),
                        [mode, agent_id, self.ttl_s, nonce, version, token, self.lease_ms],
                    )
                ]
            )
        )
        status, current = reply
        now = int(current) if current not in (None, "") else None
        if status == "unknown":
            raise UnknownSessionError(session_id)
        if status == "foreign":
            raise StaleStateError(
                f"state of session {session_id!r} is from an earlier incarnation of the "
                "session (it was closed and created again); use the state the new session "
                f"returned (GET /v1/sessions/{session_id}/state re-fetches the latest)",
                session_id=session_id,
                current_version=now,
            )
        if status == "stale":
            raise StaleStateError(
                f"state version {version} of session {session_id!r} is stale (latest is "
                f"{now}): continue from the latest state; re-fetch it with "
                f"GET /v1/sessions/{session_id}/state",
                session_id=session_id,
                current_version=now,
            )
        if status == "busy":
            raise StaleStateError(
                f"another request with state version {version} of session {session_id!r} is "
                "being applied; only one can win: re-fetch the latest state with "
                f"GET /v1/sessions/{session_id}/state and continue from it",
                session_id=session_id,
                current_version=now,
            )
        return (now or 0), token

    def owner_guard(self, session_id: str, agent_id: str) -> tuple[str, str, str]:
        """``(key, field, value)`` that holds while ``agent_id`` owns the session: a guard for
        writes sent in the same round trip as the access check (the route's activity touch),
        so a refused request changes nothing of a session that is not the caller's."""
        return self.key(session_id), "owner", agent_id

    def check(self, session_id: str, agent_id: str) -> int:
        """The session is ``agent_id``'s (no state involved); returns the latest version."""
        return self._access_check("owner", session_id, agent_id)[0]

    def verify(self, session_id: str, agent_id: str, nonce: str, version: int) -> None:
        """A read with a signed state: owner, incarnation and version must all match."""
        self._access_check("read", session_id, agent_id, nonce, version)

    def reserve(self, session_id: str, agent_id: str, nonce: str, version: int) -> Lease:
        """Like :meth:`verify`, and take the write lease for one event."""
        _, token = self._access_check("write", session_id, agent_id, nonce, version)
        return Lease(session_id, nonce, version, token)

    def reserve_op(self, session_id: str, agent_id: str, nonce: str, version: int) -> Op[Lease]:
        """Operation: :meth:`reserve`."""
        _, token = yield from self.access_op("write", session_id, agent_id, nonce, version)
        return Lease(session_id, nonce, version, token)

    def commit(self, lease: Lease, state_json: str) -> int:
        """Make ``state_json`` (version ``lease.version + 1``) the latest; returns it."""
        new = lease.version + 1
        status = self._run(
            "storing the session state",
            self._commit,
            self._keys(lease.session_id),
            [lease.token, lease.nonce, lease.version, new, state_json, self.ttl_s],
            durable=True,
        )
        if status != "ok":
            raise StaleStateError(
                f"session {lease.session_id!r} moved on while this event was applied (the "
                "write lease expired); re-fetch the latest state with "
                f"GET /v1/sessions/{lease.session_id}/state",
                session_id=lease.session_id,
                current_version=None,
            )
        return new

    def abort(self, lease: Lease) -> None:
        """Give the lease back after a failed event (best effort: it expires anyway)."""
        with contextlib.suppress(*REDIS_ERRORS):
            self._abort(keys=[self.lease_key(lease.session_id)], args=[lease.token])

    def publish_initial(self, session_id: str, state_json: str) -> None:
        """Store a new session's version-0 state for re-fetching."""
        self._run(
            "creating session",
            self._publish,
            [self.state_key(session_id)],
            [state_json, self.ttl_s],
            durable=True,
        )

    def publish_cmd(self, session_id: str, state_json: str) -> Cmd:
        """:meth:`publish_initial` as a command, for a caller that sends it with its own
        round trip (a fire-and-forget write: the creation's deferred writes)."""
        return script(
            self._publish, [self.state_key(session_id)], [state_json, self.ttl_s], durable=True
        )

    def release_cmds(self, session_id: str, agent_id: str) -> list[Cmd]:
        """A close: the owner record, latest state and lease go, and a tombstone
        (``closed_by``, no owner) stays for the session TTL. Requests for the id answer
        ``unknown_session`` like a missing one; another agent's claim of it answers like a
        live id's (:meth:`claim`), so a close does not reveal itself either."""
        key = self.key(session_id)
        return [
            cmd("DEL", *self._keys(session_id)),
            cmd("HSET", key, "closed_by", agent_id),
            cmd("EXPIRE", key, self.ttl_s),
        ]

    def server_state(self, session_id: str) -> str | None:
        """The latest signed state of a session whoever owns it (server-side jobs only, such
        as the idle sweep); ``None`` when the session has none."""
        try:
            (raw,) = ok(execute(self._r, [cmd("GET", self.state_key(session_id))]))
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(f"Redis failed while reading the state: {e}") from e
        if raw is None:
            return None
        return raw if isinstance(raw, str) else bytes(raw).decode()

    def replace_latest(
        self, session_id: str, nonce: str, expected_version: int, state_json: str
    ) -> str:
        """The server's own new state for a session (version ``expected_version + 1``), e.g.
        the idle sweep's trace-cleared one. Applied only if nobody holds the write lease and
        the session is still at ``expected_version`` of incarnation ``nonce``; returns
        ``ok``, ``busy``, ``stale`` or ``unknown`` (nothing changed)."""
        return str(
            self._run(
                "replacing the session state",
                self._replace,
                self._keys(session_id),
                [nonce, expected_version, expected_version + 1, state_json, self.ttl_s],
                durable=True,
            )
        )

    def latest_state(self, session_id: str, agent_id: str) -> str:
        """The latest signed state (JSON) of ``agent_id``'s session."""
        self.check(session_id, agent_id)
        try:
            raw = self._r.get(self.state_key(session_id))
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(f"Redis failed while reading the state: {e}") from e
        if raw is None:
            raise UnknownSessionError(session_id)
        return raw if isinstance(raw, str) else bytes(raw).decode()


# KEYS: 1 live-session zset, 2 this minute's byte counter.
# ARGV: 1 now, 2 session id ('' = none), 3 new session? (1/0), 4 max sessions,
#       5 session ttl s, 6 bytes, 7 max bytes per minute.
QUOTA_LUA = """
local now = tonumber(ARGV[1])
if ARGV[2] ~= '' then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if ARGV[3] == '1' and not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
    if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
      local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
      return {'sessions', math.ceil(tonumber(first[2]) - now)}
    end
  end
end
local used = tonumber(redis.call('GET', KEYS[2]) or '0')
local n = tonumber(ARGV[6])
if n > 0 and used + n > tonumber(ARGV[7]) then return {'bytes', 0} end
if n > 0 then
  redis.call('INCRBY', KEYS[2], n)
  redis.call('EXPIRE', KEYS[2], 120)
end
if ARGV[2] ~= '' and (ARGV[3] == '1' or redis.call('ZSCORE', KEYS[1], ARGV[2])) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[5]), ARGV[2])
  redis.call('EXPIRE', KEYS[1], ARGV[5])
end
return {'ok', 0}
"""


class AgentQuotas:
    """Per-agent limits: live sessions and request-body bytes per minute to writing routes."""

    def __init__(
        self,
        client: RedisClient,
        *,
        max_sessions: int,
        max_bytes_per_min: int,
        session_ttl_s: int,
    ) -> None:
        self._r = client
        self.max_sessions = int(max_sessions)
        self.max_bytes_per_min = int(max_bytes_per_min)
        self.session_ttl_s = int(session_ttl_s)
        self._script = client.register_script(QUOTA_LUA)

    @staticmethod
    def sessions_key(agent_id: str) -> str:
        return f"svc:agent:{{{agent_id}}}:sessions"

    @staticmethod
    def bytes_key(agent_id: str, minute: int) -> str:
        return f"svc:agent:{{{agent_id}}}:wbytes:{minute}"

    def charge(
        self, agent_id: str, nbytes: int, *, session_id: str = "", new_session: bool = False
    ) -> None:
        """Count ``nbytes`` against this minute's budget and (re)register ``session_id`` as
        live; a new session beyond the live-session cap, or bytes beyond the budget, raise
        :class:`QuotaExceededError` and count nothing."""
        try:
            run(
                self._r,
                self.charge_op(agent_id, nbytes, session_id=session_id, new_session=new_session),
            )
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(f"Redis failed while checking quotas: {e}") from e

    def charge_op(
        self, agent_id: str, nbytes: int, *, session_id: str = "", new_session: bool = False
    ) -> Op[None]:
        """Operation (:mod:`context_core.redis.ops`): :meth:`charge`."""
        now = time.time()
        minute = int(now // 60)
        (reply,) = ok(
            (
                yield [
                    script(
                        self._script,
                        [self.sessions_key(agent_id), self.bytes_key(agent_id, minute)],
                        [
                            repr(now),
                            session_id,
                            "1" if new_session else "0",
                            self.max_sessions,
                            self.session_ttl_s,
                            int(nbytes),
                            self.max_bytes_per_min,
                        ],
                    )
                ]
            )
        )
        status, wait = reply
        if status == "sessions":
            raise QuotaExceededError(
                f"agent {agent_id!r} already holds {self.max_sessions} live sessions "
                "(CTX_MAX_LIVE_SESSIONS_PER_AGENT); close some with DELETE "
                "/v1/sessions/{id} or wait for them to expire",
                quota="live_sessions",
                limit=self.max_sessions,
                retry_after_s=int(wait),
            )
        if status == "bytes":
            raise QuotaExceededError(
                f"agent {agent_id!r} sent more than {self.max_bytes_per_min} bytes to writing "
                "endpoints this minute (CTX_MAX_WRITE_BYTES_PER_AGENT_PER_MIN); retry after "
                "the Retry-After seconds",
                quota="write_bytes_per_min",
                limit=self.max_bytes_per_min,
                retry_after_s=math.ceil((minute + 1) * 60 - now),
            )

    def forget_cmds(self, agent_id: str, session_id: str) -> list[Cmd]:
        """:meth:`forget` as commands (with the close's other cleanup in one round trip)."""
        return [cmd("ZREM", self.sessions_key(agent_id), session_id)]

    def forget(self, agent_id: str, session_id: str) -> None:
        """The session is closed: it no longer counts as live."""
        try:
            self._r.zrem(self.sessions_key(agent_id), session_id)
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(f"Redis failed while closing session: {e}") from e
