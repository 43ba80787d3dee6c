"""The audit trail: one JSON line per event in ``<data_dir>/audit/audit.jsonl``, and the
digest form in which bounded histories archive the versions they drop.

Histories that keep a bounded number of versions (the compliance profiles' audit entries, the
task contract's history) do not just forget the older ones: :func:`archive_history` appends
one line naming what went, as :class:`HistoryDigest` records: version, time, operator,
SHA-256 of the stored entry and the names of the fields that changed. Never a value: the
line proves what existed and when without keeping what it said.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from context_core.fsutil import append_line

__all__ = [
    "AUDIT_FILE",
    "HistoryDigest",
    "append_audit",
    "archive_history",
    "audit_path",
    "digest_snapshots",
]

AUDIT_FILE = "audit.jsonl"


def audit_path(data_dir: Path) -> Path:
    """``<data_dir>/audit/audit.jsonl``: gateway findings, receipts, archived histories."""
    return data_dir / "audit" / AUDIT_FILE


@dataclass(frozen=True, slots=True)
class HistoryDigest:
    """One archived version of a history: what it was, never what it said."""

    version: int
    at: float  # epoch seconds of the version
    sha256: str  # of the stored entry, as stored
    changed: tuple[str, ...]  # field names that changed in this version
    operator: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "at": self.at,
            "operator": self.operator,
            "sha256": self.sha256,
            "changed": list(self.changed),
        }


def append_audit(path: Path, record: Mapping[str, Any]) -> None:
    """One JSON line in the audit log (:func:`context_core.fsutil.append_line`: one
    ``write`` on an append descriptor, under the file's advisory lock)."""
    append_line(path, json.dumps(record, sort_keys=True, separators=(",", ":")))


def archive_history(
    path: Path,
    *,
    kind: str,
    ts: float,
    entries: Iterable[HistoryDigest],
    **about: Any,
) -> int:
    """Append one ``kind`` line archiving ``entries`` (``about``: whose history it was, as
    ids or digests the caller chose; never values). Returns how many entries; none: no line."""
    items = [e.to_dict() for e in entries]
    if items:
        append_audit(path, {"ts": ts, "kind": kind, **about, "entries": items})
    return len(items)


def digest_snapshots(
    snapshots: Iterable[str], *, field_prefix: str = "f:", before: Mapping[str, Any] | None = None
) -> list[HistoryDigest]:
    """Digests of stored JSON snapshots (the task contract's history entries, oldest first):
    ``_version``, ``_updated_at``, the SHA-256 of the snapshot as stored, and the names of
    the fields the version wrote (``_changed``; without it, the ``field_prefix`` fields that
    differ from the snapshot before it, ``before`` preceding the first: None, every field of
    the first counts as changed)."""
    out: list[HistoryDigest] = []
    prev: Mapping[str, Any] = before or {}
    for raw in snapshots:
        snap = json.loads(raw)
        try:  # the names the version wrote, when the writer recorded them
            changed = sorted(str(k) for k in json.loads(snap["_changed"]))
        except (KeyError, TypeError, ValueError):
            fields = {k: v for k, v in snap.items() if k.startswith(field_prefix)}
            old = {k: v for k, v in prev.items() if k.startswith(field_prefix)}
            changed = sorted(
                k[len(field_prefix) :]
                for k in fields.keys() | old.keys()
                if fields.get(k) != old.get(k)
            )
        try:
            at = float(snap.get("_updated_at", 0.0))
        except (TypeError, ValueError):
            at = 0.0
        out.append(
            HistoryDigest(
                version=int(snap.get("_version", 0)),
                at=at,
                sha256=hashlib.sha256(raw.encode()).hexdigest(),
                changed=tuple(changed),
            )
        )
        prev = snap
    return out
