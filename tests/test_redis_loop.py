"""The lean asyncio client of the event-loop path (context_core/redis/loop_client.py) answers
exactly
like redis-py's synchronous client, on real servers (Redis 7 and the password-protected
embedded Valkey), and keeps the request path's connection rules: a hung server is a
TimeoutError after the socket timeout, a restarted one is reconnected to once, at once.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import redis_client
from test_ops_hardening import private_redis

from context_core.redis.connection import cluster_enabled, make_async_twin, make_client, url_db
from context_core.redis.loop_client import LoopRedis
from loadtests.campaign import start_campaign_valkey

INCR_LUA = "return redis.call('INCR', KEYS[1])"


@pytest.fixture(scope="module")
def unix_valkey_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Valkey as a load campaign starts its own: reached over its Unix socket."""
    server, url, sock_dir = start_campaign_valkey(tmp_path_factory.mktemp("vk-unix"))
    try:
        yield url
    finally:
        server.stop()
        if sock_dir is not None:
            shutil.rmtree(sock_dir, ignore_errors=True)


@pytest.fixture(params=["redis7", "valkey", "valkey-unix"])
def server_url(request: pytest.FixtureRequest) -> str:
    name = {
        "redis7": "system_redis_url",
        "valkey": "embedded_valkey_url",
        "valkey-unix": "unix_valkey_url",
    }[request.param]
    return str(request.getfixturevalue(name))


def test_a_unix_socket_url_names_its_db_and_is_one_server(unix_valkey_url: str) -> None:
    assert unix_valkey_url.startswith("unix://") and url_db(unix_valkey_url) == 0
    assert url_db("unix:///run/redis.sock?db=3") == 3 and url_db("redis://h:1/5") == 5
    assert cluster_enabled(unix_valkey_url) is False  # answered without a TCP connect
    sync = redis_client(unix_valkey_url, decode_responses=True)
    lean = LoopRedis.from_client(sync)
    assert lean is not None and lean.path == unix_valkey_url[len("unix://") :].split("?")[0]
    sync.close()


