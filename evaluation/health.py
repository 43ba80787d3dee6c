"""The daily context-health snapshot: is each memory layer behaving as designed?

* L1: how much memory a realistic :class:`~context_core.session.state.SessionState` costs
  (tracemalloc over a batch of probe instances, plus ``sys.getsizeof``), and whether any attempt
  to mutate one in place succeeds (immutability violations; must be 0).
* L2: keys under ``wm:*`` (SCAN with a bounded budget, never ``KEYS *``), ``DBSIZE``, the
  expiry rate (``INFO stats`` ``expired_keys`` delta since the previous run), and the 10
  hottest key patterns in a SCAN sample (ids replaced by ``*``) with their mean idle time.
* L3: points per collection and growth since the previous run; the 5 lowest-confidence L3
  queries of the period (from traces).
* Ingest: quarantined pages and warnings of the last knowledge-refresh run and of the period,
  with the most common reasons (from the append-only ``quarantine.jsonl`` history).
* CER over the period and its week-over-week change.

Computing (this module) is separate from drawing and writing (:mod:`evaluation.report`). Each
run's figures are kept in ``<data_dir>/health/history.jsonl``, one record per day: a re-run on
the same day replaces that day's record, so the job is idempotent per day.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import statistics
import sys
import tracemalloc
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from context_core.redis.connection import is_cluster_client
from evaluation.health_history import (
    HealthSnapshot,
    IngestStats,
    L1Probe,
    L2Stats,
    L3Stats,
    LowConfidenceQuery,
    expiry_rate,
    load_history,
    previous_record,
    store_snapshot,
)

if TYPE_CHECKING:
    import redis

    from context_core.config import Settings
    from context_core.knowledge.store import VectorStore

__all__ = [
    "HealthSnapshot",
    "IngestStats",
    "L1Probe",
    "L2Stats",
    "L3Stats",
    "LowConfidenceQuery",
    "expiry_rate",
    "key_pattern",
    "load_history",
    "lowest_confidence_queries",
    "previous_record",
    "probe_l1",
    "run_health_report",
    "sample_l2",
    "snapshot",
    "store_snapshot",
    "summarise_ingest",
    "summarise_l3",
]


# --- L1 ------------------------------------------------------------------------------------


def _probe_state(i: int, gateway: Any) -> Any:
    from context_core.session.state import SessionState

    state = SessionState.start(
        f"probe-{i}", "probe-user", f"PUMP-{i:04d} vibration high since 06:00?", gateway=gateway
    )
    for j in range(10):  # a full trace: 10 call/result pairs
        cid = f"c{j}"
        state = state.record_tool_call(
            "get_sensor", {"device": f"PUMP-{i:04d}", "n": j}, call_id=cid
        )
        state = state.record_tool_result(cid, {"rms_mm_s": 4.5 + j, "ok": True}, status="ok")
    return state.advance(current_step=3, last_device_id=f"PUMP-{i:04d}")


def _mutation_attempts(state: Any) -> tuple[int, list[str]]:
    """Try every way a caller could change a state in place; list the ones that worked."""
    attempts = 0
    worked: list[str] = []
    before = repr(state)
    for f in dataclasses.fields(state):
        attempts += 1
        try:
            setattr(state, f.name, None)
            worked.append(f"setattr {f.name}")
        except (AttributeError, TypeError, dataclasses.FrozenInstanceError):
            pass
        attempts += 1
        try:
            delattr(state, f.name)
            worked.append(f"delattr {f.name}")
        except (AttributeError, TypeError, dataclasses.FrozenInstanceError):
            pass
    attempts += 1
    try:
        state.__dict__["user_query"] = "changed"  # no __dict__ on a slotted class
        worked.append("__dict__ write")
    except (AttributeError, TypeError):
        pass
    attempts += 1
    try:
        state.trace.append(None)  # tuple: no append
        worked.append("trace.append")
    except AttributeError:
        pass
    if repr(state) != before and not worked:
        worked.append("state changed by an unknown path")
    return attempts, worked


def probe_l1(n: int = 200) -> L1Probe:
    """Build ``n`` realistic states (10 trace pairs each), measure them, try to mutate one."""
    from context_core.gateway.sanitize import Gateway

    gateway = Gateway()
    _probe_state(0, gateway)  # warm caches (regexes, interned names) outside the measurement
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        states = [_probe_state(i, gateway) for i in range(n)]
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        if not was_tracing:
            tracemalloc.stop()
    attempts, worked = _mutation_attempts(states[0])
    return L1Probe(
        n_instances=n,
        bytes_per_instance=used / n,
        getsizeof_bytes=sys.getsizeof(states[0]),
        trace_pairs=len(states[0].trace) // 2,
        mutation_attempts=attempts,
        violations=len(worked),
        violation_details=tuple(worked),
    )


# --- L2 ------------------------------------------------------------------------------------

_HASH_TAG = re.compile(r"\{[^}]*\}")
_ID_SEGMENT = re.compile(r"^(?:[0-9a-f]{8,}|[0-9a-f-]{32,36}|.*\d.*)$", re.IGNORECASE)


def key_pattern(key: str) -> str:
    """``wm:{sess-42}:api:9f2c...`` -> ``wm:{*}:api:*``: hash tags and id-like parts become *."""
    key = _HASH_TAG.sub("{*}", key)
    parts = key.split(":")
    return ":".join(p if p == "{*}" or not _ID_SEGMENT.match(p) else "*" for p in parts)


def sample_l2(
    client: redis.Redis,
    *,
    match: str = "wm:*",
    scan_budget: int = 50_000,
    sample_size: int = 2_000,
    scan_count: int = 1_000,
    top: int = 10,
) -> L2Stats:
    """Count ``match`` keys with SCAN (at most ``scan_budget``) and sample all keys for patterns.

    Never ``KEYS *``: SCAN returns in bounded steps and does not block the server.
    """
    wm = 0
    exact = True
    for _ in client.scan_iter(match=match, count=scan_count):
        wm += 1
        if wm >= scan_budget:
            exact = False
            break
    sample: list[str] = []
    for key in client.scan_iter(count=scan_count):
        sample.append(key.decode() if isinstance(key, bytes) else str(key))
        if len(sample) >= sample_size:
            break
    idle: dict[str, list[int]] = defaultdict(list)
    if sample:
        pipe = client.pipeline(transaction=False)
        for key in sample:
            pipe.object("idletime", key)
        for key, value in zip(sample, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(value, int):
                idle[key_pattern(key)].append(value)
    counts = Counter(key_pattern(k) for k in sample)
    hot = tuple(
        (p, c, statistics.fmean(idle[p]) if idle.get(p) else None)
        for p, c in sorted(counts.items(), key=lambda pc: (-pc[1], pc[0]))[:top]
    )
    if is_cluster_client(client):  # every primary's figures: one node holds a third
        from redis.cluster import RedisCluster

        primaries = RedisCluster.PRIMARIES
        stats = client.info("stats", target_nodes=primaries)
        servers = client.info("server", target_nodes=primaries)
        dbsize = int(client.dbsize(target_nodes=primaries))
        expired = sum(int(i.get("expired_keys", 0)) for i in stats.values())
        run_id = ",".join(str(servers[n].get("run_id", "")) for n in sorted(servers))
    else:
        info = client.info("stats")
        dbsize = int(client.dbsize())
        expired = int(info.get("expired_keys", 0))
        run_id = str(client.info("server").get("run_id", ""))
    return L2Stats(
        dbsize=dbsize,
        wm_keys=wm,
        wm_keys_exact=exact,
        expired_keys_total=expired,
        run_id=run_id,
        sampled=len(sample),
        hot_patterns=hot,
    )


# --- L3 ------------------------------------------------------------------------------------


def summarise_l3(store: VectorStore, collections: Sequence[str]) -> L3Stats:
    points: dict[str, int] = {}
    models: dict[str, str] = {}
    for name in collections:
        info = store.info(name)
        if info is not None:
            points[name] = info.count
            models[name] = info.model
    return L3Stats(points=points, models=models)


def lowest_confidence_queries(
    records: Sequence[Mapping[str, Any]], *, n: int = 5
) -> tuple[LowConfidenceQuery, ...]:
    """The ``n`` routed L3 queries whose best hit scored lowest (no hit at all ranks first)."""
    rows = []
    for rec in records:
        if rec.get("kind", "route") != "route":
            continue
        l3 = rec.get("l3") or {}
        if not l3.get("requested"):
            continue
        scores = [float(h["score"]) for h in l3.get("hits") or []]
        best = max(scores) if scores else None
        rows.append(
            LowConfidenceQuery(
                ts=str(rec.get("ts", "")), intent=str(rec.get("intent", "")),
                query=str(l3.get("query", "")), best_score=best,
                trace_id=str(rec.get("trace_id", "")),
            )
        )  # fmt: skip
    rows.sort(key=lambda r: (r.best_score is not None, r.best_score or 0.0, r.ts))
    return tuple(rows[:n])


# --- ingest (knowledge refresh) ------------------------------------------------------------


def _reason_kind(reason: str) -> str:
    """A reason without its specifics (sizes, ids, paths), so equal causes count together."""
    head = reason.split(":", 1)[0].split("(", 1)[0]
    return re.sub(r"\d[\d,.]*", "N", head).strip()[:80]


def summarise_ingest(
    records: Sequence[Mapping[str, Any]], *, since: dt.date, day: dt.date
) -> IngestStats:
    """Quarantine history lines of ``since..day`` (lines without a date are left out)."""
    lo, hi = since.isoformat(), (day + dt.timedelta(days=1)).isoformat()
    rows = [r for r in records if lo <= str(r.get("at", ""))[:10] < hi]
    quarantined = [r for r in rows if r.get("kind", "quarantined") == "quarantined"]
    runs: list[str] = []
    for r in rows:
        rid = str(r.get("run_id", ""))
        if rid and rid not in runs:
            runs.append(rid)
    last = runs[-1] if runs else None
    reasons = Counter(_reason_kind(str(r.get("reason", ""))) for r in quarantined)
    return IngestStats(
        runs=len(runs),
        quarantined=len(quarantined),
        warnings=len(rows) - len(quarantined),
        last_run_id=last,
        last_run_quarantined=sum(1 for r in quarantined if r.get("run_id") == last),
        top_reasons=tuple(reasons.most_common(3)),
    )


# --- snapshot + history --------------------------------------------------------------------


def _history_path(settings: Settings) -> Path:
    return Path(settings.data_dir) / "health" / "history.jsonl"


def snapshot(
    settings: Settings,
    *,
    day: dt.date,
    redis_client: redis.Redis | None,
    store: VectorStore | None,
    accept: float,
    period_days: int = 14,
    l1_instances: int = 200,
) -> HealthSnapshot:
    """Collect every section; a section whose backend is unavailable is recorded in ``errors``
    instead of failing the whole report."""
    from context_core.errors import ContextError
    from evaluation.cer import cer_report, judge_steps, load_step_records

    errors: dict[str, str] = {}
    l1 = l2 = l3 = None
    try:
        l1 = probe_l1(l1_instances)
    except (ContextError, ImportError) as e:
        errors["L1"] = str(e)
    if redis_client is not None:
        import redis as redis_mod

        try:
            l2 = sample_l2(redis_client)
        except redis_mod.RedisError as e:
            errors["L2"] = f"Redis unavailable: {e}"
    else:
        errors["L2"] = "no Redis client given"
    if store is not None:
        try:
            l3 = summarise_l3(store, [settings.collection_main, settings.collection_hot])
        except ContextError as e:
            errors["L3"] = str(e)
    else:
        errors["L3"] = "no vector store given"
    since = day - dt.timedelta(days=period_days - 1)
    records = load_step_records(settings.traces_dir, since, day)
    routes = [r for r in records if r.get("kind") == "route"]
    todays = [r for r in routes if str(r.get("ts", ""))[:10] == day.isoformat()]
    low = lowest_confidence_queries(todays or routes)
    cer = cer_report(judge_steps(records, accept=accept)) if records else None
    from context_core.ingest.pipeline import read_quarantine_history

    ingest = summarise_ingest(
        read_quarantine_history(Path(settings.reports_dir)), since=since, day=day
    )
    now = dt.datetime.now(dt.UTC)
    return HealthSnapshot(
        day=day.isoformat(), taken_at=now.isoformat(timespec="seconds"), l1=l1, l2=l2, l3=l3,
        low_confidence=low, cer=cer, accept=accept, errors=errors, ingest=ingest,
    )  # fmt: skip


def run_health_report(
    settings: Settings,
    *,
    day: dt.date | None = None,
    redis_client: redis.Redis | None = None,
    store: VectorStore | None = None,
) -> dict[str, Path]:
    """Snapshot -> history (idempotent per day) -> markdown + PNGs + JSON in ``reports_dir``.

    Opens Redis and the vector store from ``settings`` (a :class:`Platform` without the
    model) when not given; one that cannot be opened is reported as an error of its layer.
    """
    from context_core.errors import ContextError
    from context_core.knowledge.embedding import serving_encoder_name
    from context_core.platform import build_platform
    from context_core.routing.confidence import PolicySource
    from evaluation.report import write_health_report

    day = day or dt.datetime.now(dt.UTC).date()
    with build_platform(settings, with_knowledge=False) as platform:
        if redis_client is None:
            try:
                redis_client = platform.redis
            except ContextError:
                redis_client = None
        if store is None:
            try:
                store = platform.store
            except ContextError:
                store = None
        # The router's view of the thresholds: a file calibrated for another model than the
        # encoder the collections were built with (the store's record) is refused here too
        # (the settings' defaults apply), and the report says so.
        thresholds = PolicySource(settings, model=serving_encoder_name(settings, store))
        policy = thresholds.current()
        status = thresholds.status()
        snap = snapshot(settings, day=day, redis_client=redis_client, store=store,
                        accept=policy.accept)  # fmt: skip
    history = store_snapshot(_history_path(settings), snap)
    described = (
        f"{policy.source} (calibration version {policy.version or 'none'}, model "
        f"{policy.model or 'not recorded'}, rule {policy.rule})"
    )
    if status["mismatch"]:
        described += (
            f"; WARNING: thresholds.json was calibrated for model {status['file_model']!r}, "
            f"not {status['encoder_model']!r}: re-run `ctx eval calibrate`"
        )
    return write_health_report(snap, history, settings.reports_dir, policy_source=described)
