"""The per-session key index: how a session finds its own keys without scanning the keyspace.

Why: closing a session (``clear``), a timeout, a context overflow and a reached goal all act
on "every key of this session". Finding them by ``SCAN MATCH wm:{<sid>}:*`` costs O(keys in
the whole database) per call — ruinous at 100k live sessions — and on Redis Cluster a SCAN
covers one node only (a client must walk every master). Instead each session keeps a Set
``wm:{<sid>}:index`` of its key names. The hash tag puts it in the same slot as the keys it
lists, so every script below is a legal single-slot call on a cluster.

Invariants (kept by the Lua in this module, which every write path embeds):

* **Membership**: every write adds its key to the index *inside the same script* as the
  write, so no key exists without being listed (no window where a crash loses it). The one
  exception is the contract history (``contract:history``): an audit record kept for its own
  retention (``CTX_WM_CONTRACT_HISTORY_TTL_S``, 30 days), found by its fixed name like the
  other fixed-name keys. Listing it would keep every session's index alive for 30 days.
* **Lifetime**: the index lives at least as long as its longest-lived *member*. A write with
  TTL ``t`` raises the index TTL to ``t`` if it is shorter (and sets it if the write
  created the index). The pending-task Set never expires (a forgotten task id is a lost
  task), so while it exists the index has no TTL either; when the last task is removed, or
  a sweep gives the Set a TTL, the index is *refitted* to its longest member's TTL. So the
  index never outlives its session's data by more than nothing, and never dies before it.
  :meth:`~.lifetime.LifetimeOps.touch` keeps it alive as long as the (sliding) contract.
* **Lazy pruning, remembered**: members whose keys expired stay listed until a sweep
  (``keys``, ``expire``, ``refit``, ``timeout``) sees them gone and removes them. A pruned
  member is moved to ``wm:{<sid>}:expired`` (a Set in the same slot, declared in the
  script's ``KEYS``), so "this key was written in this session and is gone now"
  (:meth:`~.lifetime.LifetimeOps.key_expired`, the router's ``l2.expired``) is answered by
  Redis the same way before and after a sweep, from any process. The expired Set lives
  ``CTX_WM_CONTRACT_TTL_S`` from its last change or the session's last activity (bounded,
  like the session); ``clear`` deletes it (a cleared session forgets everything), a
  ``timeout`` adds every key it deletes to it.

Sweeps read the members (one SMEMBERS) and then run one atomic script with every key it
touches declared in ``KEYS`` (Redis' rule for scripts, and what lets a cluster route and
migrate the slot safely). A key written between the two calls is *unlisted* in that
snapshot: the script leaves it alone and still listed (``clear`` then keeps the index alive
for it, so no key is ever orphaned), reports how many there were, and the caller sweeps
again, up to :data:`SWEEP_ROUNDS` times. So a sweep always finishes, even while writers
keep going; only keys written during it may survive a ``clear``. Members outside the
session's prefix can only come from a hand-edited index; a sweep drops them from the index
and never touches those keys.

The fixed-name keys (pending tasks, plan, contract and its history) are always swept by
name too. That is what makes a SCAN fallback unnecessary for sessions written before the
index existed: their fixed-name keys (among them the only key without a TTL, the pending
Set) are still found by name, and every other key of theirs carries a TTL and expires on
its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from context_core.redis.ops import cmd, execute, ok
from context_core.working_memory.base import SessionBase
from context_core.working_memory.keys import check_kind, expired_key, index_key

__all__ = [
    "API_PUT_LUA",
    "FIXED_KEYS",
    "INDEX_ADD_LUA",
    "INDEX_SWEEP_LUA",
    "PENDING_ADD_LUA",
    "PENDING_REMOVE_LUA",
    "PLAN_APPLY_LUA",
    "SERIES_ADD_LUA",
    "SWEEP_ROUNDS",
    "IndexOps",
    "expired_key",
    "index_key",
]

#: ``(kind, ident)`` of the keys whose names never vary: swept by name as well as by index.
FIXED_KEYS: tuple[tuple[str, str], ...] = (
    ("pending", "tasks"),
    ("plan", "current"),
    ("contract", "current"),
    ("contract", "history"),
)

#: How many snapshots a sweep takes at most while concurrent writes keep adding keys.
SWEEP_ROUNDS = 5


# Prepended to every write script. index_add(idx, ttl, key...): list the keys and keep the
# index alive >= ttl seconds; ttl < 0 means the member never expires, so neither does the
# index. An existing index without TTL has a member without TTL (the pending Set): it stays.
INDEX_ADD_LUA = """
local function index_add(idx, ttl, ...)
  local existed = redis.call('EXISTS', idx)
  redis.call('SADD', idx, ...)
  if ttl < 0 then
    redis.call('PERSIST', idx)
    return
  end
  local cur = redis.call('PTTL', idx)
  if existed == 0 or (cur >= 0 and cur < ttl * 1000) then
    redis.call('EXPIRE', idx, ttl)
  end
