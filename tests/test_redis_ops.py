"""Several operations in one round trip (context_core/redis/ops.py), the event-loop bridge
(context_core/concurrency.py) and the deferred L2 writes (WorkingMemory.deferred), on real
servers: Redis 7, the embedded Valkey and a Redis Cluster.

Round trips are counted at the wire (conftest.RoundTrips), so these tests hold whatever code
path builds the commands.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from conftest import RoundTrips, redis_client

from context_core.concurrency import await_, blocking, on_loop, on_loop_now, wait_future
from context_core.errors import BackendUnavailableError, ReplicaAckError
from context_core.gateway.sanitize import Gateway
from context_core.redis.connection import is_cluster_client, make_async_twin
from context_core.redis.ops import (
    Op,
    attach_async,
    cmd,
    detach_async,
    execute,
    ok,
    run,
    run_all,
    script,
)
from context_core.working_memory import WorkingMemory

INCR_LUA = "return redis.call('INCR', KEYS[1])"


@pytest.fixture
def client(any_redis: str) -> Iterator[Any]:
    c = redis_client(any_redis, decode_responses=True)
    yield c
    c.close()


@pytest.fixture
def tag() -> str:
    return f"t-ops-{uuid.uuid4().hex[:10]}"


def _get(key: str) -> Op[Any]:
    (value,) = ok((yield [cmd("GET", key)]))
    return value


def _get_then_exists(key: str) -> Op[tuple[Any, int]]:
    """A read with a follow-up: a miss asks whether the key exists at all (always 0 then)."""
    value = yield from _get(key)
    if value is not None:
        return value, 1
    (n,) = ok((yield [cmd("EXISTS", key)]))
    return value, int(n)


def test_independent_operations_share_one_round_trip(client: Any, tag: str) -> None:
    keys = [f"{{{tag}}}:{i}" for i in range(5)]
    for i, k in enumerate(keys[:3]):
        client.set(k, str(i))
    with RoundTrips() as rt:
        got = run_all(client, [_get(k) for k in keys])
    assert got == ["0", "1", "2", None, None]
    if not is_cluster_client(client):
        assert rt.trips == [["GET"] * 5]  # one packet, in operation order
    client.delete(*keys)


def test_follow_ups_join_the_next_round_only_for_the_ops_that_need_them(
    client: Any, tag: str
) -> None:
    hit, miss = f"{{{tag}}}:hit", f"{{{tag}}}:miss"
    client.set(hit, "x")
    with RoundTrips() as rt:
        got = run_all(client, [_get_then_exists(hit), _get_then_exists(miss)])
    assert got == [("x", 1), (None, 0)]
    if not is_cluster_client(client):
        assert rt.trips == [["GET", "GET"], ["EXISTS"]]
    client.delete(hit)


def test_lost_scripts_are_loaded_and_run_exactly_once(client: Any, tag: str) -> None:
    if is_cluster_client(client):
        pytest.skip("a cluster client runs each script itself (redis-py loads it there)")
    counter, probe = f"{{{tag}}}:n", f"{{{tag}}}:probe"
    incr = client.register_script(INCR_LUA)
    client.set(probe, "p")
    client.script_flush()
    with RoundTrips() as rt:
        replies = execute(client, [script(incr, [counter], []), cmd("GET", probe)])
    assert replies == [1, "p"]
    assert client.get(counter) == "1"  # the refused EVALSHA did not run; the retry ran once
    assert ["SCRIPT"] in rt.trips  # the load happened in between
    assert execute(client, [script(incr, [counter], [])]) == [2]
    client.delete(counter, probe)


def test_an_operation_that_raises_ends_alone_or_is_returned(client: Any, tag: str) -> None:
    written = f"{{{tag}}}:w"

    def boom() -> Op[None]:
        yield [cmd("GET", written)]
        raise ValueError("refused")

    def write() -> Op[str]:
        ok((yield [cmd("SET", written, "v")]))
        return "done"

    with pytest.raises(ValueError, match="refused"):
        run_all(client, [boom(), write()])
    assert client.get(written) == "v"  # the other one finished
    got = run_all(client, [boom(), write()], return_exceptions=True)
    assert isinstance(got[0], ValueError) and got[1] == "done"
    client.delete(written)


def test_queued_writes_go_first_and_a_failed_one_raises_before_any_reply(
    client: Any, tag: str
) -> None:
    key, listy = f"{{{tag}}}:k", f"{{{tag}}}:list"
    assert run_all(client, [_get(key)], first=[cmd("SET", key, "first")]) == ["first"]
    client.rpush(listy, "x")
    seen: list[Any] = []

    def watcher() -> Op[None]:
        seen.append((yield [cmd("GET", key)]))

    with pytest.raises(redis.ResponseError):  # INCR of a list: an error reply
        run_all(client, [watcher()], first=[cmd("INCR", listy)])
    assert seen == []
    client.delete(key, listy)


def test_durable_writes_wait_for_replicas_and_say_when_too_few_did(
    system_redis_url: str, tag: str
) -> None:
    c = redis_client(system_redis_url, decode_responses=True)
    incr = c.register_script(INCR_LUA)
    key = f"{{{tag}}}:d"
    with RoundTrips() as rt, pytest.raises(ReplicaAckError, match="CTX_REDIS_MIN_REPLICAS"):
        execute(c, [script(incr, [key], [], durable=True)], min_replicas=1, wait_ms=20)
    assert rt.trips[-1] == ["EVALSHA", "WAIT"]  # same connection, same packet
    assert execute(c, [script(incr, [key], [])], min_replicas=1) == [2]  # not durable: no WAIT
    c.delete(key)
    c.close()


# --- the event-loop bridge -------------------------------------------------------------------


@pytest.fixture
def twinned(system_redis_url: str) -> Iterator[Any]:
    c = redis_client(system_redis_url, decode_responses=True)
    yield c
    c.close()


def test_code_on_the_loop_awaits_its_round_trips_and_the_loop_goes_on(
    twinned: Any, tag: str
) -> None:
    """Two requests each blocked 0.3 s on Redis (BLPOP) finish together in ~0.3 s, and a
    timer on the same loop keeps ticking meanwhile: nothing blocked the loop."""
    lists = [f"{{{tag}}}:q{i}" for i in range(2)]

    def request(key: str) -> Any:
        assert on_loop_now()
        return execute(twinned, [cmd("BLPOP", key, 0.3)])[0]

    async def main() -> tuple[list[Any], float, int]:
        twin = make_async_twin(twinned)
        attach_async(twinned, twin)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        t = asyncio.create_task(ticker())
        try:
            t0 = time.perf_counter()
            got = await asyncio.gather(*(on_loop(request, k) for k in lists))
            took = time.perf_counter() - t0
        finally:
            t.cancel()
            detach_async(twinned)
            await twin.aclose()
        return list(got), took, ticks

    with RoundTrips() as rt:
        got, took, ticks = asyncio.run(main())
    assert got == [None, None]
    assert took < 0.55, f"the two waits did not overlap: {took:.2f} s"
    assert ticks >= 8, f"the loop stalled: {ticks} ticks in {took:.2f} s"
    assert rt.trips == [] and len(rt.async_trips) == 2  # no blocking send at all


def test_without_a_twin_or_off_the_loop_the_same_code_blocks_as_before(
    twinned: Any, tag: str
) -> None:
    key = f"{{{tag}}}:plain"
    twinned.set(key, "v")
    assert not on_loop_now()
    with RoundTrips() as rt:
        assert run(twinned, _get(key)) == "v"
    assert rt.trips == [["GET"]] and rt.async_trips == []

    async def main() -> Any:  # on the loop, but this client has no twin: blocking (counted)
        return await on_loop(run, twinned, _get(key))

    with RoundTrips() as rt:
        assert asyncio.run(main()) == "v"
    assert rt.loop_trips == [["GET"]]
    twinned.delete(key)


def test_errors_cross_the_bridge_both_ways(twinned: Any, tag: str) -> None:
    key = f"{{{tag}}}:list"
    twinned.rpush(key, "x")

    def request() -> str:
        try:
            reply = execute(twinned, [cmd("INCR", key)])[0]
            assert isinstance(reply, redis.ResponseError)  # an error reply: returned
            ok(execute(twinned, [cmd("INCR", key)]))  # and raised by ok()
        except redis.ResponseError:
            return "caught on the sync side"
        raise AssertionError("unreachable")

    def fails() -> None:
        raise KeyError("from sync code")

    async def main() -> tuple[str, BaseException | None]:
        twin = make_async_twin(twinned)
        attach_async(twinned, twin)
        try:
            first = await on_loop(request)
            try:
                await on_loop(fails)
            except KeyError as e:
                return first, e
            return first, None
        finally:
            detach_async(twinned)
            await twin.aclose()

    first, err = asyncio.run(main())
    assert first == "caught on the sync side" and isinstance(err, KeyError)
    twinned.delete(key)


def test_wait_future_and_blocking_await_on_the_loop_and_just_run_elsewhere() -> None:
    pool = ThreadPoolExecutor(2)
    slow = pool.submit(time.sleep, 0.3)
    assert wait_future(pool.submit(lambda: 7), 1.0) == 7
    with pytest.raises(TimeoutError):
        wait_future(slow, 0.01)
    main_thread = threading.get_ident()
    assert blocking(threading.get_ident) == main_thread  # off the loop: inline

    def request() -> tuple[int, int, bool]:
        fut = pool.submit(lambda: 42)
        late = pool.submit(time.sleep, 0.5)
        try:
            wait_future(late, 0.05)
            timed_out = False
        except TimeoutError:
            timed_out = True
        return wait_future(fut, 1.0), blocking(threading.get_ident), timed_out

    value, ran_on, timed_out = asyncio.run(on_loop(request))
    assert value == 42 and timed_out
    assert ran_on != main_thread  # the blocking call ran on a worker thread, awaited
    with pytest.raises(RuntimeError, match="outside on_loop"):
        await_(asyncio.sleep(0))
    pool.shutdown(wait=True)


# --- deferred L2 writes ----------------------------------------------------------------------


@pytest.fixture
def wm(client: Any) -> WorkingMemory:
    return WorkingMemory(client, Gateway())


def test_deferred_writes_go_in_one_round_trip_in_order(wm: WorkingMemory, session_id: str) -> None:
    sm = wm.session(session_id)
    with RoundTrips() as rt:
        with wm.deferred():
            sm.put_step_result("1", {"v": 1})
            sm.add_series_points("s", [(time.time(), 1.0)])
            sm.touch()
            assert rt.trips == []  # held back
            got = sm.get_step_result("1")  # a read inside: the writes go first, same packet
            assert got.value["v"] == 1
            if not is_cluster_client(wm._client):
                assert rt.trips[-1] == ["EVALSHA", "EVALSHA", "EVALSHA", "ZADD", "HGETALL", "PTTL"]
            sm.put_step_result("2", {"v": 2})
        assert sm.get_step_result("2").value["v"] == 2  # flushed when the scope ended
    sm.clear()


def test_a_failed_block_drops_its_held_writes(wm: WorkingMemory, session_id: str) -> None:
    sm = wm.session(session_id)
    with pytest.raises(RuntimeError), wm.deferred():
        sm.put_step_result("1", {"v": 1})
        raise RuntimeError("the event failed")
    assert sm.keys() == []  # nothing was sent
    with wm.deferred(), wm.deferred():  # nested: the outer scope flushes
        sm.put_step_result("1", {"v": 1})
    assert sm.get_step_result("1").value["v"] == 1
    sm.clear()


def test_a_deferred_write_that_fails_surfaces_as_backend_unavailable(
    wm: WorkingMemory, session_id: str
) -> None:
    sm = wm.session(session_id)
    key = sm.key("series", "s")
    wm._client.rpush(key, "not a sorted set")  # the series write's ZADD fails on this key
    with pytest.raises(BackendUnavailableError, match="deferred writes"), wm.deferred():
        sm.add_series_points("s", [(time.time(), 1.0)])
    wm._client.delete(key)
    sm.clear()


def test_after_lost_scripts_a_read_still_sees_the_writes_queued_before_it(
    wm: WorkingMemory, session_id: str
) -> None:
    if is_cluster_client(wm._client):
        pytest.skip("a cluster client runs each command on its own, in order")
    sm = wm.session(session_id)
    wm._client.script_flush()  # a restarted server: every EVALSHA is refused once
    with wm.deferred():
        sm.put_step_result("1", {"v": 1})
        assert sm.get_step_result("1").value["v"] == 1  # re-sent after the write
    sm.clear()
