"""Which expired keys a live session still needed: the premature-expiration gate's evidence.

Counting every expired key says little during a campaign: most expirations are the design
working (a step output whose dependent step has run, the keys of an abandoned session), and
their number moves with the load curve (after a burst's peak the keys held fall while the
peak's outputs come due). What must never happen is a key expiring while its session still
needs it. Two witnesses look for that:

* **client side**, a :class:`SessionLedger` in every process that runs Locust users: which
  sessions it opened, when each sent its requests and started each step, how it ended
  (closed, abandoned, still running at the stop), and every read of a step output the session
  wrote that the service answered with ``context_miss`` (a *lost read*);
* **server side**, an :class:`ExpiryWatch` subscribed to the Redis keyspace notifications
  ``__keyevent@<db>__:expired`` (it switches ``notify-keyspace-events`` to include ``Ex`` for
  the run and puts the old value back), recording each expired key with the time it was
  announced.

:func:`classify` joins them. A session key is ``wm:{<sid>}:...`` or ``svc:{<sid>}:...``:

* ``step:<k>`` (a step output) is **premature** when it expired before step ``k + 1``, the
  step the agent's plan says depends on it, started (its first request was sent); else
  **expected** (the dependent step had started, or the session ended first);
* ``api:<...>`` (a cached tool response) is **expected**: its TTL is a freshness limit, a miss
  costs a tool call, not the session's state;
* any other key of the session (contract, plan, key index, series, the signed state) is
  **premature** when the session sent a request after it expired, else **expected** (the
  session had closed or been abandoned);
* keys of sessions the ledger does not know (the warm-up's, the drills' probes) and keys
  outside any session (quota windows, the embedding cache) are counted as **untracked**.

An announcement comes at or after the key's TTL ran out (Redis expires a key when it is
read, or when its background cycle samples it), so the server side can only under-count:
a step output that expired lazily *because* its dependent read it shows up as that read's
lost read instead.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "ExpiryReport",
    "ExpiryWatch",
    "SessionLedger",
    "SessionRecord",
    "classify",
    "predicted_step_expirations",
    "watch_redis",
]

log = logging.getLogger(__name__)

#: A session key: ``wm:{<sid>}:<rest>`` (L2) or ``svc:{<sid>}:<rest>`` (the service's).
_SESSION_KEY = re.compile(r"^(?:wm|svc):\{([^{}]+)\}:(.+)$")
#: Premature keys kept as examples in the report.
MAX_EXAMPLES = 5


@dataclass
class SessionRecord:
    """What one session did, as its agent saw it (times are epoch seconds, ``time.time()``).

    ``steps`` maps step ``k`` to when the request that writes ``step:<k>`` was sent; ``end``
    is ``"closed"``, ``"abandoned"`` or ``""`` (still running when the load stopped).
    """

    opened: float
    last_sent: float
    end: str = ""
    steps: dict[int, float] = field(default_factory=dict)
    lost_reads: list[str] = field(default_factory=list)
    written: set[int] = field(default_factory=set)  # steps whose output write succeeded

    def to_wire(self) -> list[Any]:
        return [
            self.opened,
            self.last_sent,
            self.end,
            [[k, t] for k, t in self.steps.items()],
            self.lost_reads,
        ]

    @classmethod
    def from_wire(cls, row: list[Any]) -> SessionRecord:
        opened, last, end, steps, lost = row
        return cls(
            float(opened),
            float(last),
            str(end),
            {int(k): float(t) for k, t in steps},
            [str(k) for k in lost],
        )


class SessionLedger:
    """The sessions of one load-generator process (a module-level instance per process).

    Users call it from their greenlets; a worker sends :meth:`to_wire` to the master at the
    end of the test, where :meth:`merge` adds it to the master's own.
    """

    def __init__(self) -> None:
        self.sessions: dict[str, SessionRecord] = {}

    def clear(self) -> None:
        self.sessions.clear()

    def opened(self, sid: str, t: float) -> None:
        self.sessions[sid] = SessionRecord(opened=t, last_sent=t)

    def sent(self, sid: str, t: float) -> None:
        rec = self.sessions.get(sid)
        if rec is not None and t > rec.last_sent:
            rec.last_sent = t

    def step_started(self, sid: str, step: int, t: float) -> None:
        rec = self.sessions.get(sid)
        if rec is not None:
            rec.steps.setdefault(step, t)

    def wrote(self, sid: str, step: int) -> None:
        rec = self.sessions.get(sid)
        if rec is not None:
            rec.written.add(step)

    def lost_read(self, sid: str, key: str) -> None:
        rec = self.sessions.get(sid)
        if rec is not None:
            rec.lost_reads.append(key)

    def ended(self, sid: str, how: str) -> None:
        rec = self.sessions.get(sid)
        if rec is not None:
            rec.end = how

    def to_wire(self) -> dict[str, list[Any]]:
        return {sid: rec.to_wire() for sid, rec in self.sessions.items()}

    def merge(self, wire: Mapping[str, list[Any]]) -> None:
        for sid, row in wire.items():
            self.sessions[sid] = SessionRecord.from_wire(row)


class ExpiryWatch:
    """Records ``(time, key)`` for every key Redis announces as expired, in a thread.

    ``client_factory`` makes a ``redis.Redis`` (``decode_responses=False``) on the database to
    watch; ``db`` is its number (the channel is ``__keyevent@<db>__:expired``). :meth:`start`
    adds ``E`` and ``x`` to ``notify-keyspace-events`` when missing, and :meth:`stop` restores
    the value it found. A lost connection (a Redis restart drill) is retried every 0.2 s and
    the setting applied again (a restarted server starts without it); ``gaps`` counts those
    outages, during which announcements are lost.
    """

    def __init__(self, client_factory: Any, db: int = 0) -> None:
        self._factory = client_factory
        self.db = db
        self.channel = f"__keyevent@{db}__:expired"
        self.events: list[tuple[float, str]] = []
        self.gaps = 0
        self.error: str | None = None
        self._old_flags: str | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def subscribed(self) -> bool:
        """Whether the watch ever subscribed (announcements were being received)."""
        return self._ready.is_set()

    def _enable(self, client: Any) -> None:
        got = client.config_get("notify-keyspace-events")  # str keys, whatever the decoding
        raw = got.get("notify-keyspace-events", got.get(b"notify-keyspace-events", ""))
        flags = raw.decode() if isinstance(raw, bytes) else str(raw)
        if self._old_flags is None:
            self._old_flags = flags
        need = "".join(c for c in "Ex" if c not in flags and not (c == "x" and "A" in flags))
        if need:
            client.config_set("notify-keyspace-events", flags + need)

    def start(self, timeout_s: float = 5.0) -> bool:
        """Start watching; True once subscribed (False: ``error`` says why)."""
        self._thread = threading.Thread(target=self._run, name="expiry-watch", daemon=True)
        self._thread.start()
        self._ready.wait(timeout_s)
        return self._ready.is_set()

    def _run(self) -> None:
        connected = False  # subscribed on the current connection
        while not self._stop.is_set():
            client = pubsub = None
            try:
                client = self._factory()
                self._enable(client)
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.channel)
                connected = True
                self._ready.set()
                while not self._stop.is_set():
                    msg = pubsub.get_message(timeout=0.2)
                    if msg and msg.get("type") == "message":
                        key = msg["data"]
                        if isinstance(key, bytes):
                            key = key.decode("utf-8", "replace")
                        self.events.append((time.time(), str(key)))
            except Exception as e:  # Redis down (restart drill) or unreachable
                self.error = f"{type(e).__name__}: {e}"
                if connected:
                    self.gaps += 1
                    connected = False
                elif not self._ready.is_set():
                    log.warning("expiry watch could not subscribe: %s", self.error)
                self._stop.wait(0.2)
            finally:
                for closing in (pubsub, client):
                    try:
                        if closing is not None:
                            closing.close()
                    except Exception:  # best effort on a dead connection
                        pass

    def stop(self) -> None:
        """Stop and put back the ``notify-keyspace-events`` value found at the start."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self._old_flags is not None:
            try:
                client = self._factory()
                client.config_set("notify-keyspace-events", self._old_flags)
                client.close()
            except Exception as e:  # the server is gone; nothing to restore
                log.debug("expiry watch: could not restore notify-keyspace-events: %s", e)


