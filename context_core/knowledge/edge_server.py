"""One process owns the Qdrant Edge shards; the others reach them over a Unix socket.

A Qdrant Edge shard directory can be opened by one process only (its WAL is locked; a second
``EdgeShard.load`` fails with "Can't init WAL: WouldBlock") and the binding has no read-only
follower. A service with several worker processes therefore runs one :class:`EdgeServer`,
which holds an :class:`~context_core.knowledge.edge.EdgeStore` on the data dir, and gives
every worker a :class:`RemoteEdgeStore`: the same
:class:`~context_core.knowledge.store.VectorStore` protocol, the same answers and the same
error classes (the contract suite runs unchanged against it). ``CTX_EDGE_SOCKET`` makes
:func:`~context_core.knowledge.store.open_store` return one.

Run the server::

    python -m context_core.knowledge.edge_server --root .ctx/qdrant --socket /run/ctx/edge.sock

Wire format (one request, then its answer, on a persistent connection; never pickle)::

    frame    = 4-byte big-endian body length + body (msgpack, at most MAX_FRAME_BYTES)
    request  = {"op": "search", "args": {"name": ..., "vector": <bin>, "limit": 3, ...}}
    answer   = {"ok": value} | {"error": {"type": "CollectionNotFoundError", "message": ...}}

Vectors travel as msgpack ``bin``: the raw little-endian float32 bytes (``numpy.tobytes``),
1.5 KiB for a 384-d query. That is what the shards store anyway (float32), so nothing is
lost, and it is much cheaper than a msgpack array of 384 doubles on both sides (one memcpy
instead of 384 typed floats to encode and decode). A sparse vector travels the same way as
``[indices-bin (uint32), values-bin (float32)]`` or nil. Hits go back as ``[id, score,
payload, sparse_score, rank]`` rows, points as ``[id, vector-bin-or-nil, payload, sparse]``.

The server keeps no per-client state: ``scroll`` returns one page and the offset to pass back
(the Edge scroll cursor is the id of the next point), so a client can iterate lazily and a
restarted server loses nothing. Every operation is idempotent (upserts by id, deletes, creates
and drops are), so a client that finds its connection dead reconnects once and re-sends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import msgspec
import numpy as np

from context_core.concurrency import OneExchange, await_, on_loop_now
from context_core.errors import (
    BackendUnavailableError,
    CollectionNotFoundError,
    ConfigError,
    ContextError,
    InvalidStoreRequestError,
    ModelMismatchError,
)
from context_core.knowledge.store import (
    CollectionInfo,
    Filter,
    Hit,
    IndexStatus,
    PointRecord,
    SearchQuery,
    SparseVector,
    Vector,
    parse_filter,
)

__all__ = [
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "EdgeServer",
    "RemoteEdgeStore",
    "main",
    "start_edge_server",
    "stop_edge_server",
]

log = logging.getLogger("context_core.knowledge.edge_server")  # also under -m

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 64 * 1024 * 1024  # one request or answer; clients split bigger batches
LOCK_NAME = ".edge_server.lock"  # in the data dir: one server per set of shards
_VEC = np.dtype("<f4")
_IDX = np.dtype("<u4")
_READ_CHUNK = 64 * 1024
_BATCH = 1024  # points per upsert/retrieve frame and per scroll page (EdgeStore batches 1024)
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes with the trailing NUL

# Classes re-raised client-side under their own name; anything else -> BackendUnavailableError.
_ERROR_TYPES: dict[str, type[ContextError]] = {
    cls.__name__: cls
    for cls in (
        BackendUnavailableError,
        CollectionNotFoundError,
        ConfigError,
        InvalidStoreRequestError,
        ModelMismatchError,
    )
}


def _enc_hook(obj: Any) -> Any:
    """What msgpack lacks natively: numpy values (in payloads) and read-only mappings."""
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Mapping):
        return dict(obj)
    raise NotImplementedError(f"cannot send a {type(obj).__name__} to the edge server")


# Encoders/decoders keep no state between calls: one of each is shared by all threads.
_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_DECODER = msgspec.msgpack.Decoder()


class _ConnectionLostError(Exception):
    """The peer closed the connection (EOF)."""


class _FrameTooLargeError(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class _RequestTooLargeError(InvalidStoreRequestError):
    """A request over MAX_FRAME_BYTES; raised before anything is sent."""


def _too_large_message(what: str, size: int) -> str:
    return (
        f"{what} of {size} bytes is over the edge server's frame cap of {MAX_FRAME_BYTES} "
        "bytes (MAX_FRAME_BYTES); send fewer or smaller points per call"
    )


class _Conn:
    """One stream socket with length-prefixed framing and a read buffer."""

    __slots__ = ("buf", "sock", "timeout")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.timeout = sock.gettimeout()

    def set_timeout(self, timeout: float | None) -> None:
        if timeout != self.timeout:
            self.sock.settimeout(timeout)
            self.timeout = timeout

    def send(self, body: bytes) -> None:
        header = len(body).to_bytes(4, "big")
        if len(body) <= _READ_CHUNK:
            self.sock.sendall(header + body)  # one syscall for the usual small message
        else:
            self.sock.sendall(header)
            self.sock.sendall(body)

    def recv(self, cap: int) -> bytes | bytearray:
        buf = self.buf
        while len(buf) < 4:
            self._fill()
        size = int.from_bytes(buf[:4], "big")
        if size > cap:
            raise _FrameTooLargeError(size)
        end = 4 + size
        if len(buf) < end and size <= _READ_CHUNK:
            while len(buf) < end:
                self._fill()
        if len(buf) >= end:
            body = bytes(buf[4:end])
            del buf[:end]
            return body
        # a big frame: read the rest straight into place
        out = bytearray(size)
        have = len(buf) - 4
        out[:have] = buf[4:]
        buf.clear()
        view = memoryview(out)
        while have < size:
            got = self.sock.recv_into(view[have:])
            if not got:
                raise _ConnectionLostError("connection closed in the middle of a frame")
            have += got
        return out

    def _fill(self) -> None:
        chunk = self.sock.recv(_READ_CHUNK)
        if not chunk:
            raise _ConnectionLostError("connection closed")
        self.buf += chunk

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class _LoopConn(OneExchange[bytes]):
    """:class:`_Conn` for code on the event loop (:mod:`context_core.concurrency`): the same
    framing, its one exchange awaited (no worker thread, no blocking socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.buf = bytearray()

    def lost_error(self, exc: Exception | None) -> BaseException:
        return _ConnectionLostError(f"connection closed ({exc or 'EOF'})")

    def data_received(self, data: bytes) -> None:
        self.buf += data
        buf = self.buf
        if self.waiter is None or len(buf) < 4:
            return
        size = int.from_bytes(buf[:4], "big")
        if size > MAX_FRAME_BYTES:
            self.fail(_FrameTooLargeError(size))
            return
        end = 4 + size
        if len(buf) >= end:
            body = bytes(buf[4:end])
            del buf[:end]
            self.answer(body)


def _error_body(exc: BaseException) -> bytes:
    return _ENCODER.encode({"error": {"type": type(exc).__name__, "message": str(exc)}})


# --- vectors and points on the wire ---------------------------------------------------------


def _vec_out(vector: Vector) -> bytes:
    """A vector as raw little-endian float32 bytes (the client side of the wire)."""
    try:
        arr = np.asarray(vector, dtype=_VEC)
    except (TypeError, ValueError) as e:
        raise InvalidStoreRequestError(f"a vector must be a sequence of numbers: {e}") from e
    if arr.ndim != 1:
        raise InvalidStoreRequestError(
            f"a vector must be one-dimensional, got an array of shape {arr.shape}"
        )
    return arr.tobytes()


def _vec_in(raw: Any) -> np.ndarray:
    if not isinstance(raw, bytes | bytearray | memoryview) or len(raw) % _VEC.itemsize:
        raise InvalidStoreRequestError("a vector must arrive as float32 bytes")
    return np.frombuffer(raw, dtype=_VEC)


def _vec_list(raw: bytes | None) -> list[float] | None:
    # EdgeStore hands back plain lists of floats; so does the remote store
    return None if raw is None else np.frombuffer(raw, dtype=_VEC).tolist()


def _sparse_out(sv: SparseVector | None) -> list[bytes] | None:
    if sv is None:
        return None
    try:
        raw = sv.indices
        plain = all(type(i) is int for i in raw)  # the usual tuple: no numpy reductions
        # plain ints are range-checked before numpy sees them (an int past int64 overflows)
        if plain and raw and (min(raw) < 0 or max(raw) > 0xFFFFFFFF):
            raise ValueError("indices must be in the uint32 range")
        idx = np.asarray(raw, dtype=np.int64)
        if not plain and idx.size and (idx.min() < 0 or idx.max() > 0xFFFFFFFF):
            raise ValueError("indices must be in the uint32 range")
        return [idx.astype(_IDX).tobytes(), np.asarray(sv.values, dtype=_VEC).tobytes()]
    except (TypeError, ValueError) as e:
        raise InvalidStoreRequestError(f"a sparse vector must be ints and numbers: {e}") from e


def _sparse_in(raw: Any) -> SparseVector | None:
    if raw is None:
        return None
    if not isinstance(raw, list | tuple) or len(raw) != 2:
        raise InvalidStoreRequestError("a sparse vector must arrive as [indices, values] bytes")
    idx, val = raw
    if not all(isinstance(b, bytes | bytearray) and len(b) % 4 == 0 for b in (idx, val)):
        raise InvalidStoreRequestError("a sparse vector must arrive as [indices, values] bytes")
    return SparseVector(
        tuple(np.frombuffer(idx, dtype=_IDX).tolist()),
        tuple(np.frombuffer(val, dtype=_VEC).tolist()),
    )


def _point_out(p: PointRecord) -> list[Any]:
    vec = None if p.vector is None else np.asarray(p.vector, dtype=_VEC).tobytes()
    return [p.id, vec, p.payload, _sparse_out(p.sparse)]


def _point_in(row: Sequence[Any]) -> PointRecord:
    sparse = _sparse_in(row[3]) if len(row) > 3 else None
    return PointRecord(id=row[0], vector=_vec_list(row[1]), payload=row[2], sparse=sparse)


def _hit_out(h: Hit) -> list[Any]:
    return [h.id, h.score, h.payload, h.sparse_score, h.rank]


def _hit_in(r: Sequence[Any]) -> Hit:
    if len(r) > 3:
        return Hit(id=r[0], score=r[1], payload=r[2], sparse_score=r[3], rank=r[4])
    return Hit(id=r[0], score=r[1], payload=r[2])


# --- server -------------------------------------------------------------------------------


class EdgeServer:
    """Owns an :class:`EdgeStore` on ``root`` and serves it on the Unix socket ``socket_path``.

    :meth:`start` binds the socket (mode 0600) and serves from background threads, one per
    connection; :meth:`close` stops accepting, lets running requests finish, flushes and
    closes the shards and removes the socket file. ``search_threads`` is EdgeStore's.
    """

    def __init__(
        self, root: Path | str, socket_path: Path | str, search_threads: int | None = None
    ) -> None:
        self.root = Path(root).expanduser().resolve()
        self.socket_path = Path(socket_path).expanduser().absolute()
        self.search_threads = search_threads
        self.store: Any = None  # the EdgeStore, once started
        self._listener: socket.socket | None = None
        self._lock_file: IO[bytes] | None = None
        self._conns: dict[_Conn, threading.Thread] = {}
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
            self.store = EdgeStore(self.root, search_threads=self.search_threads)
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
            conn = _Conn(sock)
            thread = threading.Thread(
                target=self._serve_conn, args=(conn,), name="edge-server-conn", daemon=True
            )
            with self._conns_lock:
                if self._stopping.is_set():
                    conn.close()
                    return
                self._conns[conn] = thread
            thread.start()

    def _serve_conn(self, conn: _Conn) -> None:
        try:
            while True:
                try:
                    body = conn.recv(MAX_FRAME_BYTES)
                except _FrameTooLargeError as e:
                    # the oversized body is still on its way: answer, then drop the connection
                    msg = _too_large_message("a request", e.size)
                    log.warning("edge server refused a frame: %s", msg)
                    with contextlib.suppress(OSError):
                        conn.send(_error_body(InvalidStoreRequestError(msg)))
                    return
                except (_ConnectionLostError, OSError):
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
            req = _DECODER.decode(body)
            if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                raise InvalidStoreRequestError('a request is {"op": name, "args": {...}}')
            op = req["op"]
            fn = self._ops.get(op)
            if fn is None:
                raise InvalidStoreRequestError(
                    f"unknown edge server op {op!r} (protocol {PROTOCOL_VERSION}: "
                    f"{', '.join(sorted(self._ops))})"
                )
            args = req.get("args") or {}
            out = _ENCODER.encode({"ok": fn(args)})
        except msgspec.DecodeError as e:
            return _error_body(InvalidStoreRequestError(f"malformed edge server request: {e}"))
        except ContextError as e:
            return _error_body(e)
        except Exception as e:
            log.exception("edge server op %s failed", op)
            return _error_body(e)
        if len(out) > MAX_FRAME_BYTES:
            return _error_body(
                InvalidStoreRequestError(_too_large_message(f"the {op} answer", len(out)))
            )
        return out

    # --- ops (args arrive as decoded msgpack) ---------------------------------------------
    def _op_ping(self, a: dict[str, Any]) -> dict[str, Any]:
        return {"protocol": PROTOCOL_VERSION, "pid": os.getpid(), "root": str(self.root)}

    def _op_create_collection(self, a: dict[str, Any]) -> None:
        self.store.create_collection(
            a["name"], dim=a["dim"], model=a["model"], sparse=a.get("sparse")
        )

    def _op_enable_sparse(self, a: dict[str, Any]) -> None:
        self.store.enable_sparse(a["name"], a["sparse"])

    def _op_set_sparse(self, a: dict[str, Any]) -> None:
        points = []
        for pid, raw in a["points"]:
            sv = _sparse_in(raw)
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
                vector=None if r[1] is None else _vec_in(r[1]),
                payload=r[2],
                sparse=_sparse_in(r[3]) if len(r) > 3 else None,
            )
            for r in a["points"]
        ]
        self.store.upsert(a["name"], points)

    def _op_delete(self, a: dict[str, Any]) -> None:
        self.store.delete(a["name"], ids=a.get("ids"), filter=a.get("filter"))

    def _op_search(self, a: dict[str, Any]) -> list[list[Any]]:
        hits = self.store.search(
            a["name"],
            _vec_in(a["vector"]),
            limit=a["limit"],
            filter=a.get("filter"),
            exact=a["exact"],
            mode=a.get("mode", "dense"),
            fusion=a.get("fusion", "rrf"),
            sparse=_sparse_in(a.get("sparse")),
            feedback=int(a.get("feedback", 0)),
        )
        return [_hit_out(h) for h in hits]

    def _op_search_batch(self, a: dict[str, Any]) -> list[dict[str, Any]]:
        """One vector, several searches (main + hot of one route) in one round trip; each
        answer is ``{"ok": rows}`` or ``{"error": {...}}`` on its own."""
        vector = _vec_in(a["vector"])
        sparse = _sparse_in(a.get("sparse"))
        out: list[dict[str, Any]] = []
        for q in a["queries"]:
            try:
                hits = self.store.search(
                    q["name"],
                    vector,
                    limit=q["limit"],
                    filter=q.get("filter"),
                    exact=q["exact"],
                    mode=q.get("mode", "dense"),
                    fusion=q.get("fusion", "rrf"),
                    sparse=sparse,
                    feedback=int(q.get("feedback", 0)),
                )
            except Exception as e:
                out.append({"error": {"type": type(e).__name__, "message": str(e)}})
            else:
                out.append({"ok": [_hit_out(h) for h in hits]})
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
        points = [_point_out(to_record(r, with_vectors)) for r in records]
        return {"points": points, "next": nxt}  # a UUID travels as its string

    def _op_retrieve(self, a: dict[str, Any]) -> list[list[Any]]:
        found = self.store.retrieve(a["name"], a["ids"], with_vectors=bool(a["with_vectors"]))
        return [_point_out(p) for p in found]

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


