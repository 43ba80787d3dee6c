"""Structured user preferences: ``pref:{<org>:<uid>}:<type>`` hashes (value, confidence,
last_updated).

Preferences outlive sessions (no TTL) and are keyed by user, not session, so they have their
own view type; like session data, every value passes the sanitize gateway before Redis.

A user id means something only inside its organisation, so the key holds both: the agent of
another organisation that sends the same user id reaches another user's (empty) preferences.
The user id is compared in its canonical form
(:func:`context_core.gateway.identity.canonical_user_id`).

How a user's preferences are listed without scanning the keyspace: a Set
``pref:{<org>:<uid>}:_index`` (same hash tag, so same slot) holds the user's preference *types*.
:meth:`Preferences.set` and :meth:`Preferences.delete` change the hash and the index in one
Lua script, so the two never disagree; :meth:`Preferences.all` reads the index and then the
hashes it names (two round trips, O(preferences of that user)). ``_index`` starts with an
underscore, which a preference type never does (:func:`.keys.check_kind`). Preferences
written before the index existed are not listed by ``all()`` until set again (``get`` still
reads them).

The user id in the key is the user id itself when it fits the key alphabet, else a hash of
it (:func:`.keys.user_key_id`), so any client-given user id (an e-mail address) has
preferences, and none can address another user's keys.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from context_core.errors import ContextError, ContextMissError
from context_core.gateway.identity import canonical_user_id
from context_core.redis.ops import Op, cmd, ok
from context_core.working_memory.keys import (
    canonical,
    check_kind,
    pref_index_key,
    pref_prefix,
    user_key_id,
)

if TYPE_CHECKING:
    from context_core.working_memory.store import Store

__all__ = ["PREF_DELETE_LUA", "PREF_SET_LUA", "Preference", "Preferences"]

# KEYS: 1 preference hash, 2 the user's index.  ARGV: 1 type, 2 value, 3 confidence,
# 4 last_updated.  No TTL on either: preferences outlive sessions.
PREF_SET_LUA = """
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'confidence', ARGV[3], 'last_updated', ARGV[4])
redis.call('SADD', KEYS[2], ARGV[1])
return 1
"""

# KEYS: 1 preference hash, 2 the user's index.  ARGV: 1 type.  Returns 1 if it existed.
PREF_DELETE_LUA = """
local n = redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return n
"""


@dataclass(frozen=True, slots=True)
class Preference:
    """A structured user preference: a value and how sure we are of it."""

    type: str
    value: Any
    confidence: float
    last_updated: float


class Preferences:
    """A user's structured preferences: ``pref:{<org>:<uid>}:<type>`` hashes, no TTL."""

    def __init__(self, wm: Store, org_id: str, user_id: str) -> None:
        self._wm = wm
        self.org_id = org_id
        self.user_id = canonical_user_id(user_id)
        self._uid = user_key_id(self.user_id)
        self._prefix = pref_prefix(org_id, self._uid)
        self._index = pref_index_key(org_id, self._uid)

    @property
    def key_id(self) -> str:
        """The id inside this user's keys: ``user_id`` itself, or its hash when it is outside
        the key alphabet (:func:`.keys.user_key_id`)."""
        return self._uid

    @property
    def prefix(self) -> str:
        """``pref:{<org>:<uid>}:``: what every key of this user starts with."""
        return self._prefix

    @property
    def index_key(self) -> str:
        """``pref:{<org>:<uid>}:_index``: the Set of this user's preference types."""
        return self._index

    def key(self, pref_type: str) -> str:
        return self._prefix + check_kind(pref_type, "preference type")

    def set(self, pref_type: str, value: Any, *, confidence: float = 1.0) -> Preference:
        if not (isinstance(confidence, int | float) and 0.0 <= confidence <= 1.0):
            raise ContextError(f"preference {pref_type!r}: confidence must be in [0, 1]")
        key = self.key(pref_type)
        cleaned = self._wm._gateway.clean(value, where=f"pref {pref_type}")
        encoded = canonical(cleaned)
        now = self._wm._now()
        with self._wm._guard(f"HSET {key}"):
            self._wm._write(
                self._wm.script(PREF_SET_LUA),
                keys=[key, self._index],
                args=[pref_type, encoded, repr(float(confidence)), repr(now)],
            )
        return Preference(pref_type, json.loads(encoded), float(confidence), now)

    def get(self, pref_type: str) -> Preference:
        return self._wm.run(self.get_op(pref_type), f"HGETALL {self.key(pref_type)}")

    def get_op(self, pref_type: str) -> Op[Preference]:
        """Operation (:mod:`context_core.redis.ops`): :meth:`get`."""
        key = self.key(pref_type)
        (h,) = ok((yield [cmd("HGETALL", key)]))
        if not h:
            raise ContextMissError(key, f"no {pref_type!r} preference for this user")
        return _pref(pref_type, h)

    def all(self) -> dict[str, Preference]:
        """Every preference of this user, by type, read through the user's index (no SCAN)."""
        return self._wm.run(self.all_op(), f"SMEMBERS {self._index}")

    def all_op(self) -> Op[dict[str, Preference]]:
        """Operation: :meth:`all` (two rounds when the user has preferences: the index, then
        the values)."""
        (members,) = ok((yield [cmd("SMEMBERS", self._index)]))
        types = sorted(t for t in members if _valid(t))
        if not types:
            return {}
        values = ok((yield [cmd("HGETALL", self._prefix + t) for t in types]))
        return {t: _pref(t, h) for t, h in zip(types, values, strict=True) if h}

    def delete(self, pref_type: str) -> bool:
        key = self.key(pref_type)
        with self._wm._guard(f"DEL {key}", flush=False):
            return bool(
                self._wm._write(
                    self._wm.script(PREF_DELETE_LUA), keys=[key, self._index], args=[pref_type]
                )
            )


def _valid(pref_type: str) -> bool:
    try:
        check_kind(pref_type)
    except ContextError:
        return False
    return True


def _pref(pref_type: str, h: Mapping[str, str]) -> Preference:
    return Preference(
        pref_type, json.loads(h["value"]), float(h["confidence"]), float(h["last_updated"])
    )