def watch_redis(url: str) -> list[ExpiryWatch]:
    """Expiry watches on the Redis at ``url``, started: one on its database, or, for a Redis
    Cluster, one per primary (a node announces only the keys it expires itself). Empty when
    the server cannot be reached."""
    import redis

    from context_core.redis.connection import (
        cluster_enabled,
        make_client,
        split_cluster_url,
        url_db,
    )

    plain, named = split_cluster_url(url)
    try:
        cluster = named or cluster_enabled(plain, connect_timeout=1.0, timeout=1.0)
    except redis.RedisError as e:
        log.warning("expiry watch: Redis at %s not reachable: %s", url, e)
        return []
    factories: list[tuple[Any, int]] = []
    if cluster:
        rc: Any = make_client(
            url,
            cluster=True,
            decode_responses=False,
            socket_timeout=2.0,
            socket_connect_timeout=2.0,
        )
        for node in rc.get_primaries():
            factories.append(
                (
                    lambda h=node.host, p=node.port: redis.Redis(
                        host=h, port=p, socket_timeout=2.0, socket_connect_timeout=1.0
                    ),
                    0,
                )
            )
        rc.close()
    else:
        factories.append(
            (
                lambda: make_client(
                    plain,
                    cluster=False,
                    decode_responses=False,
                    socket_timeout=2.0,
                    socket_connect_timeout=1.0,
                ),
                url_db(plain),
            )
        )
    watches = [ExpiryWatch(f, db) for f, db in factories]
    for w in watches:
        w.start()
    return watches


