"""The erasure ledger: what was erased, outside the stores it was erased from.

One JSON line per event in ``<CTX_DATA_DIR>/erasure/ledger.jsonl`` (append-only, mode 0600):

* ``{"kind": "erasure", "id", "at", "org", "subject"}`` written *before* anything is deleted,
  so a crashed erasure is finished by the next :func:`replay`;
* ``{"kind": "sessions", "id", "sessions": [<session digest>]}`` once the erasure has found
  the user's service sessions (their trace lines are found by these digests after a restore).

Only keyed hashes (:func:`context_core.access.subjects.subject_id`, and HMAC-SHA-256 of session
ids under the same key) and organisation ids are written, never a user id or a value. Why a
file apart from Redis, Qdrant and PostgreSQL: a backup of those stores taken before an erasure
brings the erased data back when restored; replaying this ledger after the restore
(``ctx erase --replay``) removes it again. Back the ledger up with (and after) the stores and
keep it as long as the oldest backup.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from context_core.errors import DataValidationError

__all__ = ["ErasureLedger", "LedgerEntry", "session_digest"]

_LOCK = threading.Lock()


def session_digest(key: bytes, session_id: str) -> str:
    """The ledger's name for a session id: 32 hex digits of HMAC-SHA-256."""
    return hmac.new(key, b"session\x00" + session_id.encode(), hashlib.sha256).hexdigest()[:32]


@dataclass(frozen=True)
class LedgerEntry:
    """One erasure as the ledger knows it: whose (subject digest), in which org, when."""

    id: str
    at: float
    org: str
    subject: str
    sessions: frozenset[str] = field(default_factory=frozenset)


class ErasureLedger:
    """Append and read ``ledger.jsonl`` (one process appends at a time per file: each line is
    one ``write`` on an ``O_APPEND`` descriptor, so concurrent writers never interleave)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> ErasureLedger:
        return cls(Path(data_dir) / "erasure" / "ledger.jsonl")

    def _append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
        with _LOCK:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)

    def record_erasure(self, erasure_id: str, at: float, org: str, subject: str) -> None:
        self._append(
            {
                "kind": "erasure",
                "id": erasure_id,
                "at": round(at, 3),
                "org": org,
                "subject": subject,
            }
        )

    def record_sessions(self, erasure_id: str, sessions: Iterable[str]) -> None:
        digests = sorted(set(sessions))
        if digests:
            self._append({"kind": "sessions", "id": erasure_id, "sessions": digests})

    def _lines(self) -> Iterator[tuple[int, dict[str, Any]]]:
        try:
            fh = self.path.open(encoding="utf-8")
        except FileNotFoundError:
            return
        with fh:
            for n, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                try:
                    rec = json.loads(raw)
                except json.JSONDecodeError:
                    if raw.endswith("\n"):
                        raise DataValidationError(
                            f"erasure ledger {self.path} line {n} is not JSON; restore the "
                            "ledger from its backup (never edit it by hand)"
                        ) from None
                    continue  # a torn last line (crash mid-write): its erasure is re-run
                yield n, rec

    def entries(self) -> list[LedgerEntry]:
        """Every erasure, oldest first, with the session digests recorded for it."""
        base: dict[str, dict[str, Any]] = {}
        sessions: dict[str, set[str]] = {}
        for n, rec in self._lines():
            kind, eid = rec.get("kind"), rec.get("id")
            if kind == "erasure" and isinstance(eid, str):
                base[eid] = rec
            elif kind == "sessions" and isinstance(eid, str):
                sessions.setdefault(eid, set()).update(map(str, rec.get("sessions", [])))
            else:
                raise DataValidationError(
                    f"erasure ledger {self.path} line {n}: unknown record kind {kind!r}"
                )
        return [
            LedgerEntry(
                eid,
                float(r["at"]),
                str(r["org"]),
                str(r["subject"]),
                frozenset(sessions.get(eid, ())),
            )
            for eid, r in base.items()
        ]
