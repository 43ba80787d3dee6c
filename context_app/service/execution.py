"""Where an endpoint runs: on the event loop, its Redis round trips awaited, or on a thread.

The endpoints are plain synchronous functions over synchronous parts (the router, the
lifecycle, the stores). FastAPI would run each on a worker thread; on this service that is
what a request mostly paid for: a thread hop and, under load, a GIL handover at every round
trip (measured in ``benchmarks/service_capacity.py`` and the README's capacity section).
:func:`endpoint` runs the function on the event loop instead (``CTX_SERVICE_EXECUTION=loop``,
the default): in a greenlet (:func:`context_core.concurrency.on_loop`), with every round trip
it makes through :mod:`context_core.redis.ops` *awaited* on an asynchronous twin of the
service's Redis client, so the loop serves other requests, ``/healthz`` included, while one
waits on Redis or on the L3 search (in a greenlet of its own with the edge server's client,
else on a thread of the router's pool).

What stays true either way: a request in flight counts for the degradation and shedding
thresholds (they are counted around the endpoint); a hung Redis gives a 503 after the
service's Redis timeout; ``/healthz`` and ``/readyz`` never queue behind stuck requests.
``CTX_SERVICE_EXECUTION=threads`` (and any Redis Cluster, which has no twin here) runs each
request on a worker thread as before.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from starlette.concurrency import run_in_threadpool

from context_core.concurrency import on_loop

__all__ = ["endpoint"]

P = ParamSpec("P")
R = TypeVar("R")


def endpoint(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """Wrap a synchronous endpoint taking ``svc`` (the :class:`~.deps.Services`): on the loop
    when ``svc.on_loop``, else on a worker thread. FastAPI reads the wrapped signature."""

    @functools.wraps(fn)
    async def run(*args: P.args, **kwargs: P.kwargs) -> R:
        svc: Any = kwargs.get("svc")
        if svc is not None and svc.on_loop:
            return await on_loop(fn, *args, **kwargs)
        return await run_in_threadpool(fn, *args, **kwargs)

    return run
