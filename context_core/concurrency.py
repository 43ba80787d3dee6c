"""Synchronous code on the event loop, its waits awaited.

The HTTP service runs its endpoints (plain synchronous code: the router, the lifecycle, the
stores) on the event loop instead of a worker thread each: :func:`on_loop` runs the function
in a greenlet, and whatever that code waits for through the helpers here is *awaited* on the
loop meanwhile (the greenlet switches back to the coroutine driving it, which awaits and
switches in again with the result): a Redis round trip (:func:`context_core.redis.ops.execute`
with a client that has an asynchronous twin), an L3 search running on a thread
(:func:`wait_future`), a blocking call such as a PostgreSQL query (:func:`blocking`, run on
a worker thread). So a request waiting costs no thread and no GIL handover, and the loop
keeps serving other requests (and ``/healthz``) while it waits. Outside :func:`on_loop` (the
library, the CLI, the tests, worker threads) the same helpers simply block, so nothing
changes there. Anything else a function run on the loop waits for blocks the loop
(tests/test_service_execution.py checks the hot endpoints send no blocking Redis command).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

import greenlet

__all__ = ["OneExchange", "await_", "blocking", "on_loop", "on_loop_now", "spawn", "wait_future"]

T = TypeVar("T")


class _LoopGreenlet(greenlet.greenlet):  # type: ignore[misc]
    """The greenlet of one :func:`on_loop` call: its code may :func:`await_`."""


def on_loop_now() -> bool:
    """True in code that :func:`on_loop` runs (it may :func:`await_`)."""
    return isinstance(greenlet.getcurrent(), _LoopGreenlet)


def await_(awaitable: Awaitable[T]) -> T:
    """Wait for ``awaitable`` from synchronous code run by :func:`on_loop` (the loop goes on
    meanwhile). Anywhere else it is an error: there is no loop to wait on."""
    current = greenlet.getcurrent()
    if not isinstance(current, _LoopGreenlet):
        if inspect.iscoroutine(awaitable):
            awaitable.close()
        raise RuntimeError("await_ outside on_loop: nothing drives an event loop here")
    return current.parent.switch(awaitable)  # type: ignore[no-any-return]


def wait_future(future: Future[T] | asyncio.Future[T], timeout_s: float) -> T:
    """``future.result(timeout_s)`` for a thread's future or a :func:`spawn` task; on the
    loop (:func:`on_loop`) awaited instead of blocking. A timeout raises
    :class:`TimeoutError` either way (the future is left to finish; cancel it if it must
    not)."""
    if isinstance(future, Future) and not on_loop_now():
        return future.result(timeout=timeout_s)
    return await_(_wait_wrapped(future, timeout_s))


def spawn(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> asyncio.Task[T]:
    """Start ``fn(*args, **kwargs)`` in a greenlet of its own on the loop (from code that
    :func:`on_loop` runs), like submitting it to a thread pool: it runs while the caller
    next waits, its own waits awaited; :func:`wait_future` collects the result. Only for
    code that waits through the helpers here (anything else would block the loop)."""
    if not on_loop_now():
        raise RuntimeError("spawn outside on_loop: nothing drives an event loop here")
    return asyncio.get_running_loop().create_task(on_loop(fn, *args, **kwargs))


async def _wait_wrapped(future: Future[T] | asyncio.Future[T], timeout_s: float) -> T:
    wrapped = asyncio.wrap_future(future) if isinstance(future, Future) else future
    done, _ = await asyncio.wait({wrapped}, timeout=max(0.0, timeout_s))
    if not done:
        raise TimeoutError(f"no result within {timeout_s:.3f} s")
    return wrapped.result()


class _Done:
    """What a pooled greenlet hands back when its call has finished (anything else it hands
    back is an awaitable its code waits for)."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any, error: BaseException | None) -> None:
        self.value = value
        self.error = error


