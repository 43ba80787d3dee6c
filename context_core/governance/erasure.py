"""Erasure on request: everything of one organisation's user, in every store of the inventory.

:func:`erase_user` (``ctx erase --org O --user U``, ``POST
/v1/compliance/orgs/{org}/users/{user}/erasure``) first appends the request to the erasure
ledger (:mod:`.ledger`, keyed hashes only), then finds and deletes, by the user's *subject
digest* (:func:`context_core.access.subjects.subject_id`):

* L2 preferences ``pref:{<org>:<uid>}:*`` (SCAN of the org's preference keys, digest of each
  key id compared);
* the compliance user profile and its audit entries (Redis or PostgreSQL);
* the user's service sessions: every ``svc:{<sid>}:state`` whose signed state names the user and
  whose owner agent belongs to the org (``agent_orgs``, from the API keys file); their L2 keys
  ``wm:{<sid>}:*``, service keys ``svc:{<sid>}:*``, the activity entry, and their lines in the
  route trace files;
* hot answers the user's sessions confirmed, and their merged copies in main (the L3 payload
  field ``subject``).

Then it appends one receipt line to the audit log (``<CTX_DATA_DIR>/audit/audit.jsonl``):
erasure id, time, org, subject digest and counts per store; never a user id or a value.

Idempotent and resumable: a crash after the ledger line leaves a recorded erasure that
:func:`replay_ledger` (``ctx erase --replay``) finishes; re-running finds nothing more. The same
replay re-applies every recorded erasure to stores restored from a backup.

Bounds: the work is O(keys of the org's preferences + compliance users + service sessions in
Redis + trace lines + L3 points of the digest); SCAN walks in batches of 1,000, trace files are
streamed line by line, nothing holds more than one file's kept lines in memory.

Not covered (stated in docs/data-lifecycle.md): sessions made by library code outside the
service (no record names their user), shared-namespace entries (written by agents, not users),
uploads (they belong to the organisation, not a user), evaluation label files and reports
(derived from traces; the next run rebuilds them).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from context_core.access.subjects import SUBJECT_FIELD, subject_id, subject_key, subject_of_key_id
from context_core.audit_trail import append_audit
from context_core.errors import BackendUnavailableError
from context_core.fsutil import filter_lines
from context_core.governance.ledger import ErasureLedger, LedgerEntry, session_digest
from context_core.redis.connection import REDIS_ERRORS
from context_core.working_memory.keys import ACTIVITY_KEY, check_org, check_sid

if TYPE_CHECKING:
    from context_core.access.compliance import ComplianceStore
    from context_core.config import Settings
    from context_core.knowledge.store import VectorStore
    from context_core.redis.connection import RedisClient
    from context_core.working_memory.memory import WorkingMemory

__all__ = ["ErasureReceipt", "ErasureTarget", "append_audit", "erase_user", "replay_ledger"]

log = logging.getLogger(__name__)

_STATE_KEY = re.compile(r"^svc:\{([A-Za-z0-9._\-]{1,128})\}:state$")
_SCAN_COUNT = 1000


@dataclass
class ErasureTarget:
    """The stores an erasure reaches (the platform's parts; ``store`` None: no L3)."""

    redis: RedisClient
    compliance: ComplianceStore
    traces_dir: Path
    audit_path: Path
    ledger: ErasureLedger
    key: bytes
    store: VectorStore | None = None
    collections: tuple[str, ...] = ()
    agent_orgs: Mapping[str, str] = field(default_factory=dict)
    clock: Callable[[], float] = time.time
    #: audit entries kept per compliance profile by retention (None: all)
    history_versions: int | None = None
    #: refused uploads and their ``quarantine.jsonl`` (None: not reached)
    quarantine_dir: Path | None = None
    #: L2, for the contract histories retention bounds (None: not reached)
    wm: WorkingMemory | None = None
    #: the session ids (a Redis glob) whose contract histories retention scans; a test
    #: narrows it to its own sessions in a shared database
    session_match: str = "*"

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        redis: RedisClient,
        compliance: ComplianceStore,
        store: VectorStore | None,
        agent_orgs: Mapping[str, str],
        clock: Callable[[], float] = time.time,
        wm: WorkingMemory | None = None,
    ) -> ErasureTarget:
        """The platform's stores at their configured places (the data dir's traces, audit
        log and ledger; both collections)."""
        return cls(
            redis=redis,
            compliance=compliance,
            traces_dir=settings.traces_dir,
            audit_path=settings.data_dir / "audit" / "audit.jsonl",
            ledger=ErasureLedger.in_data_dir(settings.data_dir),
            key=subject_key(settings),
            store=store,
            collections=(settings.collection_hot, settings.collection_main),
            agent_orgs=dict(agent_orgs),
            clock=clock,
            history_versions=settings.compliance_history_versions,
            quarantine_dir=settings.upload_quarantine_dir,
            wm=wm,
        )