@dataclass(frozen=True)
class ExpiryReport:
    """The classification of one run's expirations (:func:`classify`)."""

    expired: int  # every expired key announced
    premature: int  # session keys that expired while the session still needed them
    expected: int  # session keys that expired after their session or dependent step
    untracked: int  # keys of sessions the ledger does not know, or of no session
    lost_reads: int  # reads of a written step output answered context_miss (client side)
    sessions: int
    closed: int
    abandoned: int
    steps: int
    step_keys_expired: int  # expired step outputs of the ledger's sessions
    reasons: dict[str, int] = field(default_factory=dict)
    examples: tuple[str, ...] = ()
    watched: bool = True  # False: no expiry watch ran (the server side is unknown)

    @property
    def violations(self) -> int:
        """Premature expirations seen by either witness."""
        return self.premature + self.lost_reads

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["examples"] = list(self.examples)
        d["violations"] = self.violations
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExpiryReport:
        data = {k: v for k, v in d.items() if k != "violations"}
        data["examples"] = tuple(data.get("examples", ()))
        return cls(**data)


def _session_key(key: str) -> tuple[str, str] | None:
    m = _SESSION_KEY.match(key)
    return (m.group(1), m.group(2)) if m else None


def classify(
    expired: Iterable[tuple[float, str]],
    sessions: Mapping[str, SessionRecord],
    *,
    watched: bool = True,
) -> ExpiryReport:
    """Split announced expirations into premature / expected / untracked (module docstring)."""
    reasons: Counter[str] = Counter()
    examples: list[str] = []
    n = premature = expected = untracked = step_keys = 0
    for t, key in expired:
        n += 1
        parts = _session_key(key)
        rec = sessions.get(parts[0]) if parts else None
        if parts is None or rec is None:
            untracked += 1
            reasons["untracked: no session of this run" if parts else "untracked: no session"] += 1
            continue
        _sid, rest = parts
        kind, _, ident = rest.partition(":")
        why: str | None = None  # the premature reason, None = expected
        if kind == "step" and ident.isdigit():
            step_keys += 1
            k = int(ident)
            dependent = rec.steps.get(k + 1)
            if dependent is not None and t < dependent:
                why = f"step {k} output expired {dependent - t:.2f} s before step {k + 1} started"
            else:
                reasons[
                    "expected: step output after its dependent step (or the session's end)"
                ] += 1
        elif kind == "api":
            reasons["expected: cached tool response (freshness TTL)"] += 1
        elif t < rec.last_sent:
            why = f"{kind} expired {rec.last_sent - t:.2f} s before the session's last request"
        else:
            reasons[f"expected: {kind} after the session's last request"] += 1
        if why is None:
            expected += 1
        else:
            premature += 1
            reasons[f"premature: {kind}"] += 1
            if len(examples) < MAX_EXAMPLES:
                examples.append(f"{key}: {why}")
    lost = sum(len(r.lost_reads) for r in sessions.values())
    for rec in sessions.values():
        for key in rec.lost_reads:
            if len(examples) < MAX_EXAMPLES:
                examples.append(f"{key}: read back missing while the session was live")
    return ExpiryReport(
        expired=n,
        premature=premature,
        expected=expected,
        untracked=untracked,
        lost_reads=lost,
        sessions=len(sessions),
        closed=sum(1 for r in sessions.values() if r.end == "closed"),
        abandoned=sum(1 for r in sessions.values() if r.end == "abandoned"),
        steps=sum(len(r.steps) for r in sessions.values()),
        step_keys_expired=step_keys,
        reasons=dict(sorted(reasons.items())),
        examples=tuple(examples),
        watched=watched,
    )


def predicted_step_expirations(
    sessions: Mapping[str, SessionRecord],
    *,
    step_ttl_s: float,
    until: float,
    closed_at: Mapping[str, float] | None = None,
) -> int:
    """Step outputs the TTLs should have expired by ``until``: each step ``k`` started at
    ``t_k`` writes ``step:<k>`` with a TTL of about ``step_ttl_s``; it expires at
    ``t_k + step_ttl_s`` unless its session was closed before (the close deletes the keys).

    ``closed_at`` gives each closed session's close time; without it a closed session's
    ``last_sent`` (the close is its last request) stands in. Abandoned and still-running
    sessions keep every step output to its TTL. Compared with
    :attr:`ExpiryReport.step_keys_expired`, it shows TTLs shorter than the plan says (more
    expirations, sooner) or far longer (fewer).
    """
    if step_ttl_s <= 0 or not math.isfinite(step_ttl_s):
        raise ValueError(f"step_ttl_s must be a positive number, got {step_ttl_s}")
    n = 0
    for sid, rec in sessions.items():
        close = None
        if rec.end == "closed":
            close = (closed_at or {}).get(sid, rec.last_sent)
        for t in rec.steps.values():
            due = t + step_ttl_s
            if due <= until and (close is None or due < close):
                n += 1
    return n