#: Idle :func:`on_loop` greenlets kept per thread for the next calls (a greenlet's start is
#: a good part of what running one call costs); more finish their loop and go.
POOL_MAX = 64
_idle = threading.local()


def _serve(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A pooled greenlet's life: run one call, hand back its :class:`_Done`, get the next."""
    while True:
        try:
            done = _Done(fn(*args, **kwargs), None)
        except greenlet.GreenletExit:
            raise  # the greenlet is being discarded: let it die
        except BaseException as e:  # handed to the caller, as if raised there
            done = _Done(None, e)
        del fn, args, kwargs  # nothing of the call outlives it while idle
        fn, args, kwargs = greenlet.getcurrent().parent.switch(done)


async def on_loop(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run the synchronous ``fn(*args, **kwargs)`` on the current event loop, awaiting the
    round trips it makes (see above); returns its result or raises its exception. The
    greenlet it runs in comes from a per-thread pool and goes back to it when the call has
    finished (one abandoned half-way, e.g. by a cancelled task, is not reused)."""
    pool: list[_LoopGreenlet] | None = getattr(_idle, "pool", None)
    if pool is None:
        pool = _idle.pool = []
    if pool:
        g = pool.pop()
        g.parent = greenlet.getcurrent()
    else:
        g = _LoopGreenlet(_serve)
    g.gr_context = contextvars.copy_context()  # the request's context vars, as a thread gets
    wanted = g.switch(fn, args, kwargs)
    while type(wanted) is not _Done:
        try:
            value = await wanted
        except BaseException as e:  # into the code that waited, as if raised there
            wanted = g.throw(e)
        else:
            wanted = g.switch(value)
    if len(pool) < POOL_MAX:
        g.gr_context = None  # the request's context vars go with the request
        pool.append(g)
    # emptied: the idle greenlet's frame still holds this _Done until its next call
    value, error = wanted.value, wanted.error
    wanted.value = wanted.error = None
    if error is not None:
        raise error
    return value  # type: ignore[no-any-return]


def blocking(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, a call that blocks (a database query, a model): on the loop
    (:func:`on_loop`) it runs on a worker thread and is awaited; elsewhere it just runs."""
    if not on_loop_now():
        return fn(*args, **kwargs)
    return await_(asyncio.to_thread(fn, *args, **kwargs))


R = TypeVar("R")


class OneExchange(asyncio.Protocol, Generic[R]):
    """A loop-side connection with at most one exchange in flight: :meth:`exchange` writes
    the request and awaits the answer that the subclass's ``data_received`` hands to
    :meth:`answer`. A timeout or a lost connection breaks it for good (a late answer would
    be taken for the next request's): the waiter gets the error, the transport is aborted.
    Subclasses name their errors (:meth:`lost_error`, :meth:`timeout_error`)."""

    def __init__(self) -> None:
        self.transport: Any = None  # asyncio's or uvloop's (not an asyncio.Transport)
        self.waiter: asyncio.Future[R] | None = None
        self.broken: BaseException | None = None

    def lost_error(self, exc: Exception | None) -> BaseException:
        return ConnectionError(f"connection closed ({exc or 'EOF'})")

    def timeout_error(self) -> BaseException:
        return TimeoutError("timed out")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(self.lost_error(exc))

    def eof_received(self) -> bool | None:
        self.fail(self.lost_error(None))
        return None

    def answer(self, value: R) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(value)

    def fail(self, error: BaseException) -> None:
        if self.broken is None:
            self.broken = error
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.broken)
        self.close()

    async def exchange(self, payload: bytes, timeout_s: float | None) -> R:
        if self.broken is not None:
            raise self.broken
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[R] = loop.create_future()
        self.waiter = waiter
        self.transport.write(payload)
        timer = (
            loop.call_later(timeout_s, self._timed_out, waiter) if timeout_s is not None else None
        )
        try:
            return await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self.waiter = None

    def _timed_out(self, waiter: asyncio.Future[R]) -> None:
        if not waiter.done():
            self.fail(self.timeout_error())

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()
