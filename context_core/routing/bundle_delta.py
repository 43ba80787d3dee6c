"""A routed bundle's relation to its base (:class:`BundleDelta`) and its delta wire form.

The value types both :mod:`.bundle` (``ContextBundle.delta``, ``to_delta_dict``) and
:mod:`.delta` (the bundle log that computes them) use; here so neither imports the other's
module for them. :mod:`.delta` re-exports both names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BundleDelta", "delta_wire"]


@dataclass(frozen=True)
class BundleDelta:
    """How a routed bundle relates to its base: per delivered fragment its id, hash and
    whether the base held it unchanged; the base's ids no longer delivered."""

    bundle_id: str
    base_bundle_id: str | None
    ids: tuple[str, ...]
    hashes: tuple[str, ...]
    unchanged: tuple[bool, ...]
    removed: tuple[str, ...]

    @property
    def full(self) -> bool:
        return self.base_bundle_id is None


def delta_wire(
    head: Mapping[str, Any], fragments: Sequence[Mapping[str, Any]], delta: BundleDelta
) -> dict[str, Any]:
    """The delta wire form (:class:`~context_core.session.wire.BundleDeltaWire`) of a bundle whose
    full wire form is ``head`` (everything but ``fragments``) with ``fragments``."""
    full: list[dict[str, Any]] = []
    refs: list[dict[str, Any]] = []
    for pos, (w, fid, h, same) in enumerate(
        zip(fragments, delta.ids, delta.hashes, delta.unchanged, strict=True)
    ):
        if same:
            refs.append(
                {
                    "id": fid,
                    "hash": h,
                    "layer": w["layer"],
                    "freshness_hours": w["freshness_hours"],
                    "pos": pos,
                }
            )
        else:
            full.append({**w, "hash": h, "pos": pos})
    return {
        "session_id": head["session_id"],
        "step": head["step"],
        "intent": head["intent"],
        "resolved_intent": head["resolved_intent"],
        "bundle_id": delta.bundle_id,
        "base_bundle_id": delta.base_bundle_id,
        "full": delta.full,
        "fragments": full,
        "unchanged": refs,
        "removed": list(delta.removed),
        "degraded": head["degraded"],
        "timings_ms": head["timings_ms"],
        "context_used": head["context_used"],
        "trace_id": head["trace_id"],
        "prompt": head.get("prompt"),
    }
