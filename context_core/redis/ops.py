"""Several Redis operations in one round trip.

On a loaded service every round trip to Redis costs far more than the command: a blocking
socket read, a thread wake-up and a handover of the GIL. Measured in the service's own shape
(a sync FastAPI endpoint under 8 concurrent clients, ``benchmarks/service_capacity.py``
section ``service``), six sequential GETs cost about 0.8 CPU-ms per request and the same six
in one pipeline about 0.3. So a route should send what it needs together, not one command
after another.

An **operation** is a generator that yields the commands it needs next (a list of
:class:`Cmd`) and receives their replies (a list, in the same order; a reply that is a
Redis error comes as the exception object, see :func:`ok`); it ``return``\\ s its result.
Operations compose with ``yield from``, so a read with a follow-up (a miss, then "was it
ever written?") stays written in order::

    def load(key):
        raw, pttl = ok((yield [cmd("GET", key), cmd("PTTL", key)]))
        return raw, pttl

:func:`run_all` advances every operation in lock step: each *round* sends the commands all
the live operations yielded as one pipeline, in operation order, and hands each its
replies. An operation with a follow-up joins the next round. So N independent reads cost one
round trip, and reads with follow-ups cost two.

Semantics callers can rely on:

* **Order.** Within a round, commands run in operation order, each operation's own in the
  order it gave them. Operations must not depend on each other's effects beyond that (the
  router's touch before its reads, say).
* **Cluster.** A :class:`redis.cluster.RedisCluster` client runs each command on its own
  (the cluster client routes it by key; its pipeline refuses ``EVALSHA``), so nothing here
  changes which slot a script touches: every script still declares keys of one slot.
* **Scripts** go as ``EVALSHA``. After a server restart or ``SCRIPT FLUSH`` the replies are
  ``NOSCRIPT`` (the script did not run); those scripts are loaded and sent again, each with
  the plain commands that followed it in the round (so a read still sees the writes queued
  before it), before the operations see any reply. Plain commands in a round must therefore
  be idempotent (reads, ``ZADD``, ``ZREM``, ``DEL``: what the library sends).
* **Durable writes** (``min_replicas > 0``, ``CTX_REDIS_MIN_REPLICAS``): a round holding a
  command marked ``durable`` ends with ``WAIT min_replicas wait_ms`` on the same connection
  and raises :class:`~context_core.redis.connection.ReplicaAckError` when fewer replicas
  acknowledged (on a cluster each durable script is followed by its own ``WAIT``, through
  :func:`~context_core.redis.connection.call_script`).
* **Errors.** A connection or timeout error fails the whole round (it propagates as the
  :class:`redis.RedisError` it is; callers map it as they map any Redis outage). An
  exception raised by an operation ends that operation only; the others finish, then the
  first such exception is raised (results of the others are lost with it).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
from redis.commands.core import Script

from context_core.concurrency import await_, on_loop_now
from context_core.errors import ReplicaAckError
from context_core.redis.connection import RedisClient, call_script, is_cluster_client
from context_core.redis.loop_client import Command, LoopRedis

__all__ = [
    "Cmd",
    "Op",
    "attach_async",
    "call",
    "cmd",
    "detach_async",
    "execute",
    "execute_async",
    "ok",
    "run",
    "run_all",
    "script",
]

T = TypeVar("T")

#: An operation: yields the commands it needs next, receives their replies, returns a value.
Op = Generator[list["Cmd"], list[Any], T]


@dataclass(frozen=True, slots=True)
class Cmd:
    """One command of a round: a plain command (``name`` and ``args``) or a registered
    ``script`` run with ``keys`` and ``args``. ``durable``: a write that waits for replicas
    when the runner has ``min_replicas`` (see the module doc)."""

    name: str
    args: tuple[Any, ...] = ()
    script: Script | None = None
    keys: tuple[str, ...] = ()
    durable: bool = False
    options: tuple[tuple[str, Any], ...] = ()


def cmd(name: str, *args: Any, **options: Any) -> Cmd:
    """A plain command, e.g. ``cmd("HGETALL", key)``; ``options`` go to redis-py's reply
    parser (``withscores=True`` for ``ZRANGE``)."""
    return Cmd(name.upper(), tuple(args), options=tuple(options.items()))


def script(
    registered: Script, keys: Sequence[str], args: Sequence[Any], *, durable: bool = False
) -> Cmd:
    """A registered script (``client.register_script(...)``) with its keys and arguments."""
    return Cmd("EVALSHA", tuple(args), registered, tuple(keys), durable)


def ok(replies: Sequence[Any]) -> list[Any]:
    """``replies`` as a list, raising the first one that is an error."""
    for r in replies:
        if isinstance(r, Exception):
            raise r
    return list(replies)


def call(
    client: RedisClient,
    registered: Script,
    keys: Sequence[str],
    args: Sequence[Any],
    *,
    durable: bool = False,
    min_replicas: int = 0,
    wait_ms: int = 100,
) -> Any:
    """One script, one round trip: its reply (an error reply raises). ``durable`` with
    ``min_replicas``: followed by ``WAIT`` (see the module doc)."""
    (reply,) = execute(
        client,
        [script(registered, keys, args, durable=durable)],
        min_replicas=min_replicas,
        wait_ms=wait_ms,
    )
    if isinstance(reply, Exception):
        raise reply
    return reply


def run(client: RedisClient, op: Op[T], *, min_replicas: int = 0, wait_ms: int = 100) -> T:
    """Run one operation (each of its rounds one round trip) and return its result."""
    return run_all(client, [op], min_replicas=min_replicas, wait_ms=wait_ms)[0]  # type: ignore[no-any-return]


def run_all(
    client: RedisClient,
    ops: Sequence[Op[Any]],
    *,
    min_replicas: int = 0,
    wait_ms: int = 100,
    first: Sequence[Cmd] = (),
    return_exceptions: bool = False,
) -> list[Any]:
    """Run ``ops`` in lock step (see the module doc) and return their results in order.

    ``first``: fire-and-forget commands sent at the head of the first round (queued writes);
    a failed one raises before any operation sees its replies. ``return_exceptions``: an
    operation's exception is its result instead of being raised (a caller that must undo
    what the others did, like giving a lease back when the quota refused)."""
    results: list[Any] = [None] * len(ops)
    error: BaseException | None = None
    wanted: dict[int, list[Cmd]] = {}

    def advance(i: int, replies: list[Any] | None) -> None:
        nonlocal error
        op = ops[i]
        try:
            wanted[i] = op.send(replies) if replies is not None else next(op)
        except StopIteration as stop:
            wanted.pop(i, None)
            results[i] = stop.value
        except Exception as e:
            wanted.pop(i, None)
            if return_exceptions:
                results[i] = e
            elif error is None:
                error = e

    for i in range(len(ops)):
        advance(i, None)
    head = list(first)
    while wanted or head:
        order = sorted(wanted)
        flat = list(head)
        spans: list[tuple[int, int, int]] = []
        for i in order:
            start = len(flat)
            flat.extend(wanted[i])
            spans.append((i, start, len(flat)))
        replies = execute(client, flat, min_replicas=min_replicas, wait_ms=wait_ms)
        ok(replies[: len(head)])
        head = []
        for i, start, end in spans:
            advance(i, replies[start:end])
    if error is not None:
        raise error
    return results


def execute(
    client: RedisClient, cmds: Sequence[Cmd], *, min_replicas: int = 0, wait_ms: int = 100
) -> list[Any]:
    """One round: ``cmds`` in one pipeline (or one by one on a cluster); error replies come
    back as exception objects. See the module doc for scripts, WAIT and errors.

    Inside :func:`on_loop` the round is awaited on the event loop with the client's
    asynchronous twin (:func:`attach_async`) instead of blocking the thread."""
    if not cmds:
        return []
    twin = _twin(client)
    if twin is not None:
        return await_(execute_async(twin, cmds, min_replicas=min_replicas, wait_ms=wait_ms))
    if is_cluster_client(client):
        return [_one(client, c, min_replicas, wait_ms) for c in cmds]
    replies = _pipeline(client, cmds, min_replicas, wait_ms)
    missing = _noscript(cmds, replies)
    if missing:  # the server lost its scripts: load them, send them again (see the doc)
        for sc in _scripts_of(cmds, missing):
            sc.sha = client.script_load(sc.script)
        resend = _resend(cmds, missing)
        again = _pipeline(client, [cmds[n] for n in resend], min_replicas, wait_ms)
        for n, r in zip(resend, again, strict=True):
            replies[n] = r
    return replies


async def execute_async(
    client: Any, cmds: Sequence[Cmd], *, min_replicas: int = 0, wait_ms: int = 100
) -> list[Any]:
    """:func:`execute` on a client's asynchronous twin (:class:`LoopRedis`, or a
    ``redis.asyncio`` client for TLS): the same semantics."""
    if not cmds:
        return []
    replies = await _round_async(client, cmds, min_replicas, wait_ms)
    missing = _noscript(cmds, replies)
    if missing:
        for sc in _scripts_of(cmds, missing):
            sc.sha = await client.script_load(sc.script)
        resend = _resend(cmds, missing)
        again = await _round_async(client, [cmds[n] for n in resend], min_replicas, wait_ms)
        for n, r in zip(resend, again, strict=True):
            replies[n] = r
    return replies


async def _round_async(
    client: Any, cmds: Sequence[Cmd], min_replicas: int, wait_ms: int
) -> list[Any]:
    if isinstance(client, LoopRedis):
        words: list[Command] = [
            (("EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.args), {})
            if c.script is not None
            else ((c.name, *c.args), dict(c.options))
            for c in cmds
        ]
        if min_replicas > 0 and any(c.durable for c in cmds):
            words.append((("WAIT", min_replicas, wait_ms), {}))
        return _acked(await client.execute(words), cmds, min_replicas, wait_ms)
    pipe = _queue(client.pipeline(transaction=False), cmds, min_replicas, wait_ms)
    return _acked(list(await pipe.execute(raise_on_error=False)), cmds, min_replicas, wait_ms)


def _resend(cmds: Sequence[Cmd], missing: Sequence[int]) -> list[int]:
    """After NOSCRIPT: the refused scripts and every plain command after the first of them,
    in round order (a script that did run is not sent twice)."""
    refused = set(missing)
    return [n for n in range(min(refused), len(cmds)) if n in refused or cmds[n].script is None]


def _noscript(cmds: Sequence[Cmd], replies: Sequence[Any]) -> list[int]:
    return [
        n
        for n, r in enumerate(replies)
        if isinstance(r, redis.exceptions.NoScriptError) and cmds[n].script is not None
    ]


def _scripts_of(cmds: Sequence[Cmd], positions: Sequence[int]) -> list[Script]:
    found: dict[int, Script] = {}
    for n in positions:
        sc = cmds[n].script
        assert sc is not None
        found.setdefault(id(sc), sc)
    return list(found.values())


def _queue(pipe: Any, cmds: Sequence[Cmd], min_replicas: int, wait_ms: int) -> Any:
    for c in cmds:
        if c.script is not None:
            pipe.evalsha(c.script.sha, len(c.keys), *c.keys, *c.args)
        else:
            pipe.execute_command(c.name, *c.args, **dict(c.options))
    if min_replicas > 0 and any(c.durable for c in cmds):
        pipe.execute_command("WAIT", min_replicas, wait_ms)
    return pipe


def _pipeline(
    client: RedisClient, cmds: Sequence[Cmd], min_replicas: int, wait_ms: int
) -> list[Any]:
    pipe = _queue(client.pipeline(transaction=False), cmds, min_replicas, wait_ms)
    return _acked(list(pipe.execute(raise_on_error=False)), cmds, min_replicas, wait_ms)


def _acked(replies: list[Any], cmds: Sequence[Cmd], min_replicas: int, wait_ms: int) -> list[Any]:
    """The replies without the trailing WAIT's; too few acknowledgements raise."""
    if not (min_replicas > 0 and any(c.durable for c in cmds)):
        return replies
    acked = replies.pop()
    if isinstance(acked, Exception):
        raise acked
    if int(acked) < min_replicas:
        first = next(c for c in cmds if c.durable)
        raise ReplicaAckError(
            f"write to {first.keys[0] if first.keys else first.name} reached the master "
            f"but only {acked} of the {min_replicas} replicas required "
            f"(CTX_REDIS_MIN_REPLICAS) acknowledged it within {wait_ms} ms; it is not "
            "durable yet, retry it"
        )
    return replies


