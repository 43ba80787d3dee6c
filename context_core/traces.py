"""Route traces: one JSON line per routing decision, the raw material of CER.

Evaluation computes the Context Effectiveness Rate from these files, so the schema is a
contract: every record is validated against the pydantic models below *before* it is written,
and an invalid record raises instead of leaving a line evaluation would trip over.

Files: ``<CTX_DATA_DIR>/traces/traces-YYYY-MM-DD.jsonl`` (UTC date of the record). Two kinds
of record share a file:

``kind = "route"`` (written by :class:`context_core.router.ContextRouter` on every route)::

    {"schema": 1, "kind": "route", "trace_id": "<uuid4 hex>", "ts": "<ISO-8601 UTC>",
     "session_id": str, "step": int, "intent": str, "agent_id": str | null,
     "l2": {"requested": [key], "found": [key], "missing": [key], "expired": [key]},
     "l3": {"requested": bool, "query": str (gateway-cleaned), "used": bool,
            "error": str | null,
            "hits": [{"id", "score", "label", "source", "section"}]},
     "ns": {"requested": [ref], "found": [ref], "denied": [ref]},
     "fragments": [{"layer": "L1"|"L2"|"L3"|"NS", "source", "confidence", "label"}],
     "degraded": bool,
     "timings_ms": {"l1", "l2", "l3", "total"}}

``l2`` keys are full Redis keys (``wm:{<sid>}:<kind>:<id>``); ``expired`` lists keys this
router had found earlier in the same session and now misses (so evaluation can tell decay from
never-written); a key is in ``missing`` whenever absent, expired or not. ``ns`` refs are
``"<namespace>/<key>"``. ``l3.hits`` lists every hit with its label, including the ones dropped
as below skip; ``l3.used`` says whether any L3 fragment reached the bundle.

``kind = "step_output"`` (written by :meth:`TraceWriter.record_output` once the agent has
produced the step's output, so CER can check the context was *used*)::

    {"schema": 1, "kind": "step_output", "trace_id", "ts", "session_id", "step", "output": str}

Query text and step outputs pass the sanitize gateway before they touch disk.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from context_core.errors import DataValidationError

if TYPE_CHECKING:
    from context_core.config import Settings
    from context_core.gateway import Gateway

__all__ = [
    "SCHEMA_VERSION",
    "RouteTrace",
    "StepOutputTrace",
    "TraceWriter",
    "new_trace_id",
    "read_traces",
    "trace_file",
    "validate_record",
]

SCHEMA_VERSION = 1
FILE_PREFIX = "traces-"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class L2Trace(_Strict):
    requested: list[str]
    found: list[str]
    missing: list[str]
    expired: list[str]


class L3Hit(_Strict):
    id: str
    score: float
    label: Literal["confident", "low_confidence", "below_skip"]
    source: str
    section: str | None


class L3Trace(_Strict):
    requested: bool
    query: str
    hits: list[L3Hit]
    used: bool
    error: str | None


class NsTrace(_Strict):
    requested: list[str]
    found: list[str]
    denied: list[str]


class FragmentTrace(_Strict):
    layer: Literal["L1", "L2", "L3", "NS"]
    source: str
    confidence: float
    label: str


class Timings(_Strict):
    l1: float = Field(ge=0)
    l2: float = Field(ge=0)
    l3: float = Field(ge=0)
    total: float = Field(ge=0)


class RouteTrace(_Strict):
    """One routing decision (``kind = "route"``)."""

    schema_: Literal[1] = Field(alias="schema")
    kind: Literal["route"]
    trace_id: str = Field(min_length=1)
    ts: str
    session_id: str = Field(min_length=1)
    step: int
    intent: str = Field(min_length=1)
    agent_id: str | None
    l2: L2Trace
    l3: L3Trace
    ns: NsTrace
    fragments: list[FragmentTrace]
    degraded: bool
    timings_ms: Timings


class StepOutputTrace(_Strict):
    """The agent's output for a routed step (``kind = "step_output"``)."""

    schema_: Literal[1] = Field(alias="schema")
    kind: Literal["step_output"]
    trace_id: str = Field(min_length=1)
    ts: str
    session_id: str = Field(min_length=1)
    step: int
    output: str


_MODELS: dict[str, type[_Strict]] = {"route": RouteTrace, "step_output": StepOutputTrace}


def validate_record(record: dict[str, Any]) -> None:
    """Raise :class:`DataValidationError` naming the bad fields if ``record`` breaks the schema."""
    kind = record.get("kind")
    model = _MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise DataValidationError(
            "trace record has no valid 'kind'",
            [f"kind={kind!r}; expected one of {sorted(_MODELS)}"],
        )
    try:
        model.model_validate(record)
        dt.datetime.fromisoformat(record["ts"])
    except ValidationError as e:
        raise DataValidationError(
            f"{kind} trace record breaks schema {SCHEMA_VERSION}",
            [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()],
        ) from e
    except ValueError as e:
        raise DataValidationError(
            f"{kind} trace record breaks schema {SCHEMA_VERSION}", [f"ts: {e}"]
        ) from e


