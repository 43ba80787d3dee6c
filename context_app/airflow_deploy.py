"""A real Airflow 3 deployment on one machine, driven through its REST API.

What ``dag.test()`` (:mod:`context_app.airflow_local`) does not exercise: the metadata DB on
PostgreSQL, the LocalExecutor, and the three long-running processes of an Airflow 3 install,
each started on its own (``airflow api-server`` on a free loopback port, ``airflow scheduler``,
``airflow dag-processor``), with a private ``AIRFLOW_HOME`` migrated first (``airflow db
migrate``), and the platform's PostgreSQL schema migrated too (``ctx db upgrade``, when
``CTX_POSTGRES_OWNER_URL`` is set). Runs are triggered and read back through the public REST
API (``/api/v2``) with a JWT from the simple auth manager's ``/auth/token``, as an operator or
another service would.

Each process runs in its own process group with its output in ``AIRFLOW_HOME/<name>.log``;
:meth:`AirflowDeployment.stop` ends the groups (and any task process that left them) and every
wait fails fast, naming the log file, when a process dies. ``ctx airflow up`` and ``ctx airflow
refresh`` use this module; so does ``tests/test_airflow_deployment.py``.

The caller's process never imports Airflow (its configuration is frozen at import): everything
Airflow runs in the subprocesses, configured by environment variables built here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from context_app.airflow_local import AirflowRunError, default_dags_folder

__all__ = [
    "DEFAULT_PG_URL",
    "PROCESSES",
    "AirflowApi",
    "AirflowDeployError",
    "AirflowDeployment",
    "create_database",
    "drop_database",
    "free_port",
    "pg_reachable",
]

# A maintenance DB on the server that holds the deployments' DBs (trust auth on loopback).
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
# Start order: the api-server first (task processes report to its execution API).
PROCESSES = ("api-server", "scheduler", "dag-processor")
TERMINAL_RUN_STATES = frozenset({"success", "failed"})
_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_ADMIN = "admin"


class AirflowDeployError(AirflowRunError):
    """The deployment could not start, a process died, or the REST API said no."""


# --- PostgreSQL -------------------------------------------------------------------------------
def _check_db_name(name: str) -> str:
    if not _DB_NAME.match(name):
        raise AirflowDeployError(
            f"database name {name!r}: use lower-case letters, digits and '_' (max 63)"
        )
    return name


def _connect(admin_url: str, timeout: float = 3.0) -> Any:
    import psycopg2

    conn = psycopg2.connect(admin_url, connect_timeout=max(1, int(timeout)))
    conn.autocommit = True  # CREATE/DROP DATABASE cannot run in a transaction
    return conn


def pg_reachable(admin_url: str = DEFAULT_PG_URL, timeout: float = 3.0) -> str | None:
    """``None`` when PostgreSQL at ``admin_url`` answers a query, else why not (for a skip)."""
    try:
        import psycopg2
    except ImportError:
        return "psycopg2 is not installed (pip install psycopg2-binary)"
    try:
        conn = _connect(admin_url, timeout)
    except psycopg2.Error as e:
        return f"PostgreSQL at {_hide_password(admin_url)} is not reachable: {str(e).strip()}"
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
    finally:
        conn.close()
    return None


def db_url(admin_url: str, name: str, driver: str = "postgresql+psycopg2") -> str:
    """SQLAlchemy URL of database ``name`` on the server of ``admin_url``."""
    parts = urlsplit(admin_url)
    return urlunsplit((driver, parts.netloc, "/" + quote(_check_db_name(name)), parts.query, ""))


def create_database(admin_url: str, name: str, *, exist_ok: bool = True) -> None:
    """``CREATE DATABASE name`` on the server of ``admin_url`` (kept when it exists)."""
    _check_db_name(name)
    conn = _connect(admin_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cur.fetchone():
                if not exist_ok:
                    raise AirflowDeployError(f"database {name} already exists")
                return
            cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()


def drop_database(admin_url: str, name: str) -> None:
    """``DROP DATABASE IF EXISTS name WITH (FORCE)`` (PostgreSQL 13+: ends its sessions)."""
    _check_db_name(name)
    conn = _connect(admin_url)
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


def _hide_password(url: str) -> str:
    return re.sub(r"(//[^:/@]+):[^@]*@", r"\1:***@", url)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _airflow_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("airflow")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "airflow"]


def _tail(path: Path, n: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "(no log)"
    return data[-n:].decode("utf-8", "replace")


# --- the deployment ---------------------------------------------------------------------------
@dataclass
class AirflowDeployment:
    """Airflow 3 under ``home`` with its metadata in PostgreSQL database ``db_name``.

    ``extra_env`` reaches every process and so every task (e.g. ``CTX_DATA_DIR``).
    ``fast`` lowers the scheduler's and dag-processor's intervals (heartbeats, folder
    listing, re-parse) so a run starts within seconds: the test and ``ctx airflow refresh``
    want that; a long-lived ``ctx airflow up`` can keep Airflow's defaults.
    As a context manager (``with AirflowDeployment(...) as dep: api = dep.wait_ready()``)
    it prepares and starts on entry and stops every process on exit, even when the body
    raised; :func:`temporary_deployment` also drops the database.
    """

    home: Path
    db_name: str
    pg_url: str = DEFAULT_PG_URL
    dags_folder: Path = field(default_factory=default_dags_folder)
    port: int = 0  # 0: a free port, chosen at start
    host: str = "127.0.0.1"
    extra_env: dict[str, str] = field(default_factory=dict)
    fast: bool = True
    parallelism: int = 4
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _secrets: dict[str, str] = field(default_factory=dict, repr=False)
    _log_port: int = 0

    # -- configuration
    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def sql_alchemy_conn(self) -> str:
        return db_url(self.pg_url, self.db_name)

    @property
    def passwords_file(self) -> Path:
        return self.home / "simple_auth_manager_passwords.json"

    def log_path(self, name: str) -> Path:
        """Where the output of process ``name`` (one of :data:`PROCESSES`) goes."""
        return self.home / f"{name}.log"

    @property
    def env(self) -> dict[str, str]:
        """The environment of every Airflow process (and so of every task)."""
        if not self._secrets:
            self._secrets = {
                "jwt": secrets.token_urlsafe(32),
                "api": secrets.token_urlsafe(32),
            }
        repo = str(Path(__file__).resolve().parents[1])
        py_path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.sql_alchemy_conn,
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{_ADMIN}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.passwords_file),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__HOST": self.host,
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": self._secrets["api"],
            "AIRFLOW__API_AUTH__JWT_SECRET": self._secrets["jwt"],
            # LocalExecutor's log server: a free port, so two deployments can run side by side
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self._log_port or 8793),
            "AIRFLOW__LOGGING__COLORED_CONSOLE_LOG": "False",
            "GX_ANALYTICS_ENABLED": "false",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": py_path,
            "PYTHONUNBUFFERED": "1",
        }
        if self.fast:
            env.update(
                {
                    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
                    "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "1",
                    "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
                    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",
                    "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "60",
                    "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
                    "AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL": "5",
                }
            )
        env.update(self.extra_env)
        return env

    # -- lifecycle
    def prepare(self, *, timeout: float = 300) -> AirflowDeployment:
        """Create the home, the database (kept if it exists) and migrate it."""
        if not self.dags_folder.is_dir():
            raise AirflowDeployError(f"DAGs folder {self.dags_folder} does not exist")
        self.home.mkdir(parents=True, exist_ok=True)
        why = pg_reachable(self.pg_url)
        if why:
            raise AirflowDeployError(why)
        create_database(self.pg_url, self.db_name)
        if not self.passwords_file.exists():
            self.passwords_file.write_text(
                json.dumps({_ADMIN: secrets.token_urlsafe(16)}) + "\n", encoding="utf-8"
            )
            self.passwords_file.chmod(0o600)
        self._run_logged(
            [*_airflow_cmd(), "db", "migrate"], self.env, "db-migrate.log", timeout=timeout
        )
        self.migrate_platform_schema(timeout=timeout)
        return self

    def migrate_platform_schema(self, *, timeout: float = 120) -> str | None:
        """The platform's own PostgreSQL schema, before any task runs: ``ctx db upgrade``
        (as the owner role) when the processes' environment has ``CTX_POSTGRES_OWNER_URL``,
        else ``ctx db check`` when it has ``CTX_POSTGRES_URL`` (a schema behind fails here,
        naming the command, instead of in every task); nothing when the platform keeps its
        profiles in Redis. Returns the command run (None: none), output in
        ``AIRFLOW_HOME/db-upgrade.log``."""
        env = self.env
        if env.get("CTX_POSTGRES_OWNER_URL"):
            verb = "upgrade"
        elif env.get("CTX_POSTGRES_URL"):
            verb = "check"
        else:
            return None
        self._run_logged(
            [sys.executable, "-m", "context_app.cli", "db", verb],
            env,
            "db-upgrade.log",
            timeout=timeout,
            name=f"ctx db {verb}",
        )
        return f"ctx db {verb}"

    def _run_logged(
        self,
        argv: list[str],
        env: dict[str, str],
        log_name: str,
        *,
        timeout: float,
        name: str | None = None,
    ) -> None:
        """Run one set-up command with its output in ``<home>/<log_name>``; a non-zero exit
        raises with the log's tail."""
        log = self.home / log_name
        with log.open("wb") as out:
            rc = subprocess.run(
                argv,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                timeout=timeout,
                check=False,
            ).returncode
        if rc != 0:
            what = name or " ".join(["airflow", *argv[-2:]])
            raise AirflowDeployError(f"`{what}` failed (exit {rc}); log: {log}\n{_tail(log)}")

    @property
    def password(self) -> str:
        data = json.loads(self.passwords_file.read_text(encoding="utf-8"))
        return str(data[_ADMIN])

    def start(self) -> AirflowDeployment:
        """Start the three processes, each in its own process group, output to its log."""
        if self.procs:
            raise AirflowDeployError("already started")
        if not self.port:
            self.port = free_port(self.host)
        if not self._log_port:
            self._log_port = free_port(self.host)
        env = self.env
        commands = {
            "api-server": ["api-server", "--host", self.host, "--port", str(self.port)],
            "scheduler": ["scheduler"],
            "dag-processor": ["dag-processor"],
        }
        try:
            for name in PROCESSES:
                with self.log_path(name).open("ab") as out:
                    self.procs[name] = subprocess.Popen(
                        [*_airflow_cmd(), *commands[name]],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        cwd=self.home,
                        start_new_session=True,  # its own process group, ended as one
                        preexec_fn=_die_with_parent,
                    )
        except BaseException:
            self.stop()
            raise
        (self.home / "deployment.json").write_text(
            json.dumps(
                {
                    "url": self.base_url,
                    "database": self.db_name,
                    "pids": {n: p.pid for n, p in self.procs.items()},
                    "logs": {n: str(self.log_path(n)) for n in self.procs},
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
        return self

    def check_alive(self) -> None:
        """Raise, naming the process and its log file, when one of them has exited."""
        for name, proc in self.procs.items():
            rc = proc.poll()
            if rc is not None:
                log = self.log_path(name)
                raise AirflowDeployError(
                    f"`airflow {name}` exited (code {rc}); log: {log}\n--- tail of {log}\n"
                    f"{_tail(log)}"
                )

    def wait_ready(self, *, timeout: float = 180, dag_ids: tuple[str, ...] = ()) -> AirflowApi:
        """Wait until the API answers, the scheduler and dag-processor report healthy and the
        given DAGs are parsed; returns an authenticated :class:`AirflowApi`."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        api: AirflowApi | None = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if api is None:
                    api = AirflowApi(self.base_url, _ADMIN, self.password, self.check_alive)
                health = api.health()
                states = {k: (v or {}).get("status") for k, v in health.items()}
                last = f"health {states}"
                if all(states.get(k) == "healthy" for k in ("scheduler", "dag_processor")):
                    missing = set(dag_ids) - set(api.dags())
                    if not missing:
                        return api
                    last = f"health {states}; DAGs not parsed yet: {sorted(missing)}"
            except AirflowDeployError:
                raise
            except Exception as e:  # connection refused while the server starts
                last = f"{type(e).__name__}: {e}"
                if api is not None and "401" in str(e):
                    api = None
            time.sleep(1.0)
        self.check_alive()
        logs = ", ".join(str(self.log_path(n)) for n in self.procs)
        raise AirflowDeployError(
            f"Airflow at {self.base_url} not ready within {timeout:.0f} s ({last}); logs: {logs}"
        )

    def api(self) -> AirflowApi:
        return AirflowApi(self.base_url, _ADMIN, self.password, self.check_alive)

    def stop(self, *, grace: float = 20.0) -> None:
        """SIGTERM each process group (scheduler first), SIGKILL what is left after ``grace``.

        Task processes that left their group are found as descendants beforehand.
        """
        import psutil

        if not self.procs:
            return
        descendants: list[psutil.Process] = []
        for proc in self.procs.values():
            with contextlib.suppress(psutil.Error):
                descendants.extend(psutil.Process(proc.pid).children(recursive=True))
        order = [n for n in ("scheduler", "dag-processor", "api-server") if n in self.procs]
        for name in order:
            _signal_group(self.procs[name], signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name in order:
            proc = self.procs[name]
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for name in order:
            _signal_group(self.procs[name], signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.procs[name].wait(timeout=5)
        for child in descendants:
            with contextlib.suppress(psutil.Error):
                if child.is_running():
                    child.kill()
        self.procs.clear()

    def __enter__(self) -> AirflowDeployment:
        self.prepare()
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def drop(self) -> None:
        """Stop, then drop the database (the home stays, with its logs)."""
        self.stop()
        drop_database(self.pg_url, self.db_name)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the process that started it dies, even by
    SIGKILL (Linux ``PR_SET_PDEATHSIG``), so a killed ``ctx airflow up`` or test run leaves no
    scheduler behind. (The signal follows the starting *thread*: start from a thread that
    lives as long as the deployment, as ``up``/``refresh`` and the tests do.) Elsewhere: no-op."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # no prctl: the stop() paths still apply
        pass


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # start_new_session: the group id is the pid


# --- REST API ---------------------------------------------------------------------------------
class AirflowApi:
    """The public REST API (``/api/v2``) with a JWT from ``POST /auth/token``.

    ``alive`` is called in every wait, so a dead process fails a wait at once (with its log).
    """

    def __init__(
        self,
        base_url: str,
        username: str,
        password: str,
        alive: Callable[[], None] = lambda: None,
        timeout: float = 30.0,
    ) -> None:
        import httpx

        self.base_url = base_url
        self._alive = alive
        self._http = httpx.Client(base_url=base_url, timeout=timeout)
        r = self._http.post("/auth/token", json={"username": username, "password": password})
        if r.status_code not in (200, 201):
            raise RuntimeError(f"POST /auth/token: {r.status_code} {r.text[:300]}")
        self.token = str(r.json()["access_token"])
        self._http.headers["Authorization"] = f"Bearer {self.token}"

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kw: Any) -> Any:
        r = self._http.request(method, "/api/v2" + path, **kw)
        if r.status_code >= 400:
            raise AirflowDeployError(f"{method} /api/v2{path}: {r.status_code} {r.text[:500]}")
        return r.json() if r.content else None

    def health(self) -> dict[str, Any]:
        return dict(self.request("GET", "/monitor/health"))

    def dags(self) -> dict[str, dict[str, Any]]:
        out = self.request("GET", "/dags", params={"limit": 100})
        return {d["dag_id"]: d for d in out["dags"]}

    def import_errors(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/importErrors", params={"limit": 100})["import_errors"])

    def dag(self, dag_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/dags/{dag_id}"))

    def dag_details(self, dag_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/dags/{dag_id}/details"))

    def set_paused(self, dag_id: str, paused: bool) -> dict[str, Any]:
        return dict(self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": paused}))

    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body = {"logical_date": None, "conf": dict(conf or {})}
        return dict(self.request("POST", f"/dags/{dag_id}/dagRuns", json=body))

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"))

    def wait_run(
        self, dag_id: str, run_id: str, *, timeout: float = 300, poll: float = 0.5
    ) -> dict[str, Any]:
        """Poll until the run is ``success`` or ``failed``; raise on timeout."""
        deadline = time.monotonic() + timeout
        run: dict[str, Any] = {}
        while time.monotonic() < deadline:
            self._alive()
            run = self.dag_run(dag_id, run_id)
            if run.get("state") in TERMINAL_RUN_STATES:
                return run
            time.sleep(poll)
        states = {t["task_id"]: t["state"] for t in self.task_instances(dag_id, run_id)}
        raise AirflowDeployError(
            f"{dag_id} run {run_id} still {run.get('state')} after {timeout:.0f} s "
            f"(tasks: {states})"
        )

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        path = f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances"
        return list(self.request("GET", path)["task_instances"])

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        path = f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}"
        return dict(self.request("GET", path))

    def xcom(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        key: str = "return_value",
        *,
        map_index: int | None = None,
    ) -> Any:
        path = (
            f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}"
            f"/xcomEntries/{key}"
        )
        params = None if map_index is None else {"map_index": map_index}
        value = self.request("GET", path, params=params)["value"]
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        return value

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        """The task's log for one try as text (one line per structured log event)."""
        path = (
            f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}"
            f"/logs/{try_number}"
        )
        out = self.request(
            "GET", path, params={"full_content": True}, headers={"Accept": "application/json"}
        )
        return "\n".join(_log_line(item) for item in out.get("content", []))


def _log_line(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    parts = [str(item.get(k, "")) for k in ("timestamp", "level", "event") if item.get(k)]
    extra = {k: v for k, v in item.items() if k not in ("timestamp", "level", "event")}
    return " ".join(parts) + (f" {json.dumps(extra, default=str)}" if extra else "")


# --- one-shot: a refresh under the scheduler ----------------------------------------------------
@dataclass(frozen=True)
class ScheduledRun:
    """A DAG run triggered through the REST API and read back from it."""

    dag_id: str
    run_id: str
    state: str
    tasks: dict[str, str]
    wall_seconds: float  # trigger request to terminal state seen by polling
    run: dict[str, Any]  # the DAG run as the API returned it (queued_at, start/end dates)
    task_seconds: dict[str, float | None] = field(default_factory=dict)  # per task, last try


def trigger_and_wait(
    api: AirflowApi,
    dag_id: str,
    conf: Mapping[str, Any] | None = None,
    *,
    timeout: float = 600,
    unpause: bool = True,
) -> ScheduledRun:
    """Unpause ``dag_id`` (runs of a paused DAG stay queued), trigger it, wait for the end."""
    if unpause:
        api.set_paused(dag_id, False)
    started = time.perf_counter()
    run = api.trigger(dag_id, conf)
    run_id = str(run["dag_run_id"])
    done = api.wait_run(dag_id, run_id, timeout=timeout)
    wall = time.perf_counter() - started
    tis = api.task_instances(dag_id, run_id)
    tasks = {t["task_id"]: str(t["state"]) for t in tis}
    durations = {t["task_id"]: t.get("duration") for t in tis}
    return ScheduledRun(dag_id, run_id, str(done["state"]), tasks, wall, done, durations)


def new_db_name(prefix: str = "ctx_airflow") -> str:
    return f"{prefix}_{secrets.token_hex(4)}"


@contextlib.contextmanager
def temporary_deployment(
    home: Path,
    *,
    pg_url: str = DEFAULT_PG_URL,
    dags_folder: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    db_name: str | None = None,
    keep_db: bool = False,
    dag_ids: tuple[str, ...] = (),
    ready_timeout: float = 180,
) -> Iterator[tuple[AirflowDeployment, AirflowApi]]:
    """A deployment in ``home`` on a new database, ready; stopped (and its DB dropped unless
    ``keep_db``) on exit, whatever happened inside."""
    dep = AirflowDeployment(
        home=home,
        db_name=db_name or new_db_name(),
        pg_url=pg_url,
        dags_folder=dags_folder or default_dags_folder(),
        extra_env=dict(extra_env or {}),
    )
    try:
        dep.prepare()
        dep.start()
        api = dep.wait_ready(timeout=ready_timeout, dag_ids=dag_ids)
        try:
            yield dep, api
        finally:
            api.close()
    finally:
        dep.stop()
        if not keep_db:
            with contextlib.suppress(Exception):
                drop_database(pg_url, dep.db_name)


def copy_dags(src: Path, dst: Path) -> Path:
    """Copy the ``*.py`` DAG files of ``src`` into ``dst`` (created)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.glob("*.py"):
        shutil.copy2(f, dst / f.name)
    return dst
