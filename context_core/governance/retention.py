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
* audit-log lines (``audit/audit.jsonl``, ``audit/access.jsonl``) by ``ts`` and the line's
  ``org`` (or its agent's org, ``agent_id``/``agent``); a line naming no org (gateway
  findings) goes after the LONGEST retention, and only when every org has one (an org that
  keeps its data forever may own it). Erasure and retention receipts are never deleted:
  they are the proof;
* quarantined uploads (``quarantine/uploads/<id>.bin`` and their ``quarantine.jsonl``
  line) by ``at`` and the uploading agent's org (no agent: as a line naming no org);

and bounds the histories: every compliance profile's audit entries (the org's and each
user's) to ``CTX_COMPLIANCE_HISTORY_VERSIONS`` (default 100), and every task-contract history
``wm:{<sid>}:contract:history`` to ``CTX_WM_CONTRACT_HISTORY_VERSIONS`` versions and
``CTX_WM_CONTRACT_HISTORY_DAYS`` days (each contract write bounds its own list; this catches
lists no write has touched since), appending the dropped ones to the audit log in digest form
(:func:`context_core.audit_trail.archive_history`: version, time, operator, SHA-256, changed
field names; the user as its subject digest, the session as its SHA-256).

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
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from context_core.access.subjects import subject_of_key_id
from context_core.audit_trail import HistoryDigest, append_audit, archive_history
from context_core.governance.erasure import ErasureTarget, filter_jsonl, scan_keys

__all__ = ["RetentionReceipt", "enforce_retention"]

DAY_S = 86_400.0
_HISTORY_KEY = re.compile(r"^wm:\{([A-Za-z0-9._\-]{1,128})\}:contract:history$")


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
        "audit_lines": _audit(t, cutoff, dry_run),
        "quarantined_uploads": _quarantine(t, cutoff, dry_run),
        "contract_history_archived": _contract_histories(t, now, dry_run),
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


def _ts(rec: dict[str, Any], field: str = "ts") -> float | None:
    """``rec[field]`` as epoch seconds: a number, or an ISO time (UTC when it has no zone)."""
    v = rec.get(field)
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    try:
        at = dt.datetime.fromisoformat(str(v))
    except ValueError:
        return None
    return (at if at.tzinfo else at.replace(tzinfo=dt.UTC)).timestamp()


#: Audit lines that are the proof of an erasure or a retention run: never deleted by age.
RECEIPT_KINDS = frozenset({"erasure", "erasure_replay", "retention"})


def _orgless_cutoff(t: ErasureTarget, cutoff: dict[str, float]) -> float | None:
    """Lines naming no org go after the longest retention, once every org has one."""
    orgs = set(t.agent_orgs.values())
    if not orgs or not orgs <= set(cutoff):
        return None
    return min(cutoff.values())


def _line_cutoff(
    t: ErasureTarget, cutoff: dict[str, float], rec: dict[str, Any], orgless: float | None
) -> float | None:
    org = rec.get("org")
    if not isinstance(org, str) or not org:
        agent = rec.get("agent_id") or rec.get("agent")
        org = t.agent_orgs.get(str(agent)) if agent else None
    if org is None:
        return orgless
    return cutoff.get(org)


def _audit(t: ErasureTarget, cutoff: dict[str, float], dry_run: bool) -> int:
    if not cutoff:
        return 0
    orgless = _orgless_cutoff(t, cutoff)

    def old(rec: dict[str, Any]) -> bool:
        if rec.get("kind") in RECEIPT_KINDS:
            return False
        c = _line_cutoff(t, cutoff, rec, orgless)
        ts = _ts(rec)
        return c is not None and ts is not None and ts < c

    n = 0
    for path in (t.audit_path, t.audit_path.with_name("access.jsonl")):
        if not path.is_file():
            continue
        if dry_run:
            n += sum(1 for rec in _records(path) if old(rec))
        else:
            n += filter_jsonl(path, old)
    return n


def _quarantine(t: ErasureTarget, cutoff: dict[str, float], dry_run: bool) -> int:
    """Quarantined uploads: the ``.bin`` first, then its line (a crash between the two leaves
    a line whose file is gone: the next run drops the line)."""
    qdir = t.quarantine_dir
    if not cutoff or qdir is None or not (qdir / "quarantine.jsonl").is_file():
        return 0
    index = qdir / "quarantine.jsonl"
    orgless = _orgless_cutoff(t, cutoff)

    def old(rec: dict[str, Any]) -> bool:
        c = _line_cutoff(t, cutoff, rec, orgless)
        at = _ts(rec, "at")
        return c is not None and at is not None and at < c

    expired = [rec for rec in _records(index) if old(rec)]
    if dry_run:
        return len(expired)
    for rec in expired:
        name = Path(str(rec.get("file") or "")).name  # a bare name: never a path elsewhere
        if name.endswith(".bin"):
            (qdir / name).unlink(missing_ok=True)
    return filter_jsonl(index, old)


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
            subject = None if key_id is None else subject_of_key_id(t.key, org, key_id)
            n += archive_history(
                t.audit_path,
                kind="compliance_history_archive",
                ts=now,
                entries=[
                    HistoryDigest(e.version, e.at, e.sha256, tuple(e.changed), e.operator)
                    for e in dropped
                ],
                org=org,
                subject=subject,
            )
    return n


def _contract_histories(t: ErasureTarget, now: float, dry_run: bool) -> int:
    if t.wm is None:
        return 0
    n = 0
    for k in scan_keys(t.redis, f"wm:{{{t.session_match}}}:contract:history"):
        m = _HISTORY_KEY.match(k)
        if m is None:
            continue
        n += t.wm.session(m.group(1)).trim_contract_history(now=now, dry_run=dry_run)
    return n
