"""The edge server's wire protocol: framing, the msgpack codec, and values on the wire.

Wire format (one request, then its answer, on a persistent connection; never pickle)::

    frame    = 4-byte big-endian body length + body (msgpack, at most MAX_FRAME_BYTES)
    request  = {"op": "search", "args": {"name": ..., "vector": <bin>, "limit": 3, ...}}
    answer   = {"ok": value} | {"error": {"type": "CollectionNotFoundError", "message": ...}}

Vectors travel as msgpack ``bin``: the raw little-endian float32 bytes (``numpy.tobytes``),
1.5 KiB for a 384-d query. That is what the shards store anyway (float32), so nothing is
lost, and it is much cheaper than a msgpack array of 384 doubles on both sides (one memcpy
instead of 384 typed floats to encode and decode). A sparse vector travels the same way as
``[indices-bin (uint32), values-bin (float32)]`` or nil. A search travels as the fields of its
:class:`~context_core.knowledge.store.SearchQuery` (``{"name", "limit", "filter", "exact",
"mode", "fusion", "feedback"}``) next to ``"vector"`` and ``"sparse"``. Hits go back as ``[id,
score, payload, sparse_score, rank]`` rows, points as ``[id, vector-bin-or-nil, payload,
sparse]``.

The server and the client read :data:`MAX_FRAME_BYTES` and :data:`BATCH` from this module at
call time (``protocol.MAX_FRAME_BYTES``), so one setting holds for both sides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import numpy as np

from context_core.concurrency import OneExchange
from context_core.errors import (
    BackendUnavailableError,
    CollectionNotFoundError,
    ConfigError,
    ContextError,
    InvalidStoreRequestError,
    ModelMismatchError,
)
from context_core.knowledge.store import (
    Filter,
    Hit,
    PointRecord,
    SearchQuery,
    SparseVector,
    Vector,
    parse_filter,
)

__all__ = [
    "BATCH",
    "ERROR_TYPES",
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "Conn",
    "ConnectionLostError",
    "DecodeError",
    "FrameTooLargeError",
    "LoopConn",
    "RequestTooLargeError",
    "check_filter",
    "decode",
    "encode",
    "error_body",
    "error_from",
    "hit_in",
    "hit_out",
    "point_in",
    "point_out",
    "query_in",
    "query_out",
    "sparse_in",
    "sparse_out",
    "too_large_message",
    "vec_in",
    "vec_out",
]

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 64 * 1024 * 1024  # one request or answer; clients split bigger batches
BATCH = 1024  # points per upsert/retrieve frame and per scroll page (EdgeStore batches 1024)
_VEC = np.dtype("<f4")
_IDX = np.dtype("<u4")
_READ_CHUNK = 64 * 1024

# Classes re-raised client-side under their own name; anything else -> BackendUnavailableError.
ERROR_TYPES: dict[str, type[ContextError]] = {
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
encode = _ENCODER.encode
decode = _DECODER.decode
DecodeError = msgspec.DecodeError


class ConnectionLostError(Exception):
    """The peer closed the connection (EOF)."""


class FrameTooLargeError(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class RequestTooLargeError(InvalidStoreRequestError):
    """A request over MAX_FRAME_BYTES; raised before anything is sent."""


def too_large_message(what: str, size: int) -> str:
    return (
        f"{what} of {size} bytes is over the edge server's frame cap of {MAX_FRAME_BYTES} "
        "bytes (MAX_FRAME_BYTES); send fewer or smaller points per call"
    )


def error_body(exc: BaseException) -> bytes:
    return encode({"error": {"type": type(exc).__name__, "message": str(exc)}})


def error_from(err: Mapping[str, Any], *, where: str, op: str) -> ContextError:
    """The exception an ``{"error": ...}`` answer stands for: a known class under its own
    name, anything else as BackendUnavailableError naming the server (``where``) and ``op``."""
    cls = ERROR_TYPES.get(err.get("type", ""))
    if cls is not None:
        return cls(err.get("message", ""))
    return BackendUnavailableError(
        f"the Qdrant Edge server on {where} failed on {op}: {err.get('type')}: {err.get('message')}"
    )


# --- framing ------------------------------------------------------------------------------


class Conn:
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
            raise FrameTooLargeError(size)
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
                raise ConnectionLostError("connection closed in the middle of a frame")
            have += got
        return out

    def _fill(self) -> None:
        chunk = self.sock.recv(_READ_CHUNK)
        if not chunk:
            raise ConnectionLostError("connection closed")
        self.buf += chunk

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class LoopConn(OneExchange[bytes]):
    """:class:`Conn` for code on the event loop (:mod:`context_core.concurrency`): the same
    framing, its one exchange awaited (no worker thread, no blocking socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.buf = bytearray()

    def lost_error(self, exc: Exception | None) -> BaseException:
        return ConnectionLostError(f"connection closed ({exc or 'EOF'})")

    def data_received(self, data: bytes) -> None:
        self.buf += data
        buf = self.buf
        if self.waiter is None or len(buf) < 4:
            return
        size = int.from_bytes(buf[:4], "big")
        if size > MAX_FRAME_BYTES:
            self.fail(FrameTooLargeError(size))
            return
        end = 4 + size
        if len(buf) >= end:
            body = bytes(buf[4:end])
            del buf[:end]
            self.answer(body)


# --- values on the wire ---------------------------------------------------------------------


def vec_out(vector: Vector) -> bytes:
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


def vec_in(raw: Any) -> np.ndarray:
    if not isinstance(raw, bytes | bytearray | memoryview) or len(raw) % _VEC.itemsize:
        raise InvalidStoreRequestError("a vector must arrive as float32 bytes")
    return np.frombuffer(raw, dtype=_VEC)


def _vec_list(raw: bytes | None) -> list[float] | None:
    # EdgeStore hands back plain lists of floats; so does the remote store
    return None if raw is None else np.frombuffer(raw, dtype=_VEC).tolist()


def sparse_out(sv: SparseVector | None) -> list[bytes] | None:
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


def sparse_in(raw: Any) -> SparseVector | None:
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


def point_out(p: PointRecord) -> list[Any]:
    vec = None if p.vector is None else np.asarray(p.vector, dtype=_VEC).tobytes()
    return [p.id, vec, p.payload, sparse_out(p.sparse)]


def point_in(row: Sequence[Any]) -> PointRecord:
    sparse = sparse_in(row[3]) if len(row) > 3 else None
    return PointRecord(id=row[0], vector=_vec_list(row[1]), payload=row[2], sparse=sparse)


def hit_out(h: Hit) -> list[Any]:
    return [h.id, h.score, h.payload, h.sparse_score, h.rank]


def hit_in(r: Sequence[Any]) -> Hit:
    if len(r) > 3:
        return Hit(id=r[0], score=r[1], payload=r[2], sparse_score=r[3], rank=r[4])
    return Hit(id=r[0], score=r[1], payload=r[2])


# A SearchQuery travels as its fields, under their own names; a field a client leaves out
# takes its default (an older client sends no mode, fusion or feedback: a dense search).
_QUERY_FIELDS = tuple(f.name for f in dataclasses.fields(SearchQuery))


def query_out(q: SearchQuery) -> dict[str, Any]:
    return {name: getattr(q, name) for name in _QUERY_FIELDS}


def query_in(raw: Any) -> SearchQuery:
    if not isinstance(raw, Mapping):
        raise InvalidStoreRequestError("a search must arrive as a mapping of its fields")
    return SearchQuery(**{name: raw[name] for name in _QUERY_FIELDS if name in raw})


def check_filter(filt: Filter | None) -> None:
    # a mapping is validated by the server (same order of checks as EdgeStore); anything else
    # could not travel faithfully, so it fails here with parse_filter's own message
    if filt and not isinstance(filt, Mapping):
        parse_filter(filt)
