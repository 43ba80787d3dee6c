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

import redis

from context_core.redis_conn import is_cluster_client
from context_core.working_memory.contract import ContractOps
from context_core.working_memory.index import INDEX_ADD_LUA, IndexOps

__all__ = ["ACTIVITY_KEY", "KEY_EXPIRED_LUA", "TOUCH_LUA", "LifetimeOps"]

#: Global Sorted Set of sessions by last activity (member = session id, score = epoch s).
ACTIVITY_KEY = "ctx:activity"

# Session activity. KEYS: 1 contract hash, 2 history list, 3 index, 4 expired Set.
# ARGV: 1 contract ttl seconds, 2 history ttl seconds, 3 now.
# A completed contract is left as it is (the goal was reached: it expires after the grace
# period); an expired one becomes active again. Never creates a contract.
# Returns 1 when an expired contract was resumed, else 0.
TOUCH_LUA = (
    INDEX_ADD_LUA
    + """
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
        """Record session activity (one round trip).

        The contract's TTL slides to ``contract_ttl_s`` (an ``expired`` one is resumed, a
        ``completed`` one left alone), the history's to ``contract_history_ttl_s``, the
        expired Set's and the key index's to at least ``contract_ttl_s`` (so an expired key
        is still known as written while the session is active), and
        ``ZADD ctx:activity <now> <sid>``. The ZADD is a separate command in the same
        pipeline, not part of the script: its key is global, the script's keys are all in
        this session's slot (on a Redis Cluster, two calls: the slots are on different
        nodes anyway). The Set is ``wm.activity_key`` (``ctx:activity`` unless
        configured).
        """
        wm = self.wm
        current, hist = self._contract_keys()
        keys = [current, hist, self._idx, self._exp]
        now = wm.now()
        args: list[Any] = [wm.contract_ttl_s, wm.contract_history_ttl_s, repr(now)]
        with wm._guard(f"touch {self._sid}"):
            if is_cluster_client(self._r):
                # The script's keys and the activity Set live on different slots (nodes), and
                # redis-py's cluster pipeline refuses EVALSHA: two calls, the same order.
                wm._touch_script(keys=keys, args=args)
                self._r.zadd(wm.activity_key, {self._sid: now})
                return
            for attempt in (1, 2):
                pipe = self._r.pipeline(transaction=False)
                pipe.evalsha(wm._touch_script.sha, len(keys), *keys, *args)
                pipe.zadd(wm.activity_key, {self._sid: now})
                replies = pipe.execute(raise_on_error=False)
                err = next((r for r in replies if isinstance(r, Exception)), None)
                if err is None:
                    return
                if attempt == 1 and isinstance(err, redis.exceptions.NoScriptError):
                    # Server restarted or SCRIPT FLUSHed: load once, then one more try (the
                    # ZADD is idempotent, so sending it twice is harmless).
                    self._r.script_load(wm._touch_script.script)
                    continue
                raise err

    def key_expired(self, key: str) -> bool:
        """True when ``key`` (one of this session's) was written in this session and is gone
        now: listed in the key index but missing, or remembered by a sweep or a timeout.
        Decided in Redis, so every process gives the same answer; a key that exists, or was
        never written, is not expired. A :meth:`clear` forgets everything."""
        self._own(key)
        with self.wm._guard(f"expired? {key}"):
            return bool(self.wm._key_expired_script(keys=[key, self._idx, self._exp]))

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
