"""The health report's records: what one snapshot holds, and the history of past ones.

:mod:`.health` takes the snapshot, :mod:`.report` writes it out; both use these types and
the history helpers from here, so neither imports the other for them (:mod:`.health`
re-exports every name).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from context_core.fsutil import atomic_write_text

if TYPE_CHECKING:
    from evaluation.cer import CerReport

__all__ = [
    "HealthSnapshot",
    "IngestStats",
    "L1Probe",
    "L2Stats",
    "L3Stats",
    "LowConfidenceQuery",
    "expiry_rate",
    "load_history",
    "previous_record",
    "store_snapshot",
]


@dataclass(frozen=True, slots=True)
class L1Probe:
    n_instances: int
    bytes_per_instance: float  # tracemalloc: everything one realistic state keeps alive
    getsizeof_bytes: int  # the slotted object alone
    trace_pairs: int
    mutation_attempts: int
    violations: int  # attempts that changed the state; must be 0
    violation_details: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class L2Stats:
    dbsize: int
    wm_keys: int  # keys under wm:* seen by SCAN
    wm_keys_exact: bool  # False when the SCAN budget ran out (then wm_keys is a lower bound)
    expired_keys_total: int  # INFO stats expired_keys (since server start)
    run_id: str
    sampled: int
    hot_patterns: tuple[tuple[str, int, float | None], ...]  # (pattern, keys in sample, idle s)


@dataclass(frozen=True, slots=True)
class L3Stats:
    points: Mapping[str, int]  # collection -> points (absent collections are left out)
    models: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class LowConfidenceQuery:
    ts: str
    intent: str
    query: str
    best_score: float | None  # None: L3 returned no hit
    trace_id: str


@dataclass(frozen=True, slots=True)
class IngestStats:
    runs: int  # refresh runs in the period that left quarantine/warning lines
    quarantined: int  # quarantined page lines in the period
    warnings: int
    last_run_id: str | None
    last_run_quarantined: int
    top_reasons: tuple[tuple[str, int], ...]  # reason prefix -> count, most common first


@dataclass(frozen=True)
class HealthSnapshot:
    day: str
    taken_at: str
    l1: L1Probe | None
    l2: L2Stats | None
    l3: L3Stats | None
    low_confidence: tuple[LowConfidenceQuery, ...]
    cer: CerReport | None
    accept: float
    errors: Mapping[str, str] = field(default_factory=dict)  # section -> why it is missing
    ingest: IngestStats | None = None

    def history_record(self) -> dict[str, Any]:
        """The compact per-day figures kept in the history file."""
        rec: dict[str, Any] = {"day": self.day, "taken_at": self.taken_at}
        if self.l1:
            rec["l1"] = {"bytes_per_instance": round(self.l1.bytes_per_instance, 1),
                         "getsizeof": self.l1.getsizeof_bytes,
                         "violations": self.l1.violations}  # fmt: skip
        if self.l2:
            rec["l2"] = {"wm_keys": self.l2.wm_keys, "dbsize": self.l2.dbsize,
                         "expired_keys_total": self.l2.expired_keys_total,
                         "run_id": self.l2.run_id}  # fmt: skip
        if self.l3:
            rec["l3"] = dict(self.l3.points)
        if self.cer and self.cer.overall.n_steps:
            rec["cer"] = round(self.cer.overall.cer, 6)
        if self.ingest:
            rec["ingest"] = {"quarantined": self.ingest.quarantined,
                             "last_run_quarantined": self.ingest.last_run_quarantined}  # fmt: skip
        return rec


def load_history(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn line from a crashed run: ignore, the day is re-recorded
    return sorted(out, key=lambda r: r.get("day", ""))


def store_snapshot(path: Path, snap: HealthSnapshot) -> list[dict[str, Any]]:
    """Replace (or add) ``snap.day`` in the history file; return the new history, oldest first."""
    history = [r for r in load_history(path) if r.get("day") != snap.day]
    history.append(snap.history_record())
    history.sort(key=lambda r: r["day"])
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in history))
    return history


def previous_record(history: Sequence[Mapping[str, Any]], day: str) -> Mapping[str, Any] | None:
    before = [r for r in history if r.get("day", "") < day]
    return before[-1] if before else None


def expiry_rate(
    current: L2Stats, taken_at: str, prev: Mapping[str, Any] | None
) -> tuple[int | None, float | None]:
    """(keys expired since the previous run, per hour); None when not comparable (first run,
    or the server restarted so its counter reset)."""
    if not prev or "l2" not in prev:
        return None, None
    p = prev["l2"]
    if p.get("run_id") != current.run_id or current.expired_keys_total < p["expired_keys_total"]:
        return None, None
    delta = current.expired_keys_total - int(p["expired_keys_total"])
    hours = dt.datetime.fromisoformat(taken_at) - dt.datetime.fromisoformat(prev["taken_at"])
    h = hours.total_seconds() / 3600
    return delta, (delta / h if h > 0 else None)