def _commands(tag: str, sha: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    k = f"{{{tag}}}"
    return [
        (("SET", f"{k}:s", "v"), {}),
        (("GET", f"{k}:s"), {}),
        (("GET", f"{k}:none"), {}),
        (("HSET", f"{k}:h", "a", "1", "b", "é"), {}),
        (("HGETALL", f"{k}:h"), {}),
        (("HGETALL", f"{k}:none"), {}),
        (("HGET", f"{k}:h", "b"), {}),
        (("HMGET", f"{k}:h", "a", "zz"), {}),
        (("SADD", f"{k}:set", "x", "y"), {}),
        (("SMEMBERS", f"{k}:set"), {}),
        (("SMEMBERS", f"{k}:none"), {}),
        (("ZADD", f"{k}:z", 1.5, "m1", 2, "m2"), {}),
        (("ZRANGEBYSCORE", f"{k}:z", "-inf", "+inf"), {}),
        (("ZRANGE", f"{k}:z", 0, -1, "WITHSCORES"), {"withscores": True}),
        (("ZSCORE", f"{k}:z", "m1"), {}),
        (("PTTL", f"{k}:s"), {}),
        (("EXISTS", f"{k}:s", f"{k}:none"), {}),
        (("EVALSHA", sha, 1, f"{k}:n"), {}),
        (("EVALSHA", "0" * 40, 0), {}),  # NOSCRIPT
        (("INCR", f"{k}:h"), {}),  # WRONGTYPE
        (("SCRIPT LOAD", INCR_LUA), {}),
        (("DEL", f"{k}:s", f"{k}:h", f"{k}:set", f"{k}:z", f"{k}:n"), {}),
    ]


def test_replies_and_errors_are_exactly_redis_pys(server_url: str) -> None:
    sync = redis_client(server_url, decode_responses=True)
    sha = sync.script_load(INCR_LUA)
    tag = f"t-lean-{uuid.uuid4().hex[:8]}"
    lean = LoopRedis.from_client(sync)
    assert lean is not None
    got = asyncio.run(_run(lean, _commands(tag, sha)))
    want = []
    for words, opts in _commands(tag, sha):
        p = sync.pipeline(transaction=False)
        p.execute_command(*words, **opts)
        want.append(p.execute(raise_on_error=False)[0])
    for (words, _), g, w in zip(_commands(tag, sha), got, want, strict=True):
        assert type(g) is type(w), (words[0], g, w)
        if isinstance(w, Exception):
            assert str(g) == str(w), words[0]
        else:
            assert g == w, (words[0], g, w)
    assert isinstance(got[18], redis.exceptions.NoScriptError)
    sync.close()


async def _run(lean: LoopRedis, commands: Any) -> list[Any]:
    try:
        return await lean.execute(commands)
    finally:
        await lean.aclose()


def test_many_round_trips_at_once_each_get_their_own_replies(system_redis_url: str) -> None:
    sync = redis_client(system_redis_url, decode_responses=True)
    lean = LoopRedis.from_client(sync)
    assert lean is not None
    tag = f"t-lean-{uuid.uuid4().hex[:8]}"

    async def main() -> list[Any]:
        try:
            return await asyncio.gather(
                *(
                    lean.execute([(("SET", f"{tag}:{i}", str(i)), {}), (("GET", f"{tag}:{i}"), {})])
                    for i in range(200)
                )
            )
        finally:
            await lean.aclose()

    got = asyncio.run(main())
    assert [g[1] for g in got] == [str(i) for i in range(200)]
    sync.delete(*[f"{tag}:{i}" for i in range(200)])
    sync.close()


def _fail_fast_client(url: str, timeout_s: float) -> Any:
    """The request path's client (make_client's fail_fast) with both timeouts ``timeout_s``."""
    return make_client(
        url,
        cluster=False,
        decode_responses=True,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        fail_fast=True,
    )


def test_a_hung_server_times_out_and_a_restarted_one_is_reconnected(tmp_path: Path) -> None:
    with private_redis(tmp_path / "redis") as server:
        sync = _fail_fast_client(server.url, 0.15)
        twin = make_async_twin(sync)
        assert isinstance(twin, LoopRedis)

        async def main() -> tuple[float, Any, Any]:
            await twin.execute([(("SET", "k", "v"), {})])
            server.pause()
            t0 = time.perf_counter()
            try:
                await twin.execute([(("GET", "k"), {})])
                raise AssertionError("a paused server answered")
            except redis.TimeoutError:
                took = time.perf_counter() - t0
            finally:
                server.resume()
            after_pause = await twin.execute([(("GET", "k"), {})])  # a new connection
            server.stop()
            server.start()  # same port, empty: the pooled connections are dead
            after_restart = await twin.execute([(("GET", "k"), {})])  # retried once, at once
            await twin.aclose()
            return took, after_pause, after_restart

        took, after_pause, after_restart = asyncio.run(main())
        assert 0.1 < took < 0.6, f"timed out after {took:.2f} s"
        assert after_pause == ["v"] and after_restart == [None]
        sync.close()


def test_what_it_does_not_serve_falls_back_to_redis_asyncio(tmp_path: Path) -> None:
    tls = redis.Redis(host="127.0.0.1", port=1, ssl=True)
    assert LoopRedis.from_client(tls) is None
    twin = make_async_twin(tls)
    assert type(twin).__module__.startswith("redis.asyncio")


def test_commands_are_packed_exactly_as_redis_py_packs_them() -> None:
    import enum

    from redis.connection import PythonRespSerializer

    class Level(enum.IntEnum):
        HIGH = 3

    lean = LoopRedis()
    words = ("EVALSHA", "ab" * 20, 2, "k:é", b"\x00raw", -7, 1.5, 10**20, Level.HIGH, "")
    want = b"".join(PythonRespSerializer(6000, lean.encoder.encode).pack(*words))
    assert lean._pack(words) == want
    assert lean._pack(("SCRIPT LOAD", "return 1")) == b"".join(
        PythonRespSerializer(6000, lean.encoder.encode).pack("SCRIPT", "LOAD", "return 1")
    )
    assert lean._c_pack  # the words above took both paths: hiredis's and the loop (IntEnum)
    rng = random.Random(5)
    for _ in range(2000):  # hiredis's packing against redis-py's, word types it takes
        pick = [
            lambda: rng.choice(["", "é", "k:ü\u2603", "x" * rng.randint(0, 300)]),
            lambda: bytes(rng.randrange(256) for _ in range(rng.randint(0, 40))),
            lambda: rng.randint(-(2**70), 2**70),
            lambda: rng.uniform(-1e9, 1e9) * 10 ** rng.randint(-30, 30),
            lambda: rng.choice([0.1, -0.0, float("inf"), float("-inf"), 5e-324]),
        ]
        ws = ("X", *(rng.choice(pick)() for _ in range(rng.randint(0, 8))))
        assert lean._pack(ws) == b"".join(
            PythonRespSerializer(6000, lean.encoder.encode).pack(*ws)
        ), ws
    latin = LoopRedis(encoding="latin-1")  # not UTF-8: never hiredis's (it encodes UTF-8)
    assert not latin._c_pack
    assert latin._pack(("SET", "é")) == b"*2\r\n$3\r\nSET\r\n$1\r\n\xe9\r\n"
    with pytest.raises(UnicodeEncodeError):  # strict UTF-8 either way: a lone surrogate
        lean._pack(("SET", "k", "\udcff"))
    for bad in (True, None, object()):  # redis-py's own errors, word for word
        with pytest.raises(redis.DataError) as got:
            lean._pack(("SET", "k", bad))
        with pytest.raises(redis.DataError) as ref:
            lean.encoder.encode(bad)
        assert str(got.value) == str(ref.value)


# --- the shared pipe: concurrent rounds on one connection ------------------------------------


def _writes(lean: LoopRedis) -> list[int]:
    """Count the pipe's transport writes (wrapped once the pipe exists)."""
    counter = [0]
    pipe = lean._pipe
    assert pipe is not None and pipe.transport is not None
    write = pipe.transport.write

    def counted(data: bytes) -> None:
        counter[0] += 1
        write(data)

    pipe.transport.write = counted
    return counter


def test_concurrent_rounds_share_one_write_and_get_their_own_replies(
    unix_valkey_url: str,
) -> None:
    sync = redis_client(unix_valkey_url, decode_responses=True)
    lean = LoopRedis.from_client(sync)
    assert lean is not None and lean.share
    tag = f"t-pipe-{uuid.uuid4().hex[:8]}"

    async def main() -> tuple[list[Any], int, int]:
        try:
            await lean.execute([(("PING",), {})])  # opens the pipe
            writes = _writes(lean)
            got = await asyncio.gather(
                *(
                    lean.execute(
                        [(("INCRBY", f"{tag}:{i % 7}", i), {}), (("GET", f"{tag}:{i % 7}"), {})]
                    )
                    for i in range(120)
                )
            )
            return got, writes[0], len(lean._idle)
        finally:
            await lean.aclose()

    got, writes, own = asyncio.run(main())
    # the 120 rounds were issued in one loop turn: one write carried all of them
    assert writes == 1, writes
    assert own == 0  # no round needed a connection of its own
    totals: dict[int, int] = {}
    for i, (incr, value) in enumerate(got):
        totals[i % 7] = totals.get(i % 7, 0) + i
        assert int(value) == incr  # each round saw its own INCRBY's result, in order
    assert {k: int(sync.get(f"{tag}:{k}")) for k in totals} == totals
    sync.delete(*[f"{tag}:{k}" for k in range(7)])
    sync.close()


def test_a_cancelled_round_leaves_the_pipe_in_step(system_redis_url: str) -> None:
    sync = redis_client(system_redis_url, decode_responses=True)
    lean = LoopRedis.from_client(sync)
    assert lean is not None
    key = f"t-pipe-cancel-{uuid.uuid4().hex[:8]}"

    async def main() -> tuple[Any, Any]:
        try:
            await lean.execute([(("SET", key, "first"), {})])
            doomed = asyncio.ensure_future(
                lean.execute([(("GET", key), {}), (("SET", key, "second"), {})])
            )
            await asyncio.sleep(0)  # queued and flushed, its replies not read yet
            doomed.cancel()
            after = await lean.execute([(("GET", key), {})])
            return after, doomed.cancelled()
        finally:
            await lean.aclose()

    after, cancelled = asyncio.run(main())
    # the cancelled round's two replies were read and dropped; the next got its own
    assert cancelled and after == ["second"]
    sync.delete(key)
    sync.close()


def test_a_hung_server_fails_every_waiting_round_with_the_timeout(tmp_path: Path) -> None:
    with private_redis(tmp_path / "redis") as server:
        sync = _fail_fast_client(server.url, 0.15)
        twin = make_async_twin(sync)
        assert isinstance(twin, LoopRedis) and twin.share

        async def main() -> tuple[list[Any], Any]:
            await twin.execute([(("SET", "k", "v"), {})])
            server.pause()
            try:
                outcomes = await asyncio.gather(
                    *(twin.execute([(("INCR", "n"), {})]) for _ in range(5)),
                    return_exceptions=True,
                )
            finally:
                server.resume()
            after = await twin.execute([(("GET", "n"), {})])  # a new pipe
            await twin.aclose()
            return outcomes, after

        outcomes, after = asyncio.run(main())
        assert all(isinstance(o, redis.TimeoutError) for o in outcomes), outcomes
        # none was retried: the five INCRs reached the server once each, or not at all
        assert after[0] is None or int(after[0]) <= 5
        sync.close()


def test_a_round_times_out_by_its_own_send_time_not_the_pipes_first(tmp_path: Path) -> None:
    """One watchdog serves the pipe: a round sent after an earlier, answered one still gets
    its whole timeout, and a hung one fails within about that timeout."""
    timeout = 0.4
    with private_redis(tmp_path / "redis") as server:
        sync = _fail_fast_client(server.url, timeout)
        twin = make_async_twin(sync)
        assert isinstance(twin, LoopRedis) and twin.share

        async def main() -> tuple[Any, float]:
            await twin.execute([(("SET", "k", "v"), {})])  # arms the watchdog at t + timeout
            await asyncio.sleep(timeout * 0.6)
            server.pause()
            t0 = time.perf_counter()
            try:
                outcome: Any = await twin.execute([(("GET", "k"), {})])
            except redis.TimeoutError as e:
                outcome = e
            finally:
                server.resume()
            elapsed = time.perf_counter() - t0
            await twin.aclose()
            return outcome, elapsed

        outcome, elapsed = asyncio.run(main())
        assert isinstance(outcome, redis.TimeoutError), outcome
        assert timeout * 0.9 <= elapsed < timeout + 0.5, elapsed
        sync.close()


def test_commands_that_hold_the_connection_go_on_one_of_their_own(system_redis_url: str) -> None:
    sync = redis_client(system_redis_url, decode_responses=True)
    lean = LoopRedis.from_client(sync)
    assert lean is not None

    async def main() -> tuple[Any, bool, int]:
        try:
            got = await lean.execute([(("SET", "t-pipe-wait", "1"), {}), (("WAIT", 0, 10), {})])
            return got, lean._pipe is None, len(lean._idle)
        finally:
            await lean.aclose()

    got, no_pipe, own = asyncio.run(main())
    assert got == [True, 0] and no_pipe and own == 1
    sync.delete("t-pipe-wait")
    sync.close()


def test_a_failed_connect_is_not_remembered(tmp_path: Path) -> None:
    """Rounds waiting for the pipe's connect share its failure; the next round dials again."""
    with private_redis(tmp_path / "redis") as server:
        sync = _fail_fast_client(server.url, 1.0)
        twin = make_async_twin(sync)
        assert isinstance(twin, LoopRedis)

        async def main() -> tuple[list[Any], Any]:
            server.stop()
            failed = await asyncio.gather(
                *(twin.execute([(("PING",), {})]) for _ in range(3)), return_exceptions=True
            )
            server.start()
            again = await twin.execute([(("PING",), {})])
            await twin.aclose()
            return failed, again

        failed, again = asyncio.run(main())
        assert all(isinstance(f, redis.ConnectionError) for f in failed), failed
        assert again == [True]
        sync.close()
