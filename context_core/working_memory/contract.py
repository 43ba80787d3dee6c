"""The versioned task contract: what the user asked for, as agreed, with every version kept.

Writers race (several agent processes, retries), so an update names the version it read and
a Lua script applies it only if that is still current: optimistic locking in one round trip,
no WATCH retry loop inside. Each accepted version is appended to a history list for audit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from context_core.working_memory.index import INDEX_ADD_LUA

__all__ = ["CONTRACT_LUA", "TaskContract", "contract_from_hash"]


@dataclass(frozen=True, slots=True)
class TaskContract:
    """One version of a session's task contract (what the user asked for, as agreed)."""

    version: int
    fields: dict[str, Any]
    corrected: bool = False
    locked: bool = False
    updated_at: float = 0.0


# Atomic optimistic update of a task contract (one round trip, no WATCH retries inside).
# KEYS: 1 contract hash, 2 history list, 3 session key index.  ARGV: 1 expected version,
# 2 JSON object of field -> JSON-encoded value, 3 corrected "1"/"0", 4 now, 5 ttl seconds.
CONTRACT_LUA = (
    INDEX_ADD_LUA
    + """
local cur = tonumber(redis.call('HGET', KEYS[1], '_version') or '0')
if redis.call('HGET', KEYS[1], '_locked') == '1' then return {'locked', cur} end
if cur ~= tonumber(ARGV[1]) then return {'conflict', cur} end
local new = cur + 1
local fields = cjson.decode(ARGV[2])
for k, v in pairs(fields) do redis.call('HSET', KEYS[1], 'f:' .. k, v) end
redis.call('HSET', KEYS[1], '_version', new, '_corrected', ARGV[3], '_updated_at', ARGV[4],
           '_locked', '0')
local all = redis.call('HGETALL', KEYS[1])
local snap = {}
for i = 1, #all, 2 do snap[all[i]] = all[i + 1] end
redis.call('RPUSH', KEYS[2], cjson.encode(snap))
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
index_add(KEYS[3], tonumber(ARGV[5]), KEYS[1], KEYS[2])
return {'ok', new}
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
    )
