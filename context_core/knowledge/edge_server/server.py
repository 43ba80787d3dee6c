"""The edge server: one process owns the Qdrant Edge shards and serves them on a Unix socket.

:class:`EdgeServer` holds an :class:`~context_core.knowledge.edge.EdgeStore` on the data dir
(locked: one server per set of shards), answers each connection from its own thread, and
keeps no per-client state (see :mod:`.protocol` for the wire format). :mod:`.process` runs it
as ``python -m context_core.knowledge.edge_server``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from context_core.errors import (
    BackendUnavailableError,
    ConfigError,
    ContextError,
    InvalidStoreRequestError,
)
from context_core.knowledge.edge_server import protocol
from context_core.knowledge.store import PointRecord, parse_filter

__all__ = ["LOCK_NAME", "EdgeServer"]

log = logging.getLogger(__name__)

LOCK_NAME = ".edge_server.lock"  # in the data dir: one server per set of shards
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes with the trailing NUL


class EdgeServer:
    """Owns an :class:`EdgeStore` on ``root`` and serves it on the Unix socket ``socket_path``.

    :meth:`start` binds the socket (mode 0600) and serves from background threads, one per
    connection; :meth:`close` stops accepting, lets running requests finish, flushes and
    closes the shards and removes the socket file. ``search_threads`` is EdgeStore's.
    """

    def __init__(
        self,
        root: Path | str,
        socket_path: Path | str,
        search_threads: int | None = None,
        hnsw_ef: int | None = None,
        oversampling: float | None = None,
    ) -> None:
        self.root = Path(root).expanduser().resolve()
        self.socket_path = Path(socket_path).expanduser().absolute()
        self.search_threads = search_threads
        self.hnsw_ef = hnsw_ef
        self.oversampling = oversampling
        self.store: Any = None  # the EdgeStore, once started
        self._listener: socket.socket | None = None
        self._lock_file: IO[bytes] | None = None
        self._conns: dict[protocol.Conn, threading.Thread] = {}
        self._conns_lock = threading.Lock()
        self._accept_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._closed = False
        self._ops: dict[str, Callable[[dict[str, Any]], Any]] = {
            "ping": self._op_ping,
            "create_collection": self._op_create_collection,
            "drop_collection": self._op_drop_collection,
            "info": self._op_info,
            "upsert": self._op_upsert,
            "delete": self._op_delete,
            "search": self._op_search,
            "search_batch": self._op_search_batch,
            "scroll": self._op_scroll,
            "retrieve": self._op_retrieve,
            "count": self._op_count,
            "optimize": self._op_optimize,
            "enable_sparse": self._op_enable_sparse,
            "set_sparse": self._op_set_sparse,
            "index_status": self._op_index_status,
            "flush": self._op_flush,
        }

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> EdgeServer:
        from context_core.knowledge.edge import EdgeStore

        if len(os.fsencode(self.socket_path)) > _SUN_PATH_MAX:
            raise ConfigError(
                f"edge server socket path {self.socket_path} is longer than the "
                f"{_SUN_PATH_MAX} bytes a Unix socket path may have; set CTX_EDGE_SOCKET "
                "to a shorter path (e.g. under /run or /tmp)"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_root()
        try:
            self._clear_socket_path()
            self.store = EdgeStore(
                self.root,
                search_threads=self.search_threads,
                hnsw_ef=self.hnsw_ef,
                oversampling=self.oversampling,
            )
            opened = self._open_collections()
            self._listener = self._bind()
        except BaseException:
            self._teardown()
            raise
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="edge-server-accept", daemon=True
        )
        self._accept_thread.start()
        log.info(
            "edge server ready: socket=%s root=%s collections=%d search_threads=%s pid=%d",
            self.socket_path,
            self.root,
            opened,
            self.search_threads if self.search_threads is not None else "per-cpu",
            os.getpid(),
        )
        return self

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop serving; running requests get up to ``timeout_s`` to finish."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5)
        with self._conns_lock:
            conns = list(self._conns.items())
        for conn, _ in conns:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RD)  # the answer being computed still goes out
        deadline = time.monotonic() + timeout_s
        for _, thread in conns:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._teardown()
        log.info("edge server stopped: socket=%s root=%s", self.socket_path, self.root)

    def __enter__(self) -> EdgeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lock_root(self) -> None:
        path = self.root / LOCK_NAME
        f = open(path, "a+b")  # noqa: SIM115 - held open for the server's lifetime
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            f.close()
            raise BackendUnavailableError(
                f"another edge server already owns the Qdrant Edge shards under {self.root} "
                f"(lock {path} is held); point CTX_EDGE_SOCKET at that server's socket "
                "instead of starting a second one"
            ) from e
        self._lock_file = f

    def _clear_socket_path(self) -> None:
        """Refuse if a live server answers on the path; remove a stale socket file."""
        path = self.socket_path
        try:
            st = path.lstat()
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(
                f"edge server socket path {path} exists and is not a socket; "
                "choose another path (CTX_EDGE_SOCKET) or remove the file"
            )
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(2.0)
        try:
            probe.connect(str(path))
        except OSError:
            log.info("removing stale edge server socket %s", path)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return
        finally:
            probe.close()
        raise BackendUnavailableError(
            f"an edge server is already listening on {path}; use it (CTX_EDGE_SOCKET={path}) "
            "or stop it before starting another one"
        )

    def _open_collections(self) -> int:
        """Open every collection's shard now: lock clashes show at start, not at first use."""
        from context_core.knowledge.edge import SIDECAR

        opened = 0
        for d in sorted(self.root.iterdir()):
            if not (d / SIDECAR).is_file():
                continue
            try:
                self.store.count(d.name)
                opened += 1
            except ContextError as e:
                # the other collections stay served; this one fails per call with the same text
                log.error("edge server could not open collection %r: %s", d.name, e)
        return opened

    def _bind(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(self.socket_path))
            # Nobody can connect before listen(), so tightening the mode here leaves no window
            # in which another user could open a connection.
            os.chmod(self.socket_path, 0o600)
            sock.listen(64)
        except OSError as e:
            sock.close()
            raise BackendUnavailableError(
                f"edge server could not listen on {self.socket_path}: {e}"
            ) from e
        return sock

    def _teardown(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
            self._listener = None
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        if self.store is not None:
            try:
                self.store.flush()
            except ContextError as e:
                log.error("edge server flush failed: %s", e)
            finally:
                self.store.close()
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None

    # --- serving -------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError as e:
                if self._stopping.is_set():
                    return
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.error("edge server accept failed: %s; retrying", e)
                    time.sleep(0.1)
                    continue
                log.error("edge server accept failed: %s; no longer accepting", e)
                return
            conn = protocol.Conn(sock)
            thread = threading.Thread(
                target=self._serve_conn, args=(conn,), name="edge-server-conn", daemon=True
            )
            with self._conns_lock:
                if self._stopping.is_set():
                    conn.close()
                    return
                self._conns[conn] = thread
            thread.start()

    def _serve_conn(self, conn: protocol.Conn) -> None:
        try:
            while True:
                try:
                    body = conn.recv(protocol.MAX_FRAME_BYTES)
                except protocol.FrameTooLargeError as e:
                    # the oversized body is still on its way: answer, then drop the connection
                    msg = protocol.too_large_message("a request", e.size)
                    log.warning("edge server refused a frame: %s", msg)
                    with contextlib.suppress(OSError):
                        conn.send(protocol.error_body(InvalidStoreRequestError(msg)))
                    return
                except (protocol.ConnectionLostError, OSError):
                    return
                answer = self._handle(body)
                try:
                    conn.send(answer)
                except OSError:
                    return
        finally:
            with self._conns_lock:
                self._conns.pop(conn, None)
            conn.close()

    def _handle(self, body: bytes | bytearray) -> bytes:
        op = "?"
        try:
            req = protocol.decode(body)
            if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                raise InvalidStoreRequestError('a request is {"op": name, "args": {...}}')
            op = req["op"]
            fn = self._ops.get(op)
            if fn is None:
                raise InvalidStoreRequestError(
                    f"unknown edge server op {op!r} (protocol {protocol.PROTOCOL_VERSION}: "
                    f"{', '.join(sorted(self._ops))})"
                )
            args = req.get("args") or {}
            out = protocol.encode({"ok": fn(args)})
        except protocol.DecodeError as e:
            return protocol.error_body(
                InvalidStoreRequestError(f"malformed edge server request: {e}")
            )
        except ContextError as e:
            return protocol.error_body(e)
        except Exception as e:
            log.exception("edge server op %s failed", op)
            return protocol.error_body(e)
        if len(out) > protocol.MAX_FRAME_BYTES:
            return protocol.error_body(
                InvalidStoreRequestError(protocol.too_large_message(f"the {op} answer", len(out)))
            )
        return out

    # --- ops (args arrive as decoded msgpack) ---------------------------------------------
    def _op_ping(self, a: dict[str, Any]) -> dict[str, Any]:
        return {"protocol": protocol.PROTOCOL_VERSION, "pid": os.getpid(), "root": str(self.root)}

    def _op_create_collection(self, a: dict[str, Any]) -> None:
        self.store.create_collection(
            a["name"], dim=a["dim"], model=a["model"], sparse=a.get("sparse")
        )

    def _op_enable_sparse(self, a: dict[str, Any]) -> None:
        self.store.enable_sparse(a["name"], a["sparse"])

    def _op_set_sparse(self, a: dict[str, Any]) -> None:
        points = []
        for pid, raw in a["points"]:
            sv = protocol.sparse_in(raw)
            if sv is not None:
                points.append((pid, sv))
        self.store.set_sparse(a["name"], points)

    def _op_drop_collection(self, a: dict[str, Any]) -> None:
        self.store.drop_collection(a["name"])

    def _op_info(self, a: dict[str, Any]) -> list[Any] | None:
        info = self.store.info(a["name"])
        if info is None:
            return None
        return [info.name, info.dim, info.model, info.count, info.sparse]

    def _op_upsert(self, a: dict[str, Any]) -> None:
        points = [
            PointRecord(
                id=r[0],
                vector=None if r[1] is None else protocol.vec_in(r[1]),
                payload=r[2],
                sparse=protocol.sparse_in(r[3]) if len(r) > 3 else None,
            )
            for r in a["points"]
        ]
        self.store.upsert(a["name"], points)

    def _op_delete(self, a: dict[str, Any]) -> None:
        self.store.delete(a["name"], ids=a.get("ids"), filter=a.get("filter"))

    def _op_search(self, a: dict[str, Any]) -> list[list[Any]]:
        vector, query = protocol.vec_in(a["vector"]), protocol.query_in(a)
        hits = self.store.search(vector, query, protocol.sparse_in(a.get("sparse")))
        return [protocol.hit_out(h) for h in hits]

    def _op_search_batch(self, a: dict[str, Any]) -> list[dict[str, Any]]:
        """One vector, several searches (main + hot of one route) in one round trip; each
        answer is ``{"ok": rows}`` or ``{"error": {...}}`` on its own."""
        vector = protocol.vec_in(a["vector"])
        sparse = protocol.sparse_in(a.get("sparse"))
        out: list[dict[str, Any]] = []
        for q in a["queries"]:
            try:
                hits = self.store.search(vector, protocol.query_in(q), sparse)
            except Exception as e:
                out.append({"error": {"type": type(e).__name__, "message": str(e)}})
            else:
                out.append({"ok": [protocol.hit_out(h) for h in hits]})
        return out

    def _op_scroll(self, a: dict[str, Any]) -> dict[str, Any]:
        """One page, as EdgeStore.scroll reads it; ``next`` is the offset of the next page."""
        import qdrant_edge as qe

        from context_core.knowledge._qdrant import EDGE, to_record

        name, with_vectors = a["name"], bool(a["with_vectors"])
        shard = self.store._shard(name)
        req = qe.ScrollRequest(
            offset=a.get("offset"),
            limit=a["batch"],
            filter=EDGE.filter(parse_filter(a.get("filter"))),
            with_payload=True,
            with_vector=with_vectors,
        )
        records, nxt = self.store._call(name, "scroll", shard.scroll, req)
        points = [protocol.point_out(to_record(r, with_vectors)) for r in records]
        return {"points": points, "next": nxt}  # a UUID travels as its string

    def _op_retrieve(self, a: dict[str, Any]) -> list[list[Any]]:
        found = self.store.retrieve(a["name"], a["ids"], with_vectors=bool(a["with_vectors"]))
        return [protocol.point_out(p) for p in found]

    def _op_count(self, a: dict[str, Any]) -> int:
        return int(self.store.count(a["name"], filter=a.get("filter")))

    def _op_optimize(self, a: dict[str, Any]) -> list[int]:
        s = self.store.optimize(a["name"])
        return [s.points, s.indexed_vectors, s.segments]

    def _op_index_status(self, a: dict[str, Any]) -> list[int]:
        s = self.store.index_status(a["name"])
        return [s.points, s.indexed_vectors, s.segments]

    def _op_flush(self, a: dict[str, Any]) -> None:
        self.store.flush()
