"""The versioned task contract: what the user asked for, as agreed, with every version kept.

Writers race (several agent processes, retries), so an update names the version it read and
a Lua script applies it only if that is still current: optimistic locking in one round trip,
no WATCH retry loop inside. Each accepted version is appended to a history list for audit.

Lifetime (the reference design: the contract lives for the task, up to 2 h; its versions
are kept for audit). The current hash lives ``contract_ttl_s`` (``CTX_WM_CONTRACT_TTL_S``,
7200 s) from the session's last activity: every write sets it, and every event or route
refreshes it (:meth:`~.lifetime.LifetimeOps.touch`), so a 47-minute session never loses its
goal while its 15-minute step data decays around it. The history list lives
``contract_history_ttl_s`` (``CTX_WM_CONTRACT_HISTORY_TTL_S``, 30 days) from its last write
or touch. Neither uses the 15-minute L2 default.

Bounded history: every write (and the completion snapshot) trims the list, in the same
script, to ``CTX_WM_CONTRACT_HISTORY_VERSIONS`` versions and drops versions older than
``CTX_WM_CONTRACT_HISTORY_DAYS`` (the newest always stays); the dropped ones are archived
into the audit log as digests (:func:`context_core.audit_trail.archive_history`: version,
time, SHA-256, the field names the version wrote; the session as its SHA-256; never values).
``ctx retention enforce`` bounds lists no write has touched since
(:meth:`ContractOps.trim_contract_history`).

Status (``_status`` in the hash, :attr:`TaskContract.status`):

* ``active``: being worked on (also a hash written before statuses existed);
* ``expired``: the session timed out (idle sweep or ``session_timeout``); the contract is
  kept, and the session's next activity resumes it (``active`` again);
* ``completed``: the goal was achieved; the completed version is archived as one more
  history entry and the contract is no longer refreshed or resumed by activity. A new
  version written with :meth:`~ContractOps.update_contract` starts it again (``active``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from context_core.audit_trail import archive_history, digest_snapshots
from context_core.errors import ContextError, ContractLockedError, VersionConflictError
from context_core.redis.ops import Op, cmd, ok
from context_core.working_memory.base import SessionBase
from context_core.working_memory.index import INDEX_ADD_LUA
from context_core.working_memory.keys import canonical

__all__ = [
    "CONTRACT_LUA",
    "CONTRACT_STATUSES",
    "CONTRACT_STATUS_LUA",
    "HISTORY_TRIM_LUA",
    "HISTORY_TRIM_ONLY_LUA",
    "LOCK_LUA",
    "ContractOps",
    "TaskContract",
    "contract_from_hash",
]

#: The values of :attr:`TaskContract.status`.
CONTRACT_STATUSES = ("active", "expired", "completed")


@dataclass(frozen=True, slots=True)
class TaskContract:
    """One version of a session's task contract (what the user asked for, as agreed)."""

    version: int
    fields: dict[str, Any]
    corrected: bool = False
    locked: bool = False
    updated_at: float = 0.0
    status: str = "active"


# Lua snippet: the contract hash as a JSON object (one history entry).
_SNAPSHOT_LUA = """
local function snapshot(key)
  local all = redis.call('HGETALL', key)
  local snap = {}
  for i = 1, #all, 2 do snap[all[i]] = all[i + 1] end
  return cjson.encode(snap)
end
"""

# Lua snippet: bound the history list to ``keep`` versions and drop, from the oldest, those
# written before ``oldest`` (epoch seconds), never the newest; LTRIM in the same script (no
# extra round trip). Returns the dropped snapshots, oldest first, for the caller to archive.
HISTORY_TRIM_LUA = """
local function trim_history(key, keep, oldest)
  local n = redis.call('LLEN', key)
  local drop = math.max(n - keep, 0)
  while drop < n - 1 do
    local ok, e = pcall(cjson.decode, redis.call('LINDEX', key, drop))
    local at = ok and type(e) == 'table' and tonumber(e['_updated_at']) or nil
    if at == nil or at >= oldest then break end
    drop = drop + 1
  end
  if drop == 0 then return {} end
  local gone = redis.call('LRANGE', key, 0, drop - 1)
  redis.call('LTRIM', key, drop, -1)
  return gone
end
"""

