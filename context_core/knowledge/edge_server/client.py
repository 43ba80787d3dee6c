"""The edge server's client: the :class:`~context_core.knowledge.store.VectorStore` a worker
uses when ``CTX_EDGE_SOCKET`` is set (:func:`~context_core.knowledge.open.open_store`).

The same protocol, the same answers and the same error classes as the
:class:`~context_core.knowledge.edge.EdgeStore` the server holds (the contract suite runs
unchanged against it). Every operation is idempotent (upserts by id, deletes, creates and
drops are), so a client that finds its connection dead reconnects once and re-sends; ``scroll``
pages by offset, so a restarted server loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from context_core.concurrency import await_, on_loop_now
from context_core.errors import BackendUnavailableError, InvalidStoreRequestError
from context_core.knowledge.edge_server import protocol
from context_core.knowledge.store import (
    CollectionInfo,
    Filter,
    Hit,
    IndexStatus,
    PointRecord,
    SearchQuery,
    SparseVector,
    Vector,
)

__all__ = ["RemoteEdgeStore"]


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
        self._idle: list[protocol.Conn] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
        # connections of code on the event loop (one loop: the service's); see _exchange_async
        self._loop_idle: list[protocol.LoopConn] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    #: a call made on the event loop (context_core.concurrency) awaits its exchange instead of
    #: blocking: the router runs an L3 search on the loop, not on a worker thread
    awaits_on_loop = True

    @property
    def where(self) -> str:
        return f"unix:{self.socket_path}"

    # --- connections ---------------------------------------------------------------------
    def _checkout(self, *, fresh: bool = False) -> protocol.Conn:
        if self._pid != os.getpid():  # forked: the parent's sockets are not ours to use
            self._checkout_reset()
        stale: list[protocol.Conn] = []
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
        return protocol.Conn(sock)

    def _checkin(self, conn: protocol.Conn) -> None:
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
            f"to {op}, over the {protocol.MAX_FRAME_BYTES}-byte cap (protocol error)"
        )

    def _call(self, op: str, args: dict[str, Any], *, timeout: float | None = None) -> Any:
        try:
            body = protocol.encode({"op": op, "args": args})
        except (TypeError, OverflowError, NotImplementedError) as e:
            raise InvalidStoreRequestError(f"{op}: cannot encode the request: {e}") from e
        if len(body) > protocol.MAX_FRAME_BYTES:
            raise protocol.RequestTooLargeError(
                protocol.too_large_message(f"the {op} request", len(body))
            )
        timeout = self.timeout_s if timeout is None else timeout
        raw: bytes | bytearray
        if on_loop_now():
            raw = await_(self._exchange_async(op, body, timeout))
        else:
            raw = self._exchange(op, body, timeout)
        try:
            reply = protocol.decode(raw)
        except protocol.DecodeError as e:
            raise BackendUnavailableError(
                f"the Qdrant Edge server on {self.socket_path} sent a malformed answer to {op}: {e}"
            ) from e
        if "error" in reply:
            raise protocol.error_from(reply["error"], where=str(self.socket_path), op=op)
        return reply["ok"]

    def _verdict(
        self, op: str, timeout: float | None, e: BaseException, *, connecting: bool
    ) -> BackendUnavailableError | None:
        """What a failed connect or exchange means: None to retry once on a new connection
        (a dead pooled connection, a restarted server), else the error to raise."""
        if isinstance(e, TimeoutError):
            return self._no_accept(op) if connecting else self._no_answer(op, timeout)
        if isinstance(e, protocol.FrameTooLargeError):
            return self._too_big(op, e.size)
        return None

    def _exchange(self, op: str, body: bytes, timeout: float | None) -> bytes | bytearray:
        last: BaseException | None = None
        for attempt in range(2):  # a dead pooled connection or server restart: reconnect once
            conn: protocol.Conn | None = None
            try:
                conn = self._checkout(fresh=attempt > 0)
                conn.set_timeout(timeout)
                conn.send(body)
                raw = conn.recv(protocol.MAX_FRAME_BYTES)
            except (OSError, protocol.ConnectionLostError, protocol.FrameTooLargeError) as e:
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
            conn: protocol.LoopConn | None = None
            try:
                conn = await self._acheckout(fresh=attempt > 0)
                raw = await conn.exchange(frame, timeout)
            except (OSError, protocol.ConnectionLostError, protocol.FrameTooLargeError) as e:
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

    async def _acheckout(self, *, fresh: bool) -> protocol.LoopConn:
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
            loop.create_unix_connection(protocol.LoopConn, str(self.socket_path)), self.timeout_s
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
        rows = [[pid, protocol.sparse_out(sv)] for pid, sv in points]
        for start in range(0, len(rows), protocol.BATCH):
            self._call(
                "set_sparse",
                {"name": name, "points": rows[start : start + protocol.BATCH]},
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
            vec = None if p.vector is None else protocol.vec_out(p.vector)
            chunk.append([p.id, vec, p.payload, protocol.sparse_out(p.sparse)])
            if len(chunk) >= protocol.BATCH:
                self._upsert_rows(name, chunk)
                chunk, sent = [], True
        if chunk or not sent:  # an empty upsert still says whether the collection exists
            self._upsert_rows(name, chunk)

    def _upsert_rows(self, name: str, rows: list[list[Any]]) -> None:
        try:
            self._call("upsert", {"name": name, "points": rows}, timeout=self.bulk_timeout_s)
        except protocol.RequestTooLargeError:
            if len(rows) <= 1:
                raise
            half = len(rows) // 2  # big payloads: split until each frame fits
            self._upsert_rows(name, rows[:half])
            self._upsert_rows(name, rows[half:])

    def delete(
        self, name: str, *, ids: Sequence[str] | None = None, filter: Filter | None = None
    ) -> None:
        protocol.check_filter(filter)
        self._call(
            "delete",
            {"name": name, "ids": None if ids is None else list(ids), "filter": filter},
            timeout=self.bulk_timeout_s,
        )

    def search(
        self, vector: Vector, query: SearchQuery, sparse: SparseVector | None = None
    ) -> list[Hit]:
        protocol.check_filter(query.filter)
        args = {
            "vector": protocol.vec_out(vector),
            "sparse": protocol.sparse_out(sparse),
            **protocol.query_out(query),
        }
        return [protocol.hit_in(r) for r in self._call("search", args)]

    def search_batch(
        self,
        vector: Vector,
        queries: Sequence[SearchQuery],
        sparse: SparseVector | None = None,
    ) -> list[list[Hit] | Exception]:
        """:func:`~context_core.knowledge.store.search_batch` in one round trip."""
        for q in queries:
            protocol.check_filter(q.filter)
        args = {
            "vector": protocol.vec_out(vector),
            "sparse": protocol.sparse_out(sparse),
            "queries": [protocol.query_out(q) for q in queries],
        }
        out: list[list[Hit] | Exception] = []
        for answer in self._call("search_batch", args):
            if "error" in answer:
                where = str(self.socket_path)
                out.append(protocol.error_from(answer["error"], where=where, op="a search"))
            else:
                out.append([protocol.hit_in(r) for r in answer["ok"]])
        return out

    def scroll(
        self,
        name: str,
        *,
        filter: Filter | None = None,
        with_vectors: bool = False,
        batch: int = 256,
    ) -> Iterator[PointRecord]:
        protocol.check_filter(filter)
        # pages of at most protocol.BATCH keep every answer far below the frame cap; the order
        # of the points does not depend on the page size
        page = max(1, min(int(batch), protocol.BATCH))
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
                yield protocol.point_in(row)
            offset = got["next"]
            if offset is None:
                return

    def retrieve(
        self, name: str, ids: Sequence[str], *, with_vectors: bool = False
    ) -> list[PointRecord]:
        wanted = list(ids)
        out: list[PointRecord] = []
        for start in range(0, max(len(wanted), 1), protocol.BATCH):
            args = {
                "name": name,
                "ids": wanted[start : start + protocol.BATCH],
                "with_vectors": with_vectors,
            }
            out.extend(protocol.point_in(row) for row in self._call("retrieve", args))
        return out

    def count(self, name: str, *, filter: Filter | None = None) -> int:
        protocol.check_filter(filter)
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