end
"""

# KEYS: 1 string key, 2 index.  ARGV: 1 body, 2 ttl seconds.
API_PUT_LUA = (
    INDEX_ADD_LUA
    + """
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
index_add(KEYS[2], tonumber(ARGV[2]), KEYS[1])
return 1
"""
)

# KEYS: 1 series zset, 2 index.  ARGV: 1 window, 2 ttl seconds, then score, member pairs
# (every point of one event in one round trip).
SERIES_ADD_LUA = (
    INDEX_ADD_LUA
    + """
for i = 3, #ARGV, 2 do
  redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[1]) + 1))
redis.call('EXPIRE', KEYS[1], ARGV[2])
index_add(KEYS[2], tonumber(ARGV[2]), KEYS[1])
return 1
"""
)

# KEYS: 1 pending set, 2 index.  ARGV: 1 task id.  The set (and so the index) never expires.
PENDING_ADD_LUA = (
    INDEX_ADD_LUA
    + """
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('PERSIST', KEYS[1])
index_add(KEYS[2], -1, KEYS[1])
return 1
"""
)

# KEYS: 1 pending set.  ARGV: 1 task id.  Returns {removed, set still exists}; the caller
# refits the index when the last task went (the index may now take a TTL again).
PENDING_REMOVE_LUA = """
local removed = redis.call('SREM', KEYS[1], ARGV[1])
return {removed, redis.call('EXISTS', KEYS[1])}
"""

# Replace the stored plan and re-EXPIRE the outputs of its steps, in one atomic call.
# KEYS: 1 plan hash, 2 index, 3.. step keys.  ARGV: 1 plan keep seconds (>= every step TTL,
# so listing the plan with it keeps the index alive for the extended steps too), 2..n+1 the
# step TTLs (same order as the keys), then field, value pairs of the plan hash.
# Returns the EXPIRE replies (1 = the step's output exists and was re-timed).
PLAN_APPLY_LUA = (
    INDEX_ADD_LUA
    + """
