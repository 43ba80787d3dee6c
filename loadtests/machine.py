"""How fast this machine runs Python at the moment: the CPU time of a fixed workload.

On a shared machine the same campaign can hold its target one hour and miss it the next:
on the evening of 2026-12-02 the bare-ASGI floor of ``benchmarks/service_capacity.py`` read
0.098 CPU-ms per request at 17:07 and 0.150 at 18:41 on the same code, and the short_sessions
campaign at 1,000 req/s delivered 0.99 of its target in the first spell and 0.72-0.79 in the
second. A verdict is about the service *on the machine as it was*; this figure, taken right
before and right after the load and written into the report, lets a reader put two runs side
by side (a run whose reference took 1.5x longer ran on a machine 1.5x slower) instead of
taking a slow spell for a regression or a fast one for a fix.

The workload is plain interpreter work of the kind a request is made of (dicts, strings, a
loop, small integers), timed with :func:`time.process_time` (this process's CPU only, so a
busy neighbour shows through what it does to this process's speed: shared caches, the host's
scheduling, not through waiting), best of several rounds.

:func:`reference_io_ms` is its kernel-side twin: round trips of a small message over a local
socket pair, the system calls a request is also made of (the client's read and the reply's
write, Valkey's pipe). Machines differ there independently of the interpreter: on two
machines of this workplace the interpreter reference read about the same (20-22 against 23
CPU-ms) while the service's CPU per request differed by 30 %.
"""

from __future__ import annotations

import socket
import time
from typing import Any

__all__ = ["reference_io_ms", "reference_ms"]


def _workload(n: int) -> int:
    acc = 0
    for i in range(n):
        d: dict[str, Any] = {"id": i, "name": f"item-{i}", "tags": [i % 7, i % 11]}
        s = "|".join((d["name"], str(d["id"]), str(d["tags"][0])))
        acc += len(s) + d["tags"][1] * (i & 3)
    return acc


def reference_ms(rounds: int = 5, n: int = 60_000) -> float:
    """The best of ``rounds`` CPU times of the fixed workload, in milliseconds (88-135 here on
    2026-12-02; lower is faster). Only comparable between runs of the same ``n``."""
    if rounds < 1 or n < 1:
        raise ValueError(f"reference_ms: rounds and n must be positive, got {rounds}, {n}")
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        _workload(n)
        best = min(best, time.process_time() - t0)
    return best * 1000.0


#: Largest message of :func:`reference_io_ms`: well under Linux's smallest default socket buffer.
MAX_IO_SIZE = 65_536


def _round_trips(n: int, size: int) -> int:
    """``n`` send/receive round trips of ``size`` bytes over a Unix socket pair, echoed by
    the same thread (no scheduler hand-off: system calls only). Returns the bytes moved.
    ``size`` must fit the socket's buffer (the one thread writes all before it reads), hence
    :data:`MAX_IO_SIZE`."""
    a, b = socket.socketpair()
    msg = b"x" * size
    moved = 0
    try:
        for _ in range(n):
            a.sendall(msg)
            got = 0
            while got < size:
                got += len(b.recv(size - got))
            b.sendall(msg[:got])
            back = 0
            while back < size:
                back += len(a.recv(size - back))
            moved += got + back
    finally:
        a.close()
        b.close()
    return moved


def reference_io_ms(rounds: int = 5, n: int = 20_000, size: int = 1_024) -> float:
    """The best of ``rounds`` CPU times (user + system) of ``n`` local round trips of ``size``
    bytes (four system calls each), in milliseconds; lower is faster. Only comparable between
    runs of the same ``n`` and ``size``."""
    if rounds < 1 or n < 1 or not 1 <= size <= MAX_IO_SIZE:
        raise ValueError(
            f"reference_io_ms: rounds and n must be positive and size within 1..{MAX_IO_SIZE}, "
            f"got {rounds}, {n}, {size}"
        )
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        _round_trips(n, size)
        best = min(best, time.process_time() - t0)
    return best * 1000.0