# Atomic optimistic update of a task contract (one round trip, no WATCH retries inside).
# KEYS: 1 contract hash, 2 history list, 3 session key index.  ARGV: 1 expected version,
# 2 JSON object of field -> JSON-encoded value, 3 corrected "1"/"0", 4 now, 5 contract ttl
# seconds, 6 history ttl seconds, 7 history versions kept, 8 oldest history time kept.  The
# history is found by name, never listed in the index (an older version of this script
# listed it: it is unlisted here). ``_changed``: the field names this version wrote (the
# archived digest names them).  Returns {'ok', new version, snapshot JSON of the version
# written, dropped history snapshots} or {'conflict'|'locked', current version}.
CONTRACT_LUA = (
    INDEX_ADD_LUA
    + _SNAPSHOT_LUA
    + HISTORY_TRIM_LUA
    + """
local cur = tonumber(redis.call('HGET', KEYS[1], '_version') or '0')
if redis.call('HGET', KEYS[1], '_locked') == '1' then return {'locked', cur} end
if cur ~= tonumber(ARGV[1]) then return {'conflict', cur} end
local new = cur + 1
local fields = cjson.decode(ARGV[2])
local names = {}
for k, v in pairs(fields) do
  redis.call('HSET', KEYS[1], 'f:' .. k, v)
  names[#names + 1] = k
end
table.sort(names)
redis.call('HSET', KEYS[1], '_version', new, '_corrected', ARGV[3], '_updated_at', ARGV[4],
           '_locked', '0', '_status', 'active', '_changed', cjson.encode(names))
local snap = snapshot(KEYS[1])
redis.call('RPUSH', KEYS[2], snap)
local gone = trim_history(KEYS[2], tonumber(ARGV[7]), tonumber(ARGV[8]))
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[6])
redis.call('SREM', KEYS[3], KEYS[2])
index_add(KEYS[3], tonumber(ARGV[5]), KEYS[1])
return {'ok', new, snap, gone}
"""
)

# Bound an existing history list (the retention job, for lists written before the bound).
# KEYS: 1 history list.  ARGV: 1 versions kept, 2 oldest time kept.  Returns the dropped.
HISTORY_TRIM_ONLY_LUA = (
    HISTORY_TRIM_LUA
    + """
if redis.call('TYPE', KEYS[1])['ok'] ~= 'list' then return {} end
return trim_history(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]))
"""
)

# KEYS: 1 contract hash, 2 index.  ARGV: 1 lock flag "1"/"0", 2 contract ttl seconds.
LOCK_LUA = (
    INDEX_ADD_LUA
    + """
redis.call('HSET', KEYS[1], '_locked', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
index_add(KEYS[2], tonumber(ARGV[2]), KEYS[1])
return 1
"""
)

# Change the contract's status. KEYS: 1 contract hash, 2 history list.  ARGV: 1 new status
# (expired | completed), 2 now, 3 history ttl seconds, 4 history versions kept, 5 oldest
# history time kept.  A contract that does not exist (or has no version) is left alone; a
# completed one stays completed (archived once). 'completed' appends the completed snapshot
# to the history (bounded as by CONTRACT_LUA). Returns {status, hash fields, dropped}.
CONTRACT_STATUS_LUA = (
    _SNAPSHOT_LUA
    + HISTORY_TRIM_LUA
    + """
if tonumber(redis.call('HGET', KEYS[1], '_version') or '0') == 0 then
  return {'none', {}, {}}
end
local cur = redis.call('HGET', KEYS[1], '_status') or 'active'
local gone = {}
if cur ~= 'completed' and cur ~= ARGV[1] then
  redis.call('HSET', KEYS[1], '_status', ARGV[1], '_status_at', ARGV[2])
  if ARGV[1] == 'completed' then
    redis.call('RPUSH', KEYS[2], snapshot(KEYS[1]))
    gone = trim_history(KEYS[2], tonumber(ARGV[4]), tonumber(ARGV[5]))
    redis.call('EXPIRE', KEYS[2], ARGV[3])
  end
end
return {redis.call('HGET', KEYS[1], '_status'), redis.call('HGETALL', KEYS[1]), gone}
"""
)


