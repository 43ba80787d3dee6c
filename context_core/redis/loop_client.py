"""A lean asyncio Redis client for the service's event-loop path (one round trip per call).

What :func:`context_core.redis.ops.execute` awaits for a client on the loop (the client's
*twin*, :func:`context_core.redis.ops.attach_async`). ``redis.asyncio`` does the same job,
but on this service its per-round overhead (a pool lock, a retry wrapper, a timeout context
per reply, observability hooks) cost ~95 µs of CPU per pipelined round trip against ~38 µs
here (``benchmarks/service_capacity.py`` section ``service``, the round-trip rows): with about
three round trips a request, that was a tenth of the service's CPU. This client only does
what the operations need: a list of commands written in one go, their replies read by hiredis
(C), one timer per connection while rounds wait (not one per round trip).

The replies have exactly the shapes of redis-py's synchronous client (RESP2 on the wire, then
redis-py's own reply callbacks: a dict for ``HGETALL``, a set for ``SMEMBERS``, ...), and
errors are redis-py's exception classes (``NoScriptError``, ``ResponseError``,
``ConnectionError``, ``TimeoutError``), so callers cannot tell the two apart
(tests/test_redis_loop.py compares them command by command on real servers).

**One shared connection for concurrent rounds.** Rounds issued while the loop runs one batch of
callbacks (the requests of one event-loop turn) go out together: each round is queued on the
client's *pipe*, one connection whose writes are flushed once per loop turn, and whose replies
are handed out in order (Redis answers a connection's commands in the order it read them). So
under load N concurrent rounds cost one write, one read and one wake-up of Valkey instead of N
of each. A round waits for its own replies only; one that is cancelled leaves its replies to be
read and dropped, so the connection stays in step. Rounds holding a command that blocks the
connection (``WAIT``, the ``B...`` list pops, ``MULTI``...) or changes its state go on a
connection of their own, as before: one exchange at a time.

Connection rules, the request path's (:func:`context_core.redis.connection.make_client`'s
``fail_fast``): connect within ``socket_connect_timeout``; a round trip gives up after
``socket_timeout`` (the connection is dropped); a connection found broken is replaced and the
round sent once more, immediately; a timeout is never retried. On the shared pipe a round
that times out drops the pipe, and every round still waiting on it fails with the same
:class:`redis.TimeoutError` (none of them is retried: their commands may have run).
Authentication (``AUTH``) and the database (``SELECT``) are set on each new connection. TLS
and Redis Cluster are not served here (:meth:`LoopRedis.from_client` answers None and the
caller falls back).
"""

from __future__ import annotations

import asyncio
import codecs
from collections import deque
from collections.abc import Sequence
from typing import Any

import hiredis
import redis
from redis._parsers.base import BaseParser
from redis._parsers.encoders import Encoder
from redis._parsers.response_callbacks import get_response_callbacks
from redis.exceptions import InvalidResponse

from context_core.concurrency import OneExchange

__all__ = ["LoopRedis"]

#: One command of a round: its words (the first may hold a space: ``"SCRIPT LOAD"``) and the
#: options redis-py's reply callback takes (``withscores=True``).
Command = tuple[tuple[Any, ...], dict[str, Any]]

#: redis-py's reply callbacks for RESP2 replies (upper-case command names).
_CALLBACKS: dict[str, Any] = {
    k.upper(): v for k, v in get_response_callbacks(user_protocol=2, legacy_responses=True).items()
}


class _Conn(OneExchange[list[Any]]):
    """One connection: at most one round trip in flight; its replies read by hiredis."""

    def __init__(self, reader: Any) -> None:
        super().__init__()
        self.reader = reader
        self.replies: list[Any] = []
        self.want = 0

    def lost_error(self, exc: Exception | None) -> BaseException:
        if exc is None:
            return redis.ConnectionError("Connection closed by server.")
        return redis.ConnectionError(f"Connection closed by server ({exc})")

    def timeout_error(self) -> BaseException:
        return redis.TimeoutError("Timeout reading from socket")

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        try:
            while True:
                reply = self.reader.gets()
                if reply is False:
                    break
                self.replies.append(reply)
        except Exception as e:  # a protocol error: the connection is unusable
            self.fail(e)
            return
        if len(self.replies) >= self.want:
            self.answer(self.replies)

    async def round(self, payload: bytes, n: int, timeout_s: float | None) -> list[Any]:
        self.replies, self.want = [], n
        return await self.exchange(payload, timeout_s)


