"""What a read from L2 returns, and how stored values decode into it.

Kept apart from the stores so the value layout (see :mod:`.memory`) is read in one place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from context_core.working_memory.keys import RESERVED_PREFIX, ttl_from_pttl

__all__ = ["Loaded", "decode_point", "hash_loaded", "string_loaded"]


@dataclass(frozen=True, slots=True)
class Loaded:
    """A value read from L2 with its provenance; ``ttl_s`` None means it never expires."""

    key: str
    value: Any
    stored_at: float
    ttl_s: float | None


def string_loaded(key: str, raw: str, pttl: int) -> Loaded:
    """An API response String (``{"stored_at", "data"}`` JSON) with its PTTL reply."""
    env = json.loads(raw)
    return Loaded(key, env["data"], float(env["stored_at"]), ttl_from_pttl(pttl))


def hash_loaded(key: str, h: Mapping[str, str], pttl: int) -> Loaded:
    """A step-result Hash (JSON values, ``_``-prefixed bookkeeping fields dropped)."""
    stored_at = float(h.get("_stored_at", 0.0))
    value = {k: json.loads(v) for k, v in h.items() if not k.startswith(RESERVED_PREFIX)}
    return Loaded(key, value, stored_at, ttl_from_pttl(pttl))


def decode_point(member: str) -> tuple[float, float]:
    """A series member ``"<ts>|<value>"``."""
    ts, _, val = member.partition("|")
    return float(ts), float(val)
