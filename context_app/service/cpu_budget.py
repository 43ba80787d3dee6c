"""CPU-heavy request work off the event loop, with a per-request budget.

The hot endpoints run on the event loop (:mod:`.execution`): anything they compute for long
stalls every request on that worker, ``/healthz`` included. Cleaning an agent's output
(:func:`context_core.gateway.output.sanitize_output`: Markdown parsing, HTML cleaning, DLP)
is such work: linear, but a 256 KB reply can still take tens of milliseconds of pure Python.
:func:`run_sanitizer` runs it on a small pool of its own (so hostile outputs cannot take the
threads the rest of the service waits on) and awaits it from the request's greenlet; the loop
serves other requests meanwhile. A short output (at most :data:`ON_LOOP_MAX_CHARS`) is cleaned
on the loop itself: it takes tens of microseconds, less than the hop to a thread and back
(which also wakes the loop once more). With ``CTX_SERVICE_EXECUTION=threads`` the request already
runs on a worker thread, and the sanitizer runs there.

The budget is the sanitizer's own: it counts the CPU time of the thread doing the work
(``CTX_OUTPUT_SANITIZE_BUDGET_MS``) and stops with
:class:`~context_core.errors.SanitizeBudgetExceededError` (413, naming the limit and the
setting) when it is over. A wall-clock guard (ten times the budget, at least 5 s, for a
thread starved of the GIL) answers the same error; the work it abandons stops at its own
budget, shortly after.
"""

from __future__ import annotations

import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from context_core.concurrency import on_loop_now, wait_future
from context_core.errors import SanitizeBudgetExceededError
from context_core.gateway.output import OutputFormat, SanitizedOutput, sanitize_output
from context_core.gateway.sanitize import Gateway

__all__ = ["ON_LOOP_MAX_CHARS", "POOL_THREADS", "run_sanitizer"]

#: Threads that clean outputs for the endpoints on the loop (per service process).
POOL_THREADS = 4

#: Outputs up to this many characters are cleaned on the event loop (within the same CPU
#: budget): the sanitizer is linear, so this bounds the stall to well under a millisecond;
#: anything longer goes to the pool.
ON_LOOP_MAX_CHARS = 1024

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="ctx-sanitize")
        return _pool


def _wall_guard_s(budget_ms: float) -> float:
    return max(5.0, budget_ms * 10 / 1000.0)


def run_sanitizer(
    text: str, *, gateway: Gateway, fmt: OutputFormat, where: str, budget_ms: float
) -> SanitizedOutput:
    """:func:`sanitize_output` within ``budget_ms`` of CPU time, off the event loop when
    called from it."""
    kwargs: dict[str, Any] = {"gateway": gateway, "fmt": fmt, "where": where}
    if len(text) <= ON_LOOP_MAX_CHARS or not on_loop_now():
        return sanitize_output(text, budget_ms=budget_ms, **kwargs)
    ctx = contextvars.copy_context()  # the request's context vars (logging, tracing)

    def job() -> SanitizedOutput:
        return sanitize_output(text, budget_ms=budget_ms, **kwargs)

    future = _executor().submit(ctx.run, job)
    try:
        return wait_future(future, _wall_guard_s(budget_ms))
    except TimeoutError:
        raise SanitizeBudgetExceededError(budget_ms) from None