#: Commands that block their connection or change its state: their rounds never share the pipe.
_EXCLUSIVE = frozenset(
    {
        "WAIT", "WAITAOF", "MULTI", "EXEC", "DISCARD", "WATCH", "UNWATCH", "SELECT", "AUTH",
        "HELLO", "RESET", "QUIT", "CLIENT", "MONITOR", "SUBSCRIBE", "PSUBSCRIBE",
        "SSUBSCRIBE", "UNSUBSCRIBE", "PUNSUBSCRIBE", "SUNSUBSCRIBE", "SYNC", "PSYNC",
        "BLPOP", "BRPOP", "BRPOPLPUSH", "BLMOVE", "BLMPOP", "BZPOPMIN", "BZPOPMAX", "BZMPOP",
        "XREAD", "XREADGROUP", "SHUTDOWN", "DEBUG",
    }
)  # fmt: skip


def _exclusive(words: Sequence[Any]) -> bool:
    """Whether a command must have its connection to itself (:data:`_EXCLUSIVE`)."""
    name = words[0] if words else ""
    if isinstance(name, bytes):
        name = name.decode("latin-1")
    return str(name).split(" ", 1)[0].upper() in _EXCLUSIVE


class _Round:
    """One round on the pipe: how many replies it waits for, those read so far, its waiter,
    and the loop time by which its replies must be in (None: no timeout)."""

    __slots__ = ("deadline", "n", "replies", "waiter")

    def __init__(self, n: int, waiter: asyncio.Future[list[Any]], deadline: float | None) -> None:
        self.n = n
        self.replies: list[Any] = []
        self.waiter = waiter
        self.deadline = deadline


class _Pipe(asyncio.Protocol):
    """The shared connection (see the module doc): rounds queued in send order, their
    payloads written together once per loop turn, replies dealt out in that order."""

    def __init__(self, reader: Any, timeout_s: float | None) -> None:
        self.reader = reader
        self.timeout_s = timeout_s
        self.transport: Any = None
        self.rounds: deque[_Round] = deque()
        self.out: list[bytes] = []
        self.broken: BaseException | None = None
        self._flush_at: asyncio.Handle | None = None
        # One watchdog for the whole queue instead of a timer per round (a timer's start and
        # cancel were ~2.3 us a round): rounds are answered in order and all get the same
        # timeout, so the oldest waiting round is always the first to be late.
        self._watchdog: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        detail = f" ({exc})" if exc is not None else ""
        self.fail(redis.ConnectionError(f"Connection closed by server{detail}."))

    def eof_received(self) -> bool | None:
        self.fail(redis.ConnectionError("Connection closed by server."))
        return None

    def send(self, payload: bytes, n: int) -> asyncio.Future[list[Any]]:
        loop = asyncio.get_running_loop()
        timeout = self.timeout_s
        rnd = _Round(n, loop.create_future(), None if timeout is None else loop.time() + timeout)
        if timeout is not None and self._watchdog is None:
            self._watchdog = loop.call_later(timeout, self._watch)
        self.rounds.append(rnd)
        self.out.append(payload)
        if self._flush_at is None:
            self._flush_at = loop.call_soon(self._flush)
        return rnd.waiter

    def _flush(self) -> None:
        self._flush_at = None
        if self.out and self.broken is None:
            data = self.out[0] if len(self.out) == 1 else b"".join(self.out)
            self.out.clear()
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        rounds = self.rounds
        try:
            while rounds:
                reply = self.reader.gets()
                if reply is False:
                    break
                head = rounds[0]
                head.replies.append(reply)
                if len(head.replies) >= head.n:
                    rounds.popleft()
                    if not head.waiter.done():  # a cancelled round's replies are dropped
                        head.waiter.set_result(head.replies)
            else:
                if self.reader.gets() is not False:  # a reply nobody asked for
                    raise redis.ConnectionError("Redis sent a reply to no command")
        except Exception as e:  # a protocol error: the connection is out of step
            self.fail(e if isinstance(e, redis.RedisError) else redis.ConnectionError(str(e)))

    def _watch(self) -> None:
        """The watchdog: fail the pipe if the oldest waiting round is late, else look again
        when it would be (and not at all once nothing waits)."""
        self._watchdog = None
        if not self.rounds or self.broken is not None:
            return
        deadline = self.rounds[0].deadline
        if deadline is None:
            return
        loop = asyncio.get_running_loop()
        late = deadline - loop.time()
        if late <= 0:
            self.fail(redis.TimeoutError("Timeout reading from socket"))
        else:
            self._watchdog = loop.call_later(late, self._watch)

    def fail(self, error: BaseException) -> None:
        """Break the pipe for good: every round still waiting gets ``error``."""
        if self.broken is None:
            self.broken = error
        rounds, self.rounds = self.rounds, deque()
        self.out.clear()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for rnd in rounds:
            if not rnd.waiter.done():
                rnd.waiter.set_exception(self.broken)
                rnd.waiter.exception()  # a cancelled caller never reads it: no warning
        if self.transport is not None:
            self.transport.abort()


