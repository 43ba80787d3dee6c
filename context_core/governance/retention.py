"""Retention enforced: what is older than its organisation's ``data_retention_policy`` goes.

:func:`enforce_retention` (``ctx retention enforce [--dry-run]``) reads each organisation's
retention (the org profile's ``data_retention_policy``, days; none set: nothing of that org is
deleted by age) for every org of the API keys file, and deletes what is older than
``now - days``:

* route-trace lines (``ts``) of that org's agents (a step-output line goes with its session's
  route lines' agent);
* L3 points its agents wrote (``written_by``; hot answers, uploads, merged copies) whose
  ``updated_at_ts`` is older;
* L2 preferences of its users whose ``last_updated`` is older;

and, with ``CTX_COMPLIANCE_HISTORY_VERSIONS`` set, trims every compliance profile's audit
entries (the org's and each user's) to that many, appending the dropped ones to the audit log
in digest form (version, time, operator, SHA-256, changed field names; the user as its subject
digest).

L2 session keys, service records, the activity index and shared namespaces expire by their own
TTL: they are not rewritten. Stores not covered yet are listed in docs/data-lifecycle.md.

``dry_run`` counts what would go and deletes nothing. Every run appends a receipt to the audit
log: run id, ``now`` (injectable clock), each org's cut-off, counts per store; never values.
Idempotent (a second run finds nothing more) and resumable (each store is finished on its own;
a crashed run is simply run again). Safe while the service serves: deletes are per key, by
filter, or an atomic file replace that keeps lines appended meanwhile.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from context_core.access.subjects import subject_of_key_id
from context_core.governance.erasure import ErasureTarget, append_audit, filter_jsonl, scan_keys

__all__ = ["RetentionReceipt", "enforce_retention"]

DAY_S = 86_400.0


@dataclass
class RetentionReceipt:
    run_id: str
    at: float
    dry_run: bool
    cutoffs: dict[str, str]  # org -> ISO cut-off (orgs with a retention only)
    counts: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "at": dt.datetime.fromtimestamp(self.at, dt.UTC).isoformat(),
            "dry_run": self.dry_run,
            "cutoffs": dict(self.cutoffs),
            "counts": dict(self.counts),
        }


def enforce_retention(t: ErasureTarget, *, dry_run: bool = False) -> RetentionReceipt:
    now = t.clock()
    cutoff: dict[str, float] = {}
    for org in sorted(set(t.agent_orgs.values())):
        days = t.compliance.get(org).profile.data_retention_policy
        if days is not None:
            cutoff[org] = now - days * DAY_S
    counts = {
        "trace_lines": _traces(t, cutoff, dry_run),
        "l3_points": _points(t, cutoff, dry_run),
        "l2_preferences": _preferences(t, cutoff, dry_run),
        "compliance_history_archived": _history(t, now, dry_run),
    }
    receipt = RetentionReceipt(
        "ret-" + uuid.uuid4().hex[:16],
        now,
        dry_run,
        {o: dt.datetime.fromtimestamp(c, dt.UTC).isoformat() for o, c in cutoff.items()},
        counts,
    )
    append_audit(t.audit_path, {"ts": now, "kind": "retention", **receipt.to_dict()})
    return receipt


def _ts(rec: dict[str, Any]) -> float | None:
    try:
        return dt.datetime.fromisoformat(str(rec["ts"])).timestamp()
    except (KeyError, ValueError):
        return None


def _traces(t: ErasureTarget, cutoff: dict[str, float], dry_run: bool) -> int:
    if not cutoff or not t.traces_dir.is_dir():
        return 0
    n = 0
    for path in sorted(t.traces_dir.glob("traces-*.jsonl")):
        agents = _session_agents(path)

        def old(rec: dict[str, Any], agents: dict[str, str] = agents) -> bool:
            agent = rec.get("agent_id") or agents.get(str(rec.get("session_id")))
            c = cutoff.get(t.agent_orgs.get(str(agent), ""))
            ts = _ts(rec)
            return c is not None and ts is not None and ts < c

        if dry_run:
            n += sum(1 for rec in _records(path) if old(rec))
        else:
            n += filter_jsonl(path, old)
    return n


def _records(path: Path) -> list[dict[str, Any]]:
    out = []
    with path.open("rb") as fh:
        for raw in fh:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


def _session_agents(path: Path) -> dict[str, str]:
    return {
        str(r["session_id"]): str(r["agent_id"])
        for r in _records(path)
        if r.get("agent_id") and r.get("session_id")
    }


def _points(t: ErasureTarget, cutoff: dict[str, float], dry_run: bool) -> int:
    if t.store is None:
        return 0
    n = 0
    for org, c in cutoff.items():
        agents = sorted(a for a, o in t.agent_orgs.items() if o == org)
        if not agents:
            continue
        filt: dict[str, Any] = {"written_by": agents, "updated_at_ts": {"lt": c}}
        for name in t.collections:
            if t.store.info(name) is None:
                continue
            k = t.store.count(name, filter=filt)
            if k and not dry_run:
                t.store.delete(name, filter=filt)
            n += k
    return n


def _preferences(t: ErasureTarget, cutoff: dict[str, float], dry_run: bool) -> int:
    n = 0
    for org, c in cutoff.items():
        prefix = f"pref:{{{org}:"
        for k in scan_keys(t.redis, prefix + "*"):
            if k.endswith(":_index") or t.redis.type(k) != "hash":
                continue
            last = t.redis.hget(k, "last_updated")
            try:
                old = last is not None and float(last) < c
            except ValueError:
                old = False
            if not old:
                continue
            n += 1
            if not dry_run:
                head, _, pref_type = k.rpartition(":")
                t.redis.delete(k)
                t.redis.srem(f"{head}:_index", pref_type)
    return n


def _history(t: ErasureTarget, now: float, dry_run: bool) -> int:
    keep = t.history_versions
    if keep is None:
        return 0
    n = 0
    for org in sorted(set(t.agent_orgs.values())):
        records: list[str | None] = [None, *sorted(t.compliance.user_key_ids(org))]
        for key_id in records:
            if dry_run:
                n += max(0, t.compliance.history_length(org, key_id) - keep)
                continue
            dropped = t.compliance.trim_history(org, key_id, keep)
            if not dropped:
                continue
            n += len(dropped)
            subject = None if key_id is None else subject_of_key_id(t.key, org, key_id)
            append_audit(
                t.audit_path,
                {
                    "ts": now,
                    "kind": "compliance_history_archive",
                    "org": org,
                    "subject": subject,
                    "entries": [
                        {
                            "version": e.version,
                            "at": e.at,
                            "operator": e.operator,
                            "sha256": e.sha256,
                            "changed": list(e.changed),
                        }
                        for e in dropped
                    ],
                },
            )
    return n
