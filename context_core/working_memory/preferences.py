"""Structured user preferences: ``pref:{<uid>}:<type>`` hashes (value, confidence, last_updated).

Preferences outlive sessions (no TTL) and are keyed by user, not session, so they have their
own view type; like session data, every value passes the sanitize gateway before Redis.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from context_core.errors import ContextError, ContextMissError
from context_core.working_memory.keys import (
    canonical,
    check_kind,
    check_sid,
    pref_pattern,
    pref_prefix,
)

if TYPE_CHECKING:
    from context_core.working_memory.memory import WorkingMemory

__all__ = ["Preference", "Preferences"]


@dataclass(frozen=True, slots=True)
class Preference:
    """A structured user preference: a value and how sure we are of it."""

    type: str
    value: Any
    confidence: float
    last_updated: float


class Preferences:
    """A user's structured preferences: ``pref:{<uid>}:<type>`` hashes, no TTL."""

    def __init__(self, wm: WorkingMemory, user_id: str) -> None:
        self._wm = wm
        self.user_id = check_sid(user_id, "user id")
        self._prefix = pref_prefix(user_id)

    def key(self, pref_type: str) -> str:
        return self._prefix + check_kind(pref_type, "preference type")

    def set(self, pref_type: str, value: Any, *, confidence: float = 1.0) -> Preference:
        if not (isinstance(confidence, int | float) and 0.0 <= confidence <= 1.0):
            raise ContextError(f"preference {pref_type!r}: confidence must be in [0, 1]")
        key = self.key(pref_type)
        cleaned = self._wm._gateway.clean(value, where=f"pref {pref_type}")
        now = self._wm._now()
        with self._wm._guard(f"HSET {key}"):
            self._wm._client.hset(
                key,
                mapping={
                    "value": canonical(cleaned),
                    "confidence": repr(float(confidence)),
                    "last_updated": repr(now),
                },
            )
        return Preference(pref_type, json.loads(canonical(cleaned)), float(confidence), now)

    def get(self, pref_type: str) -> Preference:
        key = self.key(pref_type)
        with self._wm._guard(f"HGETALL {key}"):
            h = self._wm._client.hgetall(key)
        if not h:
            raise ContextMissError(key, f"no {pref_type!r} preference for this user")
        return _pref(pref_type, h)

    def all(self) -> dict[str, Preference]:
        pattern = pref_pattern(self.user_id)
        with self._wm._guard(f"SCAN {pattern}"):
            keys = sorted(self._wm._client.scan_iter(match=pattern, count=500))
            pipe = self._wm._client.pipeline(transaction=False)
            for k in keys:
                pipe.hgetall(k)
            values = pipe.execute() if keys else []
        return {
            k[len(self._prefix) :]: _pref(k[len(self._prefix) :], h)
            for k, h in zip(keys, values, strict=True)
            if h
        }

    def delete(self, pref_type: str) -> bool:
        key = self.key(pref_type)
        with self._wm._guard(f"DEL {key}"):
            return bool(self._wm._client.delete(key))


def _pref(pref_type: str, h: Mapping[str, str]) -> Preference:
    return Preference(
        pref_type, json.loads(h["value"]), float(h["confidence"]), float(h["last_updated"])
    )