class LoopRedis:
    """Round trips to one Redis server from an event loop (see the module doc). Use from one
    loop only (the service's); :meth:`aclose` on that loop."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 6379,
        path: str | None = None,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        socket_timeout: float | None = None,
        socket_connect_timeout: float | None = None,
        decode_responses: bool = False,
        encoding: str = "utf-8",
        encoding_errors: str = "strict",
        max_idle: int = 64,
        share: bool = True,
    ) -> None:
        self.host, self.port, self.path, self.db = host, int(port), path, int(db)
        self.username, self.password = username, password
        self.socket_timeout = socket_timeout
        self.connect_timeout = socket_connect_timeout
        self.decode_responses = decode_responses
        self.encoding, self.encoding_errors = encoding, encoding_errors
        self.encoder = Encoder(encoding, encoding_errors, decode_responses)  # type: ignore[no-untyped-call]
        # hiredis.pack_command encodes str as strict UTF-8: the C path only for that encoding
        self._c_pack = codecs.lookup(encoding).name == "utf-8" and encoding_errors == "strict"
        self.max_idle = int(max_idle)
        self._idle: list[_Conn] = []
        self._closed = False
        self.share = share  # concurrent rounds on one pipe (see the module doc)
        self._pipe: _Pipe | None = None
        self._pipe_opening: asyncio.Future[_Pipe] | None = None

    @classmethod
    def from_client(cls, client: Any) -> LoopRedis | None:
        """The twin of a synchronous ``redis.Redis`` (same server, database, credentials,
        timeouts, decoding); None for what this client does not serve (TLS, a cluster, a
        credential provider)."""
        if not isinstance(client, redis.Redis):
            return None
        pool = client.connection_pool
        kw = pool.connection_kwargs
        name = pool.connection_class.__name__
        if name not in ("Connection", "UnixDomainSocketConnection") or kw.get(
            "credential_provider"
        ):
            return None
        return cls(
            host=kw.get("host", "127.0.0.1"),
            port=kw.get("port", 6379),
            path=kw.get("path"),
            db=kw.get("db", 0) or 0,
            username=kw.get("username"),
            password=kw.get("password"),
            socket_timeout=kw.get("socket_timeout"),
            socket_connect_timeout=kw.get("socket_connect_timeout"),
            decode_responses=bool(kw.get("decode_responses")),
            encoding=kw.get("encoding", "utf-8"),
            encoding_errors=kw.get("encoding_errors", "strict"),
        )

    # --- wire ----------------------------------------------------------------------------
    def _pack(self, words: Sequence[Any]) -> bytes:
        if words and isinstance(words[0], str) and " " in words[0]:
            words = (*words[0].split(), *words[1:])
        if self._c_pack:
            # hiredis packs in C (about a third of the CPU of the loop below, which was ~4 %
            # of a worker's) what it packs exactly as redis-py does: str as strict UTF-8,
            # bytes, int and float by repr; any other type takes the loop, so redis-py's
            # Encoder decides it (an IntEnum, a bool refused) as before
            for w in words:
                t = type(w)
                if t is not str and t is not bytes and t is not int and t is not float:
                    break
            else:
                return hiredis.pack_command(tuple(words))  # type: ignore[no-any-return]
        encoding, errors = self.encoding, self.encoding_errors
        enc = self.encoder.encode
        parts = [b"*%d\r\n" % len(words)]
        for w in words:
            # the common exact types inline (what redis-py's Encoder makes of them); anything
            # else, subclasses included, through that Encoder, errors and all
            t = type(w)
            if t is str:
                b = w.encode(encoding, errors)
            elif t is bytes:
                b = w
            elif t is int:
                b = b"%d" % w
            else:
                b = enc(w)  # type: ignore[no-untyped-call]
            parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
        return b"".join(parts)

    def _reader(self) -> Any:
        kwargs: dict[str, Any] = {
            "protocolError": InvalidResponse,
            "replyError": BaseParser.parse_error,
            "errors": self.encoding_errors,
        }
        if self.decode_responses:
            kwargs["encoding"] = self.encoding
        return hiredis.Reader(**kwargs)

    async def _dial(self, loop: asyncio.AbstractEventLoop, factory: Any) -> None:
        try:
            if self.path:
                coro: Any = loop.create_unix_connection(factory, self.path)
            else:
                coro = loop.create_connection(factory, self.host, self.port)
            await asyncio.wait_for(coro, self.connect_timeout)
        except TimeoutError as e:
            raise redis.TimeoutError(f"Timeout connecting to {self._where()}") from e
        except OSError as e:
            raise redis.ConnectionError(f"Error connecting to {self._where()}: {e}") from e

    def _hello(self) -> list[tuple[Any, ...]]:
        hello: list[tuple[Any, ...]] = []
        if self.password is not None:
            auth = (self.username, self.password) if self.username else (self.password,)
            hello.append(("AUTH", *auth))
        if self.db:
            hello.append(("SELECT", self.db))
        return hello

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        conn = _Conn(self._reader())
        await self._dial(loop, lambda: conn)
        hello = self._hello()
        if hello:
            replies = await conn.round(
                b"".join(self._pack(h) for h in hello), len(hello), self.socket_timeout
            )
            for r in replies:
                if isinstance(r, Exception):
                    conn.fail(redis.ConnectionError(f"{self._where()}: {r}"))
                    raise r
        return conn

    def _where(self) -> str:
        return self.path or f"{self.host}:{self.port}"

    # --- round trips ---------------------------------------------------------------------
    async def execute(self, commands: Sequence[Command]) -> list[Any]:
        """Send ``commands`` in one round trip; their replies in order, each through
        redis-py's reply callback, an error reply as its exception object (not raised)."""
        if self._closed:
            raise redis.ConnectionError("the event-loop Redis client is closed")
        payload = b"".join(self._pack(words) for words, _ in commands)
        if self.share and not any(_exclusive(words) for words, _ in commands):
            raw = await self._shared_round(payload, len(commands))
        else:
            raw = await self._own_round(payload, len(commands))
        return [self._parse(r, words, opts) for r, (words, opts) in zip(raw, commands, strict=True)]

    async def _own_round(self, payload: bytes, n: int) -> list[Any]:
        """A round on a connection of its own (one exchange in flight)."""
        for attempt in (1, 2):
            conn = self._idle.pop() if self._idle else await self._connect()
            try:
                raw = await conn.round(payload, n, self.socket_timeout)
            except redis.ConnectionError:
                conn.fail(redis.ConnectionError("dropped"))
                if attempt == 2:
                    raise
                continue  # broken (a restarted server): once more on a new connection
            except BaseException:
                conn.fail(redis.ConnectionError("abandoned"))  # timed out or cancelled
                raise
            self._release(conn)
            return raw
        raise AssertionError("unreachable")

    async def _shared_round(self, payload: bytes, n: int) -> list[Any]:
        """A round on the pipe; a broken pipe (a restarted server) is replaced and the round
        sent once more, at once. A timeout is not retried."""
        for attempt in (1, 2):
            pipe = await self._the_pipe()
            try:
                return await pipe.send(payload, n)
            except redis.TimeoutError:
                raise
            except redis.ConnectionError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _the_pipe(self) -> _Pipe:
        pipe = self._pipe
        if pipe is not None and pipe.broken is None:
            return pipe
        opening = self._pipe_opening
        if opening is None or opening.done():  # one connect for every round needing the pipe
            opening = self._pipe_opening = asyncio.ensure_future(self._open_pipe())
            # read by whoever awaits it; if every one of them was cancelled, nobody must be
            # warned of an exception never retrieved
            opening.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            return await asyncio.shield(opening)
        finally:
            if opening.done() and self._pipe_opening is opening:
                self._pipe_opening = None

    async def _open_pipe(self) -> _Pipe:
        loop = asyncio.get_running_loop()
        pipe = _Pipe(self._reader(), self.socket_timeout)
        await self._dial(loop, lambda: pipe)
        hello = self._hello()
        if hello:
            replies = await pipe.send(b"".join(self._pack(h) for h in hello), len(hello))
            for r in replies:
                if isinstance(r, Exception):
                    pipe.fail(redis.ConnectionError(f"{self._where()}: {r}"))
                    raise r
        if self._closed:
            pipe.fail(redis.ConnectionError("the event-loop Redis client is closed"))
            raise pipe.broken  # type: ignore[misc]
        self._pipe = pipe
        return pipe

    def _release(self, conn: _Conn) -> None:
        if conn.broken is None and not self._closed and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    @staticmethod
    def _parse(reply: Any, words: Sequence[Any], options: dict[str, Any]) -> Any:
        if isinstance(reply, Exception):
            return reply
        name = str(words[0]).upper()
        if name == "SCRIPT" and len(words) > 1:
            name = f"SCRIPT {str(words[1]).upper()}"
        callback = _CALLBACKS.get(name)
        return callback(reply, **options) if callback is not None else reply

    async def script_load(self, body: str) -> str:
        """``SCRIPT LOAD`` (its SHA1)."""
        (sha,) = await self.execute([(("SCRIPT LOAD", body), {})])
        if isinstance(sha, Exception):
            raise sha
        return str(sha)

    async def aclose(self) -> None:
        self._closed = True
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.fail(redis.ConnectionError("the event-loop Redis client is closed"))
        idle, self._idle = self._idle, []
        for conn in idle:
            if conn.transport is not None:
                conn.transport.close()
