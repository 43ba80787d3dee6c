"""The per-session key index: how a session finds its own keys without scanning the keyspace.

Why: closing a session (``clear``), a context overflow and a reached goal all act on "every
key of this session". Finding them by ``SCAN MATCH wm:{<sid>}:*`` costs O(keys in the whole
database) per call — ruinous at 100k live sessions — and on Redis Cluster a SCAN walks one
node only. Instead each session keeps a Set ``wm:{<sid>}:index`` of its key names. The hash
tag puts it in the same slot as the keys it lists, so every script below is a legal
single-slot call on a cluster.

Invariants (kept by the Lua in this module, which every write path embeds):

* **Membership**: every write adds its key to the index *inside the same script* as the
  write, so no key exists without being listed (no window where a crash loses it).
* **Lifetime**: the index lives at least as long as its longest-lived member. A write with
  TTL ``t`` raises the index TTL to ``t`` if it is shorter (and sets it if the write
  created the index). The pending-task Set never expires (a forgotten task id is a lost
  task), so while it exists the index has no TTL either; when the last task is removed, or
  a sweep gives the Set a TTL, the index is *refitted* to its longest member's TTL. So the
  index never outlives its session's data by more than nothing, and never dies before it.
* **Lazy pruning**: members whose keys expired stay listed until a sweep (``keys``,
  ``clear``, ``expire_all``, refit) sees them gone and removes them.

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

__all__ = [
    "API_PUT_LUA",
    "FIXED_KEYS",
    "INDEX_ADD_LUA",
    "INDEX_SWEEP_LUA",
    "LOCK_LUA",
    "PENDING_ADD_LUA",
    "PENDING_REMOVE_LUA",
    "PLAN_APPLY_LUA",
    "SERIES_ADD_LUA",
    "SWEEP_ROUNDS",
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


def index_key(prefix: str) -> str:
    """``wm:{<sid>}:index`` from the session prefix ``wm:{<sid>}:``."""
    return prefix + "index"


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

# KEYS: 1 series zset, 2 index.  ARGV: 1 member, 2 score, 3 window, 4 ttl seconds.
SERIES_ADD_LUA = (
    INDEX_ADD_LUA
    + """
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[3]) + 1))
redis.call('EXPIRE', KEYS[1], ARGV[4])
index_add(KEYS[2], tonumber(ARGV[4]), KEYS[1])
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

# KEYS: 1 contract hash, 2 index.  ARGV: 1 lock flag "1"/"0", 2 ttl seconds.
LOCK_LUA = (
    INDEX_ADD_LUA
    + """
redis.call('HSET', KEYS[1], '_locked', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
index_add(KEYS[2], tonumber(ARGV[2]), KEYS[1])
return 1
"""
)

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
# KEYS: 1 index, 2.. the snapshot: the members read just before (own prefix only) plus the
# fixed-name keys.  ARGV: 1 op, 2 the session's key prefix, 3 ttl seconds (expire),
# 4 "1" = only shorten (EXPIRE ... LT; a key without TTL counts as infinite), 5.. kinds to
# expire (none = all).
# Returns {payload, unlisted}: unlisted = members added since the snapshot (written while
# the sweep ran); they are left alone, still listed, and the caller may sweep again.
#   keys   -> [live keys]        prunes expired members (no snapshot check: unlisted = 0)
#   clear  -> number deleted     members + fixed keys, each SREMed; the index goes with the
#                                last member (an unlisted one keeps it alive, so no orphan)
#   expire -> [keys re-timed]    then refits the index TTL
#   refit  -> []                 index TTL = its longest member's; none if one never
#                                expires; index deleted when no member is left
# With unlisted members the refit only ever raises the TTL: their write scripts already
# made the index outlive them, and their TTLs cannot be read here (undeclared keys).
INDEX_SWEEP_LUA = """
local idx, op, prefix = KEYS[1], ARGV[1], ARGV[2]
local declared, unlisted = {}, 0
for i = 2, #KEYS do declared[KEYS[i]] = true end
if op ~= 'keys' then
  for _, m in ipairs(redis.call('SMEMBERS', idx)) do
    if string.sub(m, 1, #prefix) ~= prefix then
      redis.call('SREM', idx, m)
    elseif not declared[m] then
      unlisted = unlisted + 1
    end
  end
end
if op == 'clear' then
  local n = 0
  for i = 2, #KEYS do
    n = n + redis.call('DEL', KEYS[i])
    redis.call('SREM', idx, KEYS[i])
  end
  if unlisted == 0 then redis.call('DEL', idx) end
  return {n, unlisted}
end
local function selected(k)
  if #ARGV < 5 then return true end
  for i = 5, #ARGV do
    local want = prefix .. ARGV[i] .. ':'
    if string.sub(k, 1, #want) == want then return true end
  end
  return false
end
local live, changed, longest, forever = {}, {}, 0, false
for i = 2, #KEYS do
  local k = KEYS[i]
  local p = redis.call('PTTL', k)
  if p == -2 then
    redis.call('SREM', idx, k)
  else
    if op == 'expire' and selected(k) then
      local ok
      if ARGV[4] == '1' then
        ok = redis.call('EXPIRE', k, ARGV[3], 'LT')
      else
        ok = redis.call('EXPIRE', k, ARGV[3])
      end
      if ok == 1 then
        table.insert(changed, k)
        p = redis.call('PTTL', k)
      end
    end
    table.insert(live, k)
    if p == -1 then forever = true elseif p > longest then longest = p end
  end
end
if op == 'keys' then return {live, 0} end
local cur = redis.call('PTTL', idx)
if forever then
  redis.call('PERSIST', idx)
elseif unlisted > 0 then
  if cur >= 0 and cur < longest then redis.call('PEXPIRE', idx, longest) end
elseif #live == 0 then
  redis.call('DEL', idx)
elseif cur ~= -2 then
  redis.call('PEXPIRE', idx, longest)
end
return {changed, unlisted}
"""