@dataclass
class ErasureReceipt:
    """What an erasure removed: counts per store, never values."""

    erasure_id: str
    at: float
    org: str
    subject: str
    counts: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "erasure_id": self.erasure_id,
            "at": dt.datetime.fromtimestamp(self.at, dt.UTC).isoformat(),
            "org": self.org,
            "subject": self.subject,
            "counts": dict(self.counts),
        }


def erase_user(t: ErasureTarget, org_id: str, user_id: str) -> ErasureReceipt:
    """Erase ``user_id`` of ``org_id`` everywhere (see the module doc); returns the receipt."""
    org = check_org(org_id)
    subject = subject_id(t.key, org, user_id)
    eid = "e-" + uuid.uuid4().hex[:16]
    at = t.clock()
    t.ledger.record_erasure(eid, at, org, subject)
    counts = _apply(t, eid, org, {subject}, frozenset())
    receipt = ErasureReceipt(eid, at, org, subject, counts)
    append_audit(t.audit_path, {"ts": at, "kind": "erasure", **receipt.to_dict()})
    return receipt


def replay_ledger(t: ErasureTarget) -> ErasureReceipt:
    """Re-apply every erasure in the ledger (after a restore, or to finish a crashed one).
    Returns one receipt summing the counts (``org`` ``*``: every org of the ledger)."""
    entries = t.ledger.entries()
    at = t.clock()
    total: dict[str, int] = {}
    by_org: dict[str, list[LedgerEntry]] = {}
    for e in entries:
        by_org.setdefault(e.org, []).append(e)
    eid = "r-" + uuid.uuid4().hex[:16]
    for org, group in sorted(by_org.items()):
        subjects = {e.subject for e in group}
        sessions = frozenset().union(*(e.sessions for e in group))
        for k, v in _apply(t, None, org, subjects, sessions).items():
            total[k] = total.get(k, 0) + v
    receipt = ErasureReceipt(eid, at, "*", f"{len(entries)} ledger entries", total)
    append_audit(t.audit_path, {"ts": at, "kind": "erasure_replay", **receipt.to_dict()})
    return receipt


def _apply(
    t: ErasureTarget,
    eid: str | None,
    org: str,
    subjects: set[str],
    known_sessions: frozenset[str],
) -> dict[str, int]:
    try:
        counts = {"l2_preferences": _erase_preferences(t, org, subjects)}
        counts["compliance_user_records"] = _erase_compliance(t, org, subjects)
        sids = _find_sessions(t, org, subjects)
        digests = {session_digest(t.key, s) for s in sids} | set(known_sessions)
        if eid is not None:
            t.ledger.record_sessions(eid, digests)
        counts["service_sessions"] = len(sids)
        counts["session_keys"] = _erase_sessions(t, sids)
    except REDIS_ERRORS as e:
        raise BackendUnavailableError(
            f"Redis failed during the erasure ({type(e).__name__}); it is in the erasure "
            "ledger: run `ctx erase --replay` once Redis is back"
        ) from e
    counts["trace_lines"] = _erase_trace_lines(t, digests)
    counts["l3_points"] = _erase_points(t, subjects)
    return counts