# --- client -------------------------------------------------------------------------------


class RemoteEdgeStore:
    """:class:`~context_core.knowledge.store.VectorStore` served by an :class:`EdgeServer`.

    Thread-safe: a call borrows a connection from a small pool (a new one when all are busy)
    and gives it back, so there are as many connections as concurrent calls, at most
    ``max_idle`` of them kept open between calls. Connections are opened lazily: a worker can
    start before the server. ``timeout_s`` bounds reads and small writes; bulk calls (upsert,
    optimize, drop, delete) get ``bulk_timeout_s``. :meth:`close` closes the connections
    only: the server and its shards stay up for the other workers.
    """

    def __init__(
        self,
        socket_path: Path | str,
        *,
        timeout_s: float = 30.0,
        bulk_timeout_s: float = 3600.0,
        max_idle: int = 8,
    ) -> None:
        self.socket_path = Path(socket_path).expanduser().absolute()
        self.timeout_s = timeout_s
        self.bulk_timeout_s = bulk_timeout_s
        self.max_idle = max_idle
        self._idle: list[_Conn] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
        # connections of code on the event loop (one loop: the service's); see _exchange_async
        self._loop_idle: list[_LoopConn] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    #: a call made on the event loop (context_core.concurrency) awaits its exchange instead of
    #: blocking: the router runs an L3 search on the loop, not on a worker thread
    awaits_on_loop = True

    @property
    def where(self) -> str:
        return f"unix:{self.socket_path}"

    # --- connections ---------------------------------------------------------------------
    def _checkout(self, *, fresh: bool = False) -> _Conn:
        if self._pid != os.getpid():  # forked: the parent's sockets are not ours to use
            self._checkout_reset()
        stale: list[_Conn] = []
        with self._lock:
            if self._closed:
                raise BackendUnavailableError(f"RemoteEdgeStore on {self.socket_path} is closed")
            if fresh:  # one connection died: the others went to the same (old) server
                stale, self._idle = self._idle, []
            elif self._idle:
                return self._idle.pop()
        for conn in stale:
            conn.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(str(self.socket_path))
        except BaseException:
            sock.close()
            raise
        return _Conn(sock)

    def _checkin(self, conn: _Conn) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def _unreachable(self, op: str, e: BaseException) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"the Qdrant Edge server on {self.socket_path} is unreachable ({op}: {e}); start it "
            f"(python -m context_core.knowledge.edge_server --root <CTX_DATA_DIR>/qdrant "
            f"--socket {self.socket_path}) or unset CTX_EDGE_SOCKET to open the shards in "
            "this process (one process only)"
        )

    def _no_accept(self, op: str) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"the Qdrant Edge server on {self.socket_path} did not accept a connection "
            f"within {self.timeout_s} s ({op})"
        )

    def _no_answer(self, op: str, timeout: float | None) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"the Qdrant Edge server on {self.socket_path} did not answer {op} within "
            f"{timeout} s; it may be overloaded or stuck"
        )

    def _too_big(self, op: str, size: int) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"the Qdrant Edge server on {self.socket_path} sent a {size}-byte answer "
            f"to {op}, over the {MAX_FRAME_BYTES}-byte cap (protocol error)"
        )

    def _call(self, op: str, args: dict[str, Any], *, timeout: float | None = None) -> Any:
        try:
            body = _ENCODER.encode({"op": op, "args": args})
        except (TypeError, OverflowError, NotImplementedError) as e:
            raise InvalidStoreRequestError(f"{op}: cannot encode the request: {e}") from e
        if len(body) > MAX_FRAME_BYTES:
            raise _RequestTooLargeError(_too_large_message(f"the {op} request", len(body)))
        timeout = self.timeout_s if timeout is None else timeout
        raw: bytes | bytearray
        if on_loop_now():
            raw = await_(self._exchange_async(op, body, timeout))
        else:
            raw = self._exchange(op, body, timeout)
        try:
            reply = _DECODER.decode(raw)
        except msgspec.DecodeError as e:
            raise BackendUnavailableError(
                f"the Qdrant Edge server on {self.socket_path} sent a malformed answer to {op}: {e}"
            ) from e
        if "error" in reply:
            err = reply["error"]
            cls = _ERROR_TYPES.get(err.get("type", ""))
            if cls is None:
                raise BackendUnavailableError(
                    f"the Qdrant Edge server on {self.socket_path} failed on {op}: "
                    f"{err.get('type')}: {err.get('message')}"
                )
            raise cls(err.get("message", ""))
        return reply["ok"]

    def _verdict(
        self, op: str, timeout: float | None, e: BaseException, *, connecting: bool
    ) -> BackendUnavailableError | None:
        """What a failed connect or exchange means: None to retry once on a new connection
        (a dead pooled connection, a restarted server), else the error to raise."""
        if isinstance(e, TimeoutError):
            return self._no_accept(op) if connecting else self._no_answer(op, timeout)
        if isinstance(e, _FrameTooLargeError):
            return self._too_big(op, e.size)
        return None

    def _exchange(self, op: str, body: bytes, timeout: float | None) -> bytes | bytearray:
        last: BaseException | None = None
        for attempt in range(2):  # a dead pooled connection or server restart: reconnect once
            conn: _Conn | None = None
            try:
                conn = self._checkout(fresh=attempt > 0)
                conn.set_timeout(timeout)
                conn.send(body)
                raw = conn.recv(MAX_FRAME_BYTES)
            except (OSError, _ConnectionLostError, _FrameTooLargeError) as e:
                if conn is not None:
                    conn.close()  # a late answer would desynchronise the connection
                verdict = self._verdict(op, timeout, e, connecting=conn is None)
                if verdict is not None:
                    raise verdict from e
                last = e
                continue
            self._checkin(conn)
            return raw
        assert last is not None
        raise self._unreachable(op, last) from last

    async def _exchange_async(self, op: str, body: bytes, timeout: float | None) -> bytes:
        """:meth:`_exchange` on the event loop: the same retries, timeouts and errors."""
        frame = len(body).to_bytes(4, "big") + body
        last: BaseException | None = None
        for attempt in range(2):
            conn: _LoopConn | None = None
            try:
                conn = await self._acheckout(fresh=attempt > 0)
                raw = await conn.exchange(frame, timeout)
            except (OSError, _ConnectionLostError, _FrameTooLargeError) as e:
                if conn is not None:
                    conn.close()
                verdict = self._verdict(op, timeout, e, connecting=conn is None)
                if verdict is not None:
                    raise verdict from e
                last = e
                continue
            except BaseException:  # cancelled mid-exchange: its answer would come late
                if conn is not None:
                    conn.close()
                raise
            if not self._closed and len(self._loop_idle) < self.max_idle:
                self._loop_idle.append(conn)
            else:
                conn.close()
            return raw
        assert last is not None
        raise self._unreachable(op, last) from last

    async def _acheckout(self, *, fresh: bool) -> _LoopConn:
        if self._pid != os.getpid():
            self._checkout_reset()
        if self._closed:
            raise BackendUnavailableError(f"RemoteEdgeStore on {self.socket_path} is closed")
        loop = asyncio.get_running_loop()
        if self._loop is not loop or fresh:  # another loop's connections are not usable here
            stale, self._loop_idle, self._loop = self._loop_idle, [], loop
            for old in stale:
                with contextlib.suppress(Exception):
                    old.close()
        if self._loop_idle:
            return self._loop_idle.pop()
        _, conn = await asyncio.wait_for(
            loop.create_unix_connection(_LoopConn, str(self.socket_path)), self.timeout_s
        )
        return conn

    def _checkout_reset(self) -> None:
        self._lock = threading.Lock()
        self._idle = []
        self._loop_idle, self._loop = [], None
        self._pid = os.getpid()

    # --- VectorStore ---------------------------------------------------------------------
    def ping(self) -> dict[str, Any]:
        """``{"protocol", "pid", "root"}`` of the server (BackendUnavailableError if none)."""
        return dict(self._call("ping", {}))

    def create_collection(
        self, name: str, *, dim: int, model: str, sparse: str | None = None
    ) -> None:
        self._call(
            "create_collection",
            {"name": name, "dim": dim, "model": model, "sparse": sparse},
            timeout=self.bulk_timeout_s,
        )

    def enable_sparse(self, name: str, sparse: str) -> None:
        self._call("enable_sparse", {"name": name, "sparse": sparse}, timeout=self.bulk_timeout_s)

    def set_sparse(self, name: str, points: Sequence[tuple[str, SparseVector]]) -> None:
        rows = [[pid, _sparse_out(sv)] for pid, sv in points]
        for start in range(0, len(rows), _BATCH):
            self._call(
                "set_sparse",
                {"name": name, "points": rows[start : start + _BATCH]},
                timeout=self.bulk_timeout_s,
            )

    def drop_collection(self, name: str) -> None:
        self._call("drop_collection", {"name": name}, timeout=self.bulk_timeout_s)

    def info(self, name: str) -> CollectionInfo | None:
        row = self._call("info", {"name": name})
        if row is None:
            return None
        sparse = row[4] if len(row) > 4 else None
        return CollectionInfo(name=row[0], dim=row[1], model=row[2], count=row[3], sparse=sparse)

    def upsert(self, name: str, points: Sequence[PointRecord]) -> None:
        chunk: list[list[Any]] = []
        sent = False
        for p in points:
            vec = None if p.vector is None else _vec_out(p.vector)
            chunk.append([p.id, vec, p.payload, _sparse_out(p.sparse)])
            if len(chunk) >= _BATCH:
                self._upsert_rows(name, chunk)
                chunk, sent = [], True
        if chunk or not sent:  # an empty upsert still says whether the collection exists
            self._upsert_rows(name, chunk)

    def _upsert_rows(self, name: str, rows: list[list[Any]]) -> None:
        try:
            self._call("upsert", {"name": name, "points": rows}, timeout=self.bulk_timeout_s)
        except _RequestTooLargeError:
            if len(rows) <= 1:
                raise
            half = len(rows) // 2  # big payloads: split until each frame fits
            self._upsert_rows(name, rows[:half])
            self._upsert_rows(name, rows[half:])

    def delete(
        self, name: str, *, ids: Sequence[str] | None = None, filter: Filter | None = None
    ) -> None:
        _check_filter(filter)
        self._call(
            "delete",
            {"name": name, "ids": None if ids is None else list(ids), "filter": filter},
            timeout=self.bulk_timeout_s,
        )

    def search(
        self,
        name: str,
        vector: Vector,
        *,
        limit: int = 3,
        filter: Filter | None = None,
        exact: bool = False,
        mode: str = "dense",
        fusion: str = "rrf",
        sparse: SparseVector | None = None,
        feedback: int = 0,
    ) -> list[Hit]:
        _check_filter(filter)
        args = {
            "name": name,
            "vector": _vec_out(vector),
            "limit": limit,
            "filter": filter,
            "exact": exact,
            "mode": mode,
            "fusion": fusion,
            "sparse": _sparse_out(sparse),
            "feedback": feedback,
        }
        return [_hit_in(r) for r in self._call("search", args)]

    def search_batch(
        self,
        vector: Vector,
        queries: Sequence[SearchQuery],
        sparse: SparseVector | None = None,
    ) -> list[list[Hit] | Exception]:
        """:func:`~context_core.knowledge.store.search_batch` in one round trip."""
        for q in queries:
            _check_filter(q.filter)
        args = {
            "vector": _vec_out(vector),
            "sparse": _sparse_out(sparse),
            "queries": [
                {
                    "name": q.name,
                    "limit": q.limit,
                    "filter": q.filter,
                    "exact": q.exact,
                    "mode": q.mode,
                    "fusion": q.fusion,
                    "feedback": q.feedback,
                }
                for q in queries
            ],
        }
        out: list[list[Hit] | Exception] = []
        for answer in self._call("search_batch", args):
            if "error" in answer:
                err = answer["error"]
                cls = _ERROR_TYPES.get(err.get("type", ""))
                out.append(
                    cls(err.get("message", ""))
                    if cls is not None
                    else BackendUnavailableError(
                        f"the Qdrant Edge server on {self.socket_path} failed on a search: "
                        f"{err.get('type')}: {err.get('message')}"
                    )
                )
            else:
                out.append([_hit_in(r) for r in answer["ok"]])
        return out

    def scroll(
        self,
        name: str,
        *,
        filter: Filter | None = None,
        with_vectors: bool = False,
        batch: int = 256,
    ) -> Iterator[PointRecord]:
        _check_filter(filter)
        # pages of at most _BATCH keep every answer far below the frame cap; the order of the
        # points does not depend on the page size
        page = max(1, min(int(batch), _BATCH))
        offset: str | None = None
        while True:
            args = {
                "name": name,
                "filter": filter,
                "with_vectors": with_vectors,
                "batch": page,
                "offset": offset,
            }
            got = self._call("scroll", args)
            for row in got["points"]:
                yield _point_in(row)
            offset = got["next"]
            if offset is None:
                return

    def retrieve(
        self, name: str, ids: Sequence[str], *, with_vectors: bool = False
    ) -> list[PointRecord]:
        wanted = list(ids)
        out: list[PointRecord] = []
        for start in range(0, max(len(wanted), 1), _BATCH):
            args = {
                "name": name,
                "ids": wanted[start : start + _BATCH],
                "with_vectors": with_vectors,
            }
            out.extend(_point_in(row) for row in self._call("retrieve", args))
        return out

    def count(self, name: str, *, filter: Filter | None = None) -> int:
        _check_filter(filter)
        return int(self._call("count", {"name": name, "filter": filter}))

    def optimize(self, name: str) -> IndexStatus:
        row = self._call("optimize", {"name": name}, timeout=self.bulk_timeout_s)
        return IndexStatus(points=row[0], indexed_vectors=row[1], segments=row[2])

    def index_status(self, name: str) -> IndexStatus:
        row = self._call("index_status", {"name": name})
        return IndexStatus(points=row[0], indexed_vectors=row[1], segments=row[2])

    def flush(self) -> None:
        self._call("flush", {}, timeout=self.bulk_timeout_s)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            on_loop, self._loop_idle = self._loop_idle, []
        for conn in idle:
            conn.close()
        for lconn in on_loop:  # from the loop's thread (or after the loop stopped)
            with contextlib.suppress(Exception):
                lconn.close()

    def __enter__(self) -> RemoteEdgeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_filter(filt: Filter | None) -> None:
    # a mapping is validated by the server (same order of checks as EdgeStore); anything else
    # could not travel faithfully, so it fails here with parse_filter's own message
    if filt and not isinstance(filt, Mapping):
        parse_filter(filt)


# --- subprocess helpers -------------------------------------------------------------------


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


# --- command line -------------------------------------------------------------------------


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
    parser.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.root is None or args.socket is None or args.search_threads is None:
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
    if args.socket is None:
        parser.error("--socket is required (or set CTX_EDGE_SOCKET)")
    if args.search_threads < 0:
        parser.error("--search-threads must be >= 0")

    stop = threading.Event()

    def _on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    server = EdgeServer(args.root, args.socket, search_threads=args.search_threads or None)
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


if __name__ == "__main__":  # pragma: no cover - exercised through start_edge_server
    sys.exit(main())
