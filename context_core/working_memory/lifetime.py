"""Session activity, idle timeout and expired-key detection: how long a session lives.

Activity. Every lifecycle event and every route calls :meth:`LifetimeOps.touch`: the task
contract's TTL slides to ``contract_ttl_s`` (a contract marked ``expired`` by a timeout is
resumed), the history's to ``contract_history_ttl_s``, and the session's last activity is
recorded in the global Sorted Set ``ctx:activity`` (member = session id, score = epoch
seconds). That Set is how the idle sweep finds sessions untouched for ``idle_s``
(``CTX_SESSION_IDLE_S``, 90 s) without scanning: :meth:`WorkingMemory.idle_sessions`.

Cluster rule. ``ctx:activity`` is one key for all sessions, so it lives in its own slot:
it is written by a separate command, pipelined with the session's script in the same round
trip, never inside a script that also declares session keys (a script's keys must share a
slot). Every script here declares only ``wm:{<sid>}:...`` keys.

Timeout (:meth:`LifetimeOps.timeout`, the ``session_timeout`` event and the idle sweep):
every key of the session is deleted except the contract and its history, which stay; the
contract is marked ``expired``; the deleted keys are remembered as expired; the session
leaves ``ctx:activity``.

Expired keys (:meth:`LifetimeOps.key_expired`): "this key was written in this session and
is gone now", answered by Redis from the key index (listed but gone) and the expired Set
(pruned by a sweep or deleted by a timeout), so every process and worker gives the same
answer. Details in :mod:`.index`.
"""

from __future__ import annotations

from typing import Any

from context_core.redis.connection import is_cluster_client
from context_core.redis.ops import Cmd, Op, cmd, ok, script
from context_core.working_memory.contract import ContractOps
from context_core.working_memory.index import INDEX_ADD_LUA, IndexOps
from context_core.working_memory.keys import ACTIVITY_KEY

__all__ = ["ACTIVITY_KEY", "KEY_EXPIRED_LUA", "TOUCH_GUARDED_LUA", "TOUCH_LUA", "LifetimeOps"]

# The body of a session's activity. KEYS: 1 contract hash, 2 history list, 3 index, 4 expired
# Set. ARGV: 1 contract ttl seconds, 2 history ttl seconds, 3 now.
# A completed contract is left as it is (the goal was reached: it expires after the grace
# period); an expired one becomes active again. Never creates a contract.
_TOUCH_BODY = """
local resumed = 0
local ttl = tonumber(ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then
  local status = redis.call('HGET', KEYS[1], '_status')
  if status ~= 'completed' then
    if status == 'expired' then
      redis.call('HSET', KEYS[1], '_status', 'active', '_status_at', ARGV[3])
      resumed = 1
    end
    redis.call('EXPIRE', KEYS[1], ttl)
    index_add(KEYS[3], ttl, KEYS[1])
  end
end
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('EXPIRE', KEYS[2], ARGV[2]) end
if redis.call('EXISTS', KEYS[4]) == 1 then redis.call('EXPIRE', KEYS[4], ttl) end
-- a live session's index outlives its short-lived members, so a key that expired is still
-- known as written (key_expired) while the session is active, with or without a contract
local ipttl = redis.call('PTTL', KEYS[3])
if ipttl >= 0 and ipttl < ttl * 1000 then redis.call('EXPIRE', KEYS[3], ttl) end
"""

# Session activity (see _TOUCH_BODY). Returns 1 when an expired contract was resumed, else 0.
TOUCH_LUA = INDEX_ADD_LUA + _TOUCH_BODY + "return resumed\n"

# Session activity only if a guard holds: KEYS 1-4 and ARGV 1-3 as TOUCH_LUA, KEYS[5] a Hash
# of the same slot, ARGV 4 a field of it and ARGV 5 the value it must hold (the caller's
# "this session is mine": the service's owner record); then, when KEYS[6] is given (a single
# server: the activity Set is another slot on a cluster), ZADD KEYS[6] ARGV[3] ARGV[6].
# Returns -1 (nothing touched) when the guard does not hold, else as TOUCH_LUA.
TOUCH_GUARDED_LUA = (
    INDEX_ADD_LUA
    + """
if redis.call('HGET', KEYS[5], ARGV[4]) ~= ARGV[5] then return -1 end
"""
    + _TOUCH_BODY
    + """
if KEYS[6] then redis.call('ZADD', KEYS[6], ARGV[3], ARGV[6]) end
return resumed
"""
)