def scan_keys(r: RedisClient, pattern: str) -> list[str]:
    return [str(k) for k in r.scan_iter(match=pattern, count=_SCAN_COUNT)]


def _erase_preferences(t: ErasureTarget, org: str, subjects: set[str]) -> int:
    n = 0
    prefix = f"pref:{{{org}:"
    for k in scan_keys(t.redis, prefix + "*"):
        key_id = k[len(prefix) :].split("}", 1)[0]
        if subject_of_key_id(t.key, org, key_id) in subjects:
            n += int(t.redis.delete(k))
    return n


def _erase_compliance(t: ErasureTarget, org: str, subjects: set[str]) -> int:
    n = 0
    for key_id in sorted(t.compliance.user_key_ids(org)):
        if subject_of_key_id(t.key, org, key_id) in subjects:
            n += t.compliance.erase_user_key(org, key_id)
    return n


def _find_sessions(t: ErasureTarget, org: str, subjects: set[str]) -> list[str]:
    found: list[str] = []
    for k in scan_keys(t.redis, "svc:{*}:state"):
        m = _STATE_KEY.match(k)
        if m is None:
            continue
        sid = m.group(1)
        raw = t.redis.get(k)
        owner = t.redis.hget(f"svc:{{{sid}}}:session", "owner")
        if raw is None or owner is None or t.agent_orgs.get(str(owner)) != org:
            continue
        try:
            uid = json.loads(raw)["user_id"]
        except (ValueError, KeyError, TypeError):
            log.warning("erasure: session %s has an unreadable state; skipped", sid)
            continue
        if isinstance(uid, str) and subject_id(t.key, org, uid) in subjects:
            found.append(sid)
    return found


def _erase_sessions(t: ErasureTarget, sids: Iterable[str]) -> int:
    n = 0
    for sid in sids:
        check_sid(sid)
        for pattern in (f"wm:{{{sid}}}:*", f"svc:{{{sid}}}:*"):
            for k in scan_keys(t.redis, pattern):
                n += int(t.redis.delete(k))
        t.redis.zrem(ACTIVITY_KEY, sid)
    return n


def _erase_trace_lines(t: ErasureTarget, digests: set[str]) -> int:
    if not digests or not t.traces_dir.is_dir():
        return 0
    return sum(
        filter_jsonl(path, lambda rec: session_digest(t.key, str(rec.get("session_id"))) in digests)
        for path in sorted(t.traces_dir.glob("traces-*.jsonl"))
    )


def filter_jsonl(path: Path, drop: Callable[[dict[str, Any]], bool]) -> int:
    """Rewrite a JSON-lines file without the records ``drop`` selects; returns how many went.

    :func:`context_core.fsutil.filter_lines`: under the file's advisory lock, through a
    temporary file and ``os.replace``; lines that are not JSON objects are kept. A writer
    appending meanwhile (today's traces) is caught up to, and
    :class:`~context_core.traces.TraceWriter` reopens the path when its inode changes.
    """

    def keep(raw: bytes) -> bool:
        try:
            rec = json.loads(raw)
        except ValueError:
            return True
        return not (isinstance(rec, dict) and drop(rec))

    return filter_lines(path, keep)


def _erase_points(t: ErasureTarget, subjects: set[str]) -> int:
    if t.store is None or not subjects:
        return 0
    n = 0
    filt: dict[str, Any] = {SUBJECT_FIELD: sorted(subjects)}
    for name in t.collections:
        if t.store.info(name) is None:
            continue
        c = t.store.count(name, filter=filt)
        if c:
            t.store.delete(name, filter=filt)
            n += c
    return n
