"""The edge server as a process: start it, stop it, and its command line.

:func:`start_edge_server` runs ``python -m context_core.knowledge.edge_server`` (:func:`main`)
and waits until it answers a ping; :func:`stop_edge_server` stops it (SIGTERM: it flushes,
closes its shards and removes its socket). ``ctx serve`` starts one for its workers.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from context_core.errors import BackendUnavailableError, ContextError
from context_core.knowledge.edge_server.client import RemoteEdgeStore
from context_core.knowledge.edge_server.server import EdgeServer

__all__ = ["main", "start_edge_server", "stop_edge_server"]

log = logging.getLogger(__name__)


def _tail(f: IO[bytes] | None, limit: int = 4000) -> str:
    if f is None:
        return ""
    try:
        f.flush()
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - limit))
        return f.read().decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return ""


def start_edge_server(
    root: Path | str,
    socket_path: Path | str,
    search_threads: int | None = None,
    *,
    timeout_s: float = 60.0,
    log_path: Path | str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``python -m context_core.knowledge.edge_server`` and wait until it answers a ping.

    The server's log (stderr) goes to ``log_path``, or to an anonymous temporary file; its
    tail is in the error when the server exits or does not answer within ``timeout_s``.
    """
    socket_path = Path(socket_path).expanduser().absolute()
    cmd = [
        sys.executable,
        "-m",
        "context_core.knowledge.edge_server",
        "--root",
        str(root),
        "--socket",
        str(socket_path),
        "--search-threads",
        str(search_threads or 0),
    ]
    # handed to the child, closed by stop_edge_server
    if log_path is not None:
        logf: IO[bytes] = open(log_path, "a+b")  # noqa: SIM115 - readable for the tail
    else:
        logf = tempfile.TemporaryFile(prefix="ctx-edge-server-")  # noqa: SIM115
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=logf,
        stderr=subprocess.STDOUT,
        env=dict(env) if env is not None else None,
        start_new_session=True,  # a Ctrl-C in the parent's terminal goes to the parent only
    )
    _LOGS[proc.pid] = logf
    client = RemoteEdgeStore(socket_path, timeout_s=5.0)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            code = proc.poll()
            if code is not None:
                raise BackendUnavailableError(
                    f"the edge server for {socket_path} exited with code {code} while "
                    f"starting:\n{_tail(logf)}"
                )
            try:
                if client.ping().get("pid") == proc.pid:
                    return proc
            except BackendUnavailableError:
                pass
            if time.monotonic() > deadline:
                stop_edge_server(proc, timeout_s=5.0)
                raise BackendUnavailableError(
                    f"the edge server for {socket_path} did not answer within {timeout_s} s:\n"
                    f"{_tail(logf)}"
                )
            time.sleep(0.05)
    except BaseException:
        if proc.poll() is not None:
            _close_log(proc)
        raise
    finally:
        client.close()


_LOGS: dict[int, IO[bytes]] = {}


def _close_log(proc: subprocess.Popen[bytes]) -> None:
    f = _LOGS.pop(proc.pid, None)
    if f is not None:
        f.close()


def stop_edge_server(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> int:
    """SIGTERM (the server flushes, closes its shards and removes its socket); SIGKILL after
    ``timeout_s``. Returns the exit code."""
    try:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.error(
                    "edge server pid %d ignored SIGTERM for %s s; killing it", proc.pid, timeout_s
                )
                proc.kill()
                proc.wait()
        return int(proc.returncode)
    finally:
        _close_log(proc)


# --- the server process's command line ----------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m context_core.knowledge.edge_server",
        description=(
            "Own the embedded Qdrant Edge shards under --root and serve them to other "
            "processes (e.g. several uvicorn workers) on a Unix socket. Point the workers at "
            "it with CTX_EDGE_SOCKET=<socket>. Serves until SIGTERM or SIGINT, then flushes "
            "and closes the shards and removes the socket."
        ),
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="the Qdrant Edge data dir (default: CTX_DATA_DIR/qdrant)",
    )
    parser.add_argument(
        "--socket",
        type=Path,
        default=None,
        help="the Unix socket to listen on, created with mode 0600 (default: CTX_EDGE_SOCKET)",
    )
    parser.add_argument(
        "--search-threads",
        type=int,
        default=None,
        metavar="N",
        help="search threads of each shard, 0 = one per CPU (default: CTX_QDRANT_SEARCH_THREADS)",
    )
    parser.add_argument(
        "--hnsw-ef",
        type=int,
        default=None,
        metavar="N",
        help="HNSW search beam width, 1..4096 (default: CTX_QDRANT_HNSW_EF, else the engine's)",
    )
    parser.add_argument(
        "--oversampling",
        type=float,
        default=None,
        metavar="X",
        help="int8 candidates per wanted hit rescored with the float vectors, 1..16 "
        "(default: CTX_QDRANT_OVERSAMPLING, else 2)",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    need = args.root is None or args.socket is None or args.search_threads is None
    tuned_by_env = (args.hnsw_ef is None and os.environ.get("CTX_QDRANT_HNSW_EF")) or (
        args.oversampling is None and os.environ.get("CTX_QDRANT_OVERSAMPLING")
    )
    if need or tuned_by_env:
        from context_core.config import get_settings

        try:
            settings = get_settings()
        except ContextError as e:
            parser.error(str(e))
        if args.root is None:
            args.root = settings.qdrant_dir
        if args.socket is None:
            args.socket = settings.edge_socket
        if args.search_threads is None:
            args.search_threads = settings.qdrant_search_threads
        if args.hnsw_ef is None:
            args.hnsw_ef = settings.qdrant_hnsw_ef
        if args.oversampling is None:
            args.oversampling = settings.qdrant_oversampling
    if args.socket is None:
        parser.error("--socket is required (or set CTX_EDGE_SOCKET)")
    if args.search_threads < 0:
        parser.error("--search-threads must be >= 0")
    if args.hnsw_ef is not None and not 1 <= args.hnsw_ef <= 4096:
        parser.error("--hnsw-ef must be between 1 and 4096")
    if args.oversampling is not None and not 1.0 <= args.oversampling <= 16.0:
        parser.error("--oversampling must be between 1 and 16")

    stop = threading.Event()

    def _on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    server = EdgeServer(
        args.root,
        args.socket,
        search_threads=args.search_threads or None,
        hnsw_ef=args.hnsw_ef,
        oversampling=args.oversampling,
    )
    try:
        server.start()
    except ContextError as e:
        log.error("edge server did not start: %s", e)
        return 1
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.close()
    return 0