# KEYS: 1 the key, 2 index, 3 expired Set.  1 = written in this session and gone now.
KEY_EXPIRED_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('SISMEMBER', KEYS[3], KEYS[1]) == 1 then return 1 end
return redis.call('SISMEMBER', KEYS[2], KEYS[1])
"""


class LifetimeOps(IndexOps, ContractOps):
    """Activity, timeout and expired-key answers for one session (see the module doc)."""

    __slots__ = ()

    def touch(self) -> None:
        """Record session activity (one round trip; none of its own inside a
        :meth:`~context_core.working_memory.WorkingMemory.deferred` scope, where it joins the
        scope's next round trip).

        The contract's TTL slides to ``contract_ttl_s`` (an ``expired`` one is resumed, a
        ``completed`` one left alone), the history's to ``contract_history_ttl_s``, the
        expired Set's and the key index's to at least ``contract_ttl_s`` (so an expired key
        is still known as written while the session is active), and
        ``ZADD ctx:activity <now> <sid>``. The ZADD is a separate command in the same
        pipeline, not part of the script: its key is global, the script's keys are all in
        this session's slot (on a Redis Cluster, two calls: the slots are on different
        nodes anyway, see :mod:`context_core.redis.ops`). The Set is ``wm.activity_key``
        (``ctx:activity`` unless configured).
        """
        cmds = self.touch_cmds()
        if self.wm.deferring:
            for c in cmds:
                self.wm.defer(c)
            return
        self.wm.run(_replies(cmds), f"touch {self._sid}")

    def touch_cmds(self) -> list[Cmd]:
        """The commands of :meth:`touch` (the script, then the activity ZADD), for a caller
        that sends them with its own round trip (the router, with its reads)."""
        wm = self.wm
        current, hist = self._contract_keys()
        now = wm.now()
        return [
            script(
                wm.script(TOUCH_LUA),
                [current, hist, self._idx, self._exp],
                [wm.contract_ttl_s, wm.contract_history_ttl_s, repr(now)],
            ),
            cmd("ZADD", wm.activity_key, now, self._sid),
        ]

    def touch_op(self, guard: tuple[str, str, str] | None = None) -> Op[bool]:
        """Operation: :meth:`touch`; True when the session was touched.

        ``guard`` ``(hash key, field, value)``, a Hash of this session's slot: touch only if
        the field holds the value, in the same script (the service's "the caller owns this
        session", so a request that turns out refused leaves another agent's session as it
        was). On a single server the activity ZADD is inside that script too; on a cluster
        (another slot) it follows in a second round, only when the guard held."""
        if guard is None:
            yield from _replies(self.touch_cmds())
            return True
        wm = self.wm
        current, hist = self._contract_keys()
        now = wm.now()
        g_key, g_field, g_value = guard
        if _hash_tag(g_key) != self._sid:  # one script, one slot
            raise ValueError(f"touch guard {g_key!r} is not in session {self._sid!r}'s slot")
        keys = [current, hist, self._idx, self._exp, g_key]
        args: list[Any] = [
            wm.contract_ttl_s,
            wm.contract_history_ttl_s,
            repr(now),
            g_field,
            g_value,
        ]
        cluster = is_cluster_client(wm._client)
        if not cluster:
            keys.append(wm.activity_key)
            args.append(self._sid)
        (done,) = ok((yield [script(wm.script(TOUCH_GUARDED_LUA), keys, args)]))
        if int(done) < 0:
            return False
        if cluster:
            ok((yield [cmd("ZADD", wm.activity_key, now, self._sid)]))
        return True

    def key_expired(self, key: str) -> bool:
        """True when ``key`` (one of this session's) was written in this session and is gone
        now: listed in the key index but missing, or remembered by a sweep or a timeout.
        Decided in Redis, so every process gives the same answer; a key that exists, or was
        never written, is not expired. A :meth:`clear` forgets everything."""
        return self.wm.run(self.key_expired_op(key), f"expired? {key}")

    def key_expired_op(self, key: str) -> Op[bool]:
        """Operation: :meth:`key_expired`."""
        self._own(key)
        (found,) = ok(
            (yield [script(self.wm.script(KEY_EXPIRED_LUA), [key, self._idx, self._exp], [])])
        )
        return bool(found)

    def timeout(self) -> dict[str, Any]:
        """The session timed out: every key deleted except the task contract and its history,
        which stay; the contract is marked ``expired`` (resumed by the next activity); the
        deleted keys are remembered as expired; the session leaves ``ctx:activity``.

        Returns ``{"deleted": n, "contract_version": v, "contract_status": s}`` (version 0
        and status ``"none"`` when the session had no contract).
        """
        current, hist = self._contract_keys()
        deleted = sum(self._sweep("timeout", {"keep": [current, hist]}))
        c = self.expire_contract()
        self.wm.forget_activity(self._sid)
        return {
            "deleted": int(deleted),
            "contract_version": c.version,
            "contract_status": c.status if c.version else "none",
        }


def _replies(cmds: list[Cmd]) -> Op[list[Any]]:
    """Operation: send ``cmds``, raise the first error reply, return the replies."""
    return ok((yield cmds))


def _hash_tag(key: str) -> str | None:
    """The Redis Cluster hash tag of ``key`` (what between its first ``{`` and the next ``}``
    decides its slot), None when it has none."""
    start = key.find("{")
    end = key.find("}", start + 1) if start >= 0 else -1
    return key[start + 1 : end] if start >= 0 and end > start + 1 else None