def contract_from_hash(h: Mapping[str, str]) -> TaskContract:
    """Decode the contract hash (or a history snapshot of it)."""
    return TaskContract(
        version=int(h.get("_version", 0)),
        fields={k[2:]: json.loads(v) for k, v in h.items() if k.startswith("f:")},
        corrected=h.get("_corrected") == "1",
        locked=h.get("_locked") == "1",
        updated_at=float(h.get("_updated_at", 0.0)),
        status=h.get("_status") or "active",
    )


def _pairs(flat: list[str]) -> dict[str, str]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


class ContractOps(SessionBase):
    """The task contract of one session: Hash ``contract:current`` + List ``contract:history``."""

    __slots__ = ()

    def contract(self) -> TaskContract:
        """The current contract; version 0 with no fields when none was written yet (or it
        is gone)."""
        return self.wm.run(self.contract_op(), f"HGETALL {self._contract_keys()[0]}")

    def contract_op(self) -> Op[TaskContract]:
        """Operation (:mod:`context_core.redis.ops`): :meth:`contract`."""
        key, _ = self._contract_keys()
        (h,) = ok((yield [cmd("HGETALL", key)]))
        return contract_from_hash(h)

    def contract_version(self) -> int:
        """The current contract's version alone: one ``HGET`` of ``_version`` (0 when none
        was written yet, or it is gone). The cheap "did it change?" read of pollers."""
        key, _ = self._contract_keys()
        with self.wm._guard(f"HGET {key} _version"):
            raw = self._r.hget(key, "_version")
        return int(raw) if raw else 0

    def update_contract(
        self, fields: Mapping[str, Any], *, expected_version: int, corrected: bool = False
    ) -> TaskContract:
        """Merge ``fields`` into the contract if it is still at ``expected_version``.

        A stale version raises :class:`VersionConflictError` (its ``current_version`` is
        the version to re-read and retry on); a locked contract raises
        :class:`ContractLockedError`. Each new version is appended to the history and is
        ``active``. ``corrected`` marks a version written because the user corrected the
        agent. The contract then lives ``contract_ttl_s`` and the history
        ``contract_history_ttl_s``. Returns exactly the version written (not a later one
        another writer may have added since).
        """
        if not fields:
            raise ContextError("update_contract: fields must not be empty")
        bad = [k for k in fields if not isinstance(k, str) or not k]
        if bad:
            raise ContextError(f"update_contract: field names must be non-empty strings: {bad!r}")
        key, hist = self._contract_keys()
        cleaned = self._gw.clean(dict(fields), where="L2.contract")
        encoded = json.dumps({k: canonical(v) for k, v in cleaned.items()})
        wm = self.wm
        with wm._guard(f"contract update {key}", flush=False):
            status, version, *written = wm._write(
                wm.script(CONTRACT_LUA),
                keys=[key, hist, self._idx],
                args=[
                    int(expected_version),
                    encoded,
                    "1" if corrected else "0",
                    repr(wm._now()),
                    wm.contract_ttl_s,
                    wm.contract_history_ttl_s,
                    *wm.history_bounds(),
                ],
            )
        if status == "conflict":
            raise VersionConflictError(
                f"task contract of session {self.session_id!r} is at version {version}, "
                f"expected {expected_version}: re-read it with contract() and retry",
                current_version=int(version),
                expected_version=int(expected_version),
            )
        if status == "locked":
            raise ContractLockedError(
                f"task contract of session {self.session_id!r} (version {version}) is locked; "
                "unlock_contract() first (the recovery_complete event, after error recovery)"
            )
        if len(written) > 1:
            self._archive(written[1])
        if written:  # the snapshot of the version this call wrote
            return contract_from_hash(json.loads(written[0]))
        return self.contract()

    def contract_history(self) -> list[TaskContract]:
        """Every version ever written (within the history's retention), oldest first; a
        completed task ends with its archived ``completed`` snapshot."""
        _, hist = self._contract_keys()
        with self.wm._guard(f"LRANGE {hist}"):
            raw = self._r.lrange(hist, 0, -1)
        return [contract_from_hash(json.loads(r)) for r in raw]

    def lock_contract(self) -> None:
        self._set_lock("1")

    def unlock_contract(self) -> None:
        self._set_lock("0")

    def _set_lock(self, flag: str) -> None:
        key, _ = self._contract_keys()
        with self.wm._guard(f"HSET {key} _locked", flush=False):
            self.wm._write(
                self.wm.script(LOCK_LUA), keys=[key, self._idx], args=[flag, self.wm.contract_ttl_s]
            )

    def expire_contract(self) -> TaskContract:
        """Mark the contract ``expired`` (the session timed out) and keep it, with its TTL.

        A completed contract stays completed; without a contract nothing happens (version 0
        is returned). The session's next activity resumes it.
        """
        return self._set_status("expired")

    def complete_contract(self) -> TaskContract:
        """Mark the contract ``completed`` and archive that snapshot at the end of the
        history (kept ``contract_history_ttl_s``). Idempotent: a completed contract is
        archived once. Without a contract nothing happens (version 0 is returned)."""
        return self._set_status("completed")

    def _set_status(self, status: str) -> TaskContract:
        key, hist = self._contract_keys()
        wm = self.wm
        with wm._guard(f"contract status {key}", flush=False):
            _, flat, *gone = wm._write(
                wm.script(CONTRACT_STATUS_LUA),
                keys=[key, hist],
                args=[status, repr(wm._now()), wm.contract_history_ttl_s, *wm.history_bounds()],
            )
        if gone:
            self._archive(gone[0])
        return contract_from_hash(_pairs(flat))

    def trim_contract_history(self, *, now: float | None = None, dry_run: bool = False) -> int:
        """Bound this session's existing history (one written before the bound, or one no
        write has touched since): drop what :meth:`update_contract` would, archive it as
        digests; returns how many went (``dry_run``: would go, nothing changed). ``now``:
        the time the age bound is measured from (default: the store's clock)."""
        _, hist = self._contract_keys()
        wm = self.wm
        if dry_run:
            keep, oldest = wm.history_bounds(now)
            with wm._guard(f"LRANGE {hist}"):
                raw = self._r.lrange(hist, 0, -1)
            drop = max(len(raw) - keep, 0)
            while drop < len(raw) - 1:
                try:
                    at = float(json.loads(raw[drop]).get("_updated_at"))
                except (TypeError, ValueError):
                    break
                if at >= oldest:
                    break
                drop += 1
            return drop
        with wm._guard(f"contract history trim {hist}", flush=False):
            gone = wm._write(
                wm.script(HISTORY_TRIM_ONLY_LUA), keys=[hist], args=[*wm.history_bounds(now)]
            )
        self._archive(gone or [], now)
        return len(gone or [])

    def _archive(self, snapshots: list[str], now: float | None = None) -> None:
        """Dropped history versions into the audit trail as digests (never values)."""
        if snapshots and self.wm.history_audit_path is not None:
            archive_history(
                self.wm.history_audit_path,
                kind="contract_history_archive",
                ts=self.wm.now() if now is None else now,
                entries=digest_snapshots(snapshots),
                # the session as its SHA-256: the audit trail keeps no id an erasure removes
                session_sha256=hashlib.sha256(self.session_id.encode()).hexdigest(),
            )