def _one(client: RedisClient, c: Cmd, min_replicas: int, wait_ms: int) -> Any:
    """One command on a cluster client; an error reply is returned, not raised."""
    try:
        if c.script is not None:
            return call_script(
                client,
                c.script,
                list(c.keys),
                list(c.args),
                min_replicas=min_replicas if c.durable else 0,
                wait_ms=wait_ms,
            )
        return client.execute_command(c.name, *c.args, **dict(c.options))  # type: ignore[no-untyped-call]
    except redis.exceptions.ResponseError as e:
        return e


# --- the event-loop twins ----------------------------------------------------------------------


def attach_async(client: RedisClient, twin: Any) -> None:
    """Make ``twin`` (a ``redis.asyncio.Redis`` on the same server, database and timeouts)
    the client :func:`execute` awaits for ``client`` inside :func:`on_loop`. A Redis Cluster
    client cannot be given a twin (the service then runs its endpoints on threads)."""
    if is_cluster_client(client):
        raise ValueError("attach_async: a Redis Cluster client has no event-loop twin here")
    _TWINS[id(client)] = (client, twin)


def detach_async(client: RedisClient) -> Any:
    """Forget ``client``'s twin (returns it, for closing)."""
    entry = _TWINS.pop(id(client), None)
    return None if entry is None else entry[1]


_TWINS: dict[int, tuple[RedisClient, Any]] = {}


def _twin(client: RedisClient) -> Any:
    if not on_loop_now():
        return None
    entry = _TWINS.get(id(client))
    return entry[1] if entry is not None and entry[0] is client else None


#: A function that runs operations on one client (``WorkingMemory.run_all`` and friends).
Runner = Callable[[Sequence[Op[Any]]], list[Any]]