def new_trace_id() -> str:
    return uuid.uuid4().hex


def utc_now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def trace_file(traces_dir: Path, day: dt.date) -> Path:
    return traces_dir / f"{FILE_PREFIX}{day.isoformat()}.jsonl"


class TraceWriter:
    """Appends validated trace records to the daily JSONL file; safe across threads.

    Each record is encoded first and written with a single ``write`` on an ``O_APPEND``
    descriptor, so lines from several threads (or processes on one host) never interleave.
    """

    def __init__(self, traces_dir: Path, *, gateway: Gateway | None = None) -> None:
        if gateway is None:
            from context_core.gateway import Gateway

            gateway = Gateway()
        self.traces_dir = Path(traces_dir)
        self._gateway = gateway
        self._lock = threading.Lock()
        self._fd: int | None = None  # O_APPEND descriptor of the current day's file
        self._fd_path: Path | None = None

    @classmethod
    def from_settings(cls, settings: Settings, gateway: Gateway | None = None) -> TraceWriter:
        return cls(settings.traces_dir, gateway=gateway)

    def clean_query(self, query: str) -> str:
        """The query text as it may be stored: secrets and PII removed by the gateway."""
        return self._gateway.clean_text(query, where="trace.l3.query")

    def write_route(self, record: dict[str, Any]) -> dict[str, Any]:
        """Validate and append one ``route`` record (``l3.query`` is cleaned here)."""
        rec = dict(record)
        rec.setdefault("schema", SCHEMA_VERSION)
        rec.setdefault("kind", "route")
        rec.setdefault("ts", utc_now_iso())
        l3 = dict(rec.get("l3") or {})
        if isinstance(l3.get("query"), str):
            l3["query"] = self.clean_query(l3["query"])
        rec["l3"] = l3
        self._append(rec)
        return rec

    def record_output(self, trace_id: str, session_id: str, step: int, output: str) -> None:
        """Append the agent's output for the step routed under ``trace_id``."""
        rec = {
            "schema": SCHEMA_VERSION,
            "kind": "step_output",
            "trace_id": trace_id,
            "ts": utc_now_iso(),
            "session_id": session_id,
            "step": step,
            "output": self._gateway.clean_text(output, where="trace.step_output"),
        }
        self._append(rec)

    def _append(self, rec: dict[str, Any]) -> None:
        validate_record(rec)
        day = dt.datetime.fromisoformat(rec["ts"]).astimezone(dt.UTC).date()
        line = (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        with self._lock:
            # Keep the day's descriptor open (a route is hot path); reopen when the day
            # changes or the file was removed/rotated under us.
            path = self._fd_path
            if path is None or path.stem[-10:] != day.isoformat():
                path = trace_file(self.traces_dir, day)
            if self._fd is None or self._fd_path != path or not path.exists():
                self._close_fd()
                path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
                self._fd_path = path
            os.write(self._fd, line)

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._fd_path = None, None

    def close(self) -> None:
        """Close the open trace file (writing again reopens it)."""
        with self._lock:
            self._close_fd()

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)


def _as_utc(value: dt.datetime | dt.date | None, *, end: bool) -> dt.datetime | None:
    if value is None:
        return None
    if not isinstance(value, dt.datetime):
        t = dt.time.max if end else dt.time.min
        return dt.datetime.combine(value, t, tzinfo=dt.UTC)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def read_traces(
    traces_dir: Path,
    since: dt.datetime | dt.date | None = None,
    until: dt.datetime | dt.date | None = None,
    *,
    kind: Literal["route", "step_output"] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield records (oldest file first) with ``since <= ts <= until``; dates are inclusive.

    Naive datetimes are taken as UTC. Blank lines are skipped; a line that is not JSON raises
    :class:`DataValidationError` naming the file and line, since silently skipping it would
    bias CER.
    """
    lo, hi = _as_utc(since, end=False), _as_utc(until, end=True)
    files = sorted(Path(traces_dir).glob(f"{FILE_PREFIX}*.jsonl"))
    for path in files:
        try:
            day = dt.date.fromisoformat(path.stem.removeprefix(FILE_PREFIX))
        except ValueError:
            continue
        if (lo and day < lo.date()) or (hi and day > hi.date()):
            continue
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataValidationError(
                        f"trace file {path} has a corrupt line", [f"line {n}: {e}"]
                    ) from e
                if kind and rec.get("kind") != kind:
                    continue
                if lo or hi:
                    ts = dt.datetime.fromisoformat(rec["ts"])
                    if (lo and ts < lo) or (hi and ts > hi):
                        continue
                yield rec
