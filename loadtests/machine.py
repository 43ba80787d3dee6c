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
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["reference_ms"]


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