local n = #KEYS - 2
redis.call('DEL', KEYS[1])
for i = n + 2, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[1], ARGV[1])
index_add(KEYS[2], tonumber(ARGV[1]), KEYS[1])
local done = {}
for i = 1, n do done[i] = redis.call('EXPIRE', KEYS[i + 2], ARGV[i + 1]) end
return done
"""
)

# One sweep over a session's keys.
# KEYS: 1 index, 2 expired Set, 3.. the snapshot: the members read just before (own prefix
# only) plus the fixed-name keys.  ARGV: 1 op, 2 the session's key prefix, 3 lifetime of the
# expired Set (seconds), 4 JSON options: ttl (expire), only_shorten (expire: EXPIRE ... LT; a
# key without TTL counts as infinite), kinds (expire: only keys of these kinds; absent = all),
# keep (expire/timeout: keys left alone).
# Returns {payload, unlisted}: unlisted = members added since the snapshot (written while
# the sweep ran); they are left alone, still listed, and the caller may sweep again.
#   keys    -> [live keys]       prunes expired members (no snapshot check: unlisted = 0)
#   clear   -> number deleted    members + fixed keys, each SREMed, and the expired Set; the
#                                index goes with the last member (an unlisted one keeps it
#                                alive, so no orphan)
#   timeout -> number deleted    every key but `keep`, each remembered in the expired Set;
#                                then refits the index
#   expire  -> [keys re-timed]   then refits the index TTL
#   refit   -> []                index TTL = its longest member's; none if one never
#                                expires; index deleted when no member is left
# Every op moves the members it finds gone to the expired Set. Only listed members count
# for the index lifetime (the contract history is found by name and not listed, see above).
# With unlisted members the refit only ever raises the TTL: their write scripts already
# made the index outlive them, and their TTLs cannot be read here (undeclared keys).
INDEX_SWEEP_LUA = """
local idx, exp, op, prefix = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local exp_ttl = tonumber(ARGV[3])
local opts = cjson.decode(ARGV[4])
local declared, listed, keep, unlisted = {}, {}, {}, 0
for i = 3, #KEYS do declared[KEYS[i]] = true end
for _, k in ipairs(opts.keep or {}) do keep[k] = true end
if op ~= 'keys' then
  for _, m in ipairs(redis.call('SMEMBERS', idx)) do
    if string.sub(m, 1, #prefix) ~= prefix then
      redis.call('SREM', idx, m)
    else
      listed[m] = true
      if not declared[m] then unlisted = unlisted + 1 end
    end
  end
end
local remembered = false
local function remember(k)
  redis.call('SADD', exp, k)
  remembered = true
end
if op == 'clear' then
  local n = 0
  for i = 3, #KEYS do
    n = n + redis.call('DEL', KEYS[i])
    redis.call('SREM', idx, KEYS[i])
  end
  redis.call('DEL', exp)
  if unlisted == 0 then redis.call('DEL', idx) end
  return {n, unlisted}
end
local deleted = 0
if op == 'timeout' then
  for i = 3, #KEYS do
    local k = KEYS[i]
    if not keep[k] then
      local gone = redis.call('DEL', k)
      deleted = deleted + gone
      if gone == 1 or listed[k] then remember(k) end
      redis.call('SREM', idx, k)
      listed[k] = nil
    end
  end
end
local function selected(k)
  if keep[k] then return false end
  if not opts.kinds then return true end
  for _, kind in ipairs(opts.kinds) do
    local want = prefix .. kind .. ':'
    if string.sub(k, 1, #want) == want then return true end
  end
  return false
end
local live, changed, longest, forever, members = {}, {}, 0, false, 0
for i = 3, #KEYS do
  local k = KEYS[i]
  local p = redis.call('PTTL', k)
  if p == -2 then
    if redis.call('SREM', idx, k) == 1 then remember(k) end
  else
    if op == 'expire' and selected(k) then
      local ok
      if opts.only_shorten then
        ok = redis.call('EXPIRE', k, opts.ttl, 'LT')
      else
        ok = redis.call('EXPIRE', k, opts.ttl)
      end
      if ok == 1 then
        table.insert(changed, k)
        p = redis.call('PTTL', k)
      end
    end
    table.insert(live, k)
    if listed[k] then
      members = members + 1
      if p == -1 then forever = true elseif p > longest then longest = p end
    end
  end
end
if remembered then redis.call('EXPIRE', exp, exp_ttl) end
if op == 'keys' then return {live, 0} end
local cur = redis.call('PTTL', idx)
if forever then
  redis.call('PERSIST', idx)
elseif unlisted > 0 then
  if cur >= 0 and cur < longest then redis.call('PEXPIRE', idx, longest) end
elseif members == 0 then
  redis.call('DEL', idx)
elseif cur ~= -2 then
  redis.call('PEXPIRE', idx, longest)
end
if op == 'timeout' then return {deleted, unlisted} end
return {changed, unlisted}
"""


class IndexOps(SessionBase):
    """A session's housekeeping over its key index: list, re-time, clear (see above)."""

    __slots__ = ()

    def keys(self) -> list[str]:
        """This session's live keys, sorted (the index and expired Set excluded).

        Read from the key index plus the fixed-name keys, never by scanning; members whose
        keys have expired are dropped from the index on the way (and remembered as expired).
        """
        return sorted(self._sweep("keys")[0])

    def expire_all(
        self,
        ttl_s: int,
        *,
        only_shorten: bool,
        kinds: Sequence[str] | None = None,
        keep: Sequence[str] = (),
    ) -> list[str]:
        """Set a TTL of ``ttl_s`` on this session's keys (of ``kinds`` only, if given; never
        on the keys in ``keep``).

        ``only_shorten``: ``EXPIRE ... LT``, so a key only ever loses time (a key without
        TTL, like the pending Set, counts as infinite and gets ``ttl_s``). Otherwise the TTL
        is set as given, longer or shorter. The index TTL is then refitted to its longest
        member. Atomic per snapshot of the index; returns the keys whose TTL changed, sorted.
        """
        ttl = self._ttl(ttl_s)
        wanted = [check_kind(k) for k in kinds or ()]
        if kinds is not None and not wanted:
            return []
        opts: dict[str, Any] = {"ttl": ttl, "only_shorten": bool(only_shorten)}
        if kinds is not None:
            opts["kinds"] = wanted
        if keep:
            opts["keep"] = [self._own(k) for k in keep]
        rounds = self._sweep("expire", opts)
        return sorted(set().union(*rounds))

    def clear(self) -> int:
        """Delete every key of this session, its index and its expired Set; returns how many
        keys (index and expired Set not counted). One atomic script over the keys the index
        lists plus the fixed-name ones, no scan of the keyspace. Keys written *while* it
        runs may survive it, still listed in the index (see :mod:`.index`)."""
        return sum(self._sweep("clear"))

    def _sweep(self, op: str, opts: dict[str, Any] | None = None) -> list[Any]:
        """Run :data:`INDEX_SWEEP_LUA` on a snapshot of the index; again on a fresh one while
        keys written meanwhile were left unlisted (at most :data:`SWEEP_ROUNDS`). Returns
        each round's payload."""
        fixed = [f"{self._prefix}{kind}:{ident}" for kind, ident in FIXED_KEYS]
        bookkeeping = {self._idx, self._exp}
        encoded = json.dumps(opts or {})
        payloads: list[Any] = []
        with self.wm._guard(f"{op} via {self._idx}"):
            for _ in range(SWEEP_ROUNDS):
                (members,) = ok(execute(self._r, [cmd("SMEMBERS", self._idx)]))
                own = {m for m in members if m.startswith(self._prefix) and m not in bookkeeping}
                snapshot = sorted(own.union(fixed))
                payload, unlisted = self.wm._write(
                    self.wm.script(INDEX_SWEEP_LUA),
                    keys=[self._idx, self._exp, *snapshot],
                    args=[op, self._prefix, self.wm.contract_ttl_s, encoded],
                )
                payloads.append(payload)
                if not unlisted:
                    break
        return payloads
