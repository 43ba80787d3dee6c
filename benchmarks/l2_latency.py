"""L1+L2 context-bundle latency, plan-aware step writes, L1 size, series-window writes.

Four measurements, each with a baseline from the same run:

1. **Bundle load** (10k iterations by default): advance an L1 state, then fetch one step
   result hash and one API response of the session from L2, as one pipelined round trip
   (``SessionMemory.fetch_bundle``) and as two separate calls. Baseline: a bare PING on the
   same connection (the loopback floor), and the reference design's 22 ms figure; target
   p99 <= 1 ms. Rows for the system Redis and for the embedded Valkey, and for a Redis
   Cluster when ``--cluster-url`` names one (``redis+cluster://host:port``, e.g. the one
   ``python tests/redis_cluster.py DIR`` starts): the same code through the cluster client.
2. **Step write under a stored plan** (``SessionMemory.put_step_result``: one Lua call that
   reads the session's plan and writes the hash with the plan's TTL) against the write it
   replaced: gateway clean + MULTI of DEL, HSET, EXPIRE with a TTL from an in-process plan.
3. **Bytes per L1 instance**: :class:`SessionState` (frozen, slots) against a plain
   dataclass with the same fields, 10k instances sharing the same field values, measured
   with ``tracemalloc`` (and ``sys.getsizeof`` of one instance + its ``__dict__``).
4. **Series window**: ZADD + ZREMRANGEBYRANK against LPUSH + LTRIM, both in one MULTI per
   point, keeping a 1,000-point window on the same connection.

Run: ``python -m benchmarks.l2_latency [--iterations N] [--redis-url URL] [--no-valkey]
[--cluster-url redis+cluster://HOST:PORT] [--report PATH]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from benchmarks._common import (
    REPORT,
    markdown_table,
    print_table,
    summarize_ms,
    time_calls,
    write_section,
)

if TYPE_CHECKING:
    from context_core.platform import Platform

REFERENCE_MS = 22.0
TARGET_P99_MS = 1.0
DEFAULT_REDIS = "redis://127.0.0.1:6379/12"  # not the test suite's DB 13


# --------------------------------------------------------------------------------------
# 1. bundle latency
# --------------------------------------------------------------------------------------


def _l2(url: str) -> Platform:
    """L1/L2 on the server at ``url``, wired as everywhere else (no L3, nothing of it opened)."""
    from context_core.config import get_settings
    from context_core.platform import build_platform

    return build_platform(get_settings(redis_url=url), with_knowledge=False)


def _bundle_rows(label: str, url: str, iterations: int) -> list[dict[str, Any]]:
    from context_core.session.state import SessionState

    platform = _l2(url)
    client = platform.redis
    gw = platform.gateway
    sm = platform.wm.session(f"bench-{uuid.uuid4().hex[:10]}")
    try:
        sm.put_step_result(
            "diagnose",
            {
                "status": "ok",
                "device": "pump-0042",
                "readings": [round(4.0 + i / 10, 2) for i in range(20)],
                "summary": "pressure drifts up after each restart; seal suspected",
            },
        )
        params = {"device": "pump-0042", "window": "1h"}
        sm.put_api_response(
            "/v1/telemetry",
            params,
            {"points": [{"t": 1_700_000_000 + i, "p": 4.2} for i in range(30)]},
        )
        step_key = sm.key("step", "diagnose")
        api_key = sm.api_key("/v1/telemetry", params)
        state = {"s": SessionState.start(sm.session_id, "u-bench", "why is pump hot?", gateway=gw)}

        def pipelined() -> None:
            s = state["s"].advance(current_step=state["s"].current_step + 1)
            state["s"] = s
            b = sm.fetch_bundle(["diagnose"], [("/v1/telemetry", params)])
            assert step_key in b and api_key in b

        def two_calls() -> None:
            s = state["s"].advance(current_step=state["s"].current_step + 1)
            state["s"] = s
            sm.get_step_result("diagnose")
            sm.get_api_response("/v1/telemetry", params)

        ping = summarize_ms(time_calls(client.ping, iterations))
        rows = []
        for mode, fn in (("L1 + L2, one pipeline", pipelined), ("L1 + L2, two calls", two_calls)):
            st = summarize_ms(time_calls(fn, iterations))
            rows.append(
                {
                    "server": label,
                    "what": mode,
                    "n": iterations,
                    "p50_ms": st["p50_ms"],
                    "p99_ms": st["p99_ms"],
                    "PING p99_ms (floor)": ping["p99_ms"],
                    "reference_ms": REFERENCE_MS,
                    "reference / p99": REFERENCE_MS / st["p99_ms"],
                    f"p99 <= {TARGET_P99_MS:g} ms": "yes"
                    if st["p99_ms"] <= TARGET_P99_MS
                    else "NO",
                }
            )
        return rows
    finally:
        sm.clear()
        platform.close()


# --------------------------------------------------------------------------------------
# 2. step writes under a stored plan
# --------------------------------------------------------------------------------------


def _write_rows(label: str, url: str, iterations: int) -> list[dict[str, Any]]:
    import json

    from context_core.working_memory import PlannedStep, StepPlan, ttl_from_plan

    platform = _l2(url)
    client = platform.redis
    gw = platform.gateway
    sm = platform.wm.session(f"bench-{uuid.uuid4().hex[:10]}")
    plan = StepPlan.of(PlannedStep("diagnose"), PlannedStep("report", ("diagnose",), 300.0))
    fields = {
        "status": "ok",
        "device": "pump-0042",
        "readings": [round(4.0 + i / 10, 2) for i in range(20)],
        "summary": "pressure drifts up after each restart; seal suspected",
    }
    old_key = sm.key("step", "baseline")
    try:
        applied = time.time()
        sm.apply_plan(plan)

        def multi_in_process_plan() -> None:
            cleaned = gw.clean(fields, where="bench")
            mapping = {
                k: json.dumps(v, sort_keys=True, separators=(",", ":")) for k, v in cleaned.items()
            }
            mapping["_stored_at"] = repr(time.time())
            ttl = ttl_from_plan("diagnose", plan, default_ttl_s=900)
            pipe = client.pipeline(transaction=True)
            pipe.delete(old_key)  # not chained: a cluster pipeline's delete() returns None
            pipe.hset(old_key, mapping=mapping).expire(old_key, ttl)
            pipe.execute()

        def lua_stored_plan() -> None:
            sm.put_step_result("diagnose", fields)

        base = summarize_ms(time_calls(multi_in_process_plan, iterations))
        new = summarize_ms(time_calls(lua_stored_plan, iterations))
        ttl = client.ttl(sm.key("step", "diagnose"))
        # The stored plan ages with the run: the last write got (300 s - elapsed) x 2.
        expected = (300.0 - (time.time() - applied)) * 2
        assert abs(ttl - expected) <= 3, f"step TTL {ttl}, expected ~{expected:.0f} s from the plan"
        return [
            {
                "server": label,
                "write": what,
                "n": iterations,
                "p50_ms": st["p50_ms"],
                "p99_ms": st["p99_ms"],
                "p99 vs baseline": st["p99_ms"] / base["p99_ms"],
            }
            for what, st in (
                ("MULTI DEL+HSET+EXPIRE, in-process plan (baseline)", base),
                ("put_step_result: Lua, plan read from Redis", new),
            )
        ]
    finally:
        sm.clear()
        client.delete(old_key)  # the raw-client baseline key is not in the session index
        platform.close()


# --------------------------------------------------------------------------------------
# 3. bytes per L1 instance
# --------------------------------------------------------------------------------------


def _plain_twin() -> type:
    """A plain (no slots, not frozen) dataclass with exactly SessionState's fields."""
    from context_core.session.state import SessionState

    specs = [
        (f.name, f.type, dataclasses.field(default=None)) for f in dataclasses.fields(SessionState)
    ]
    return dataclasses.make_dataclass("PlainSessionState", specs)


def _traced_bytes(build: Callable[[int], Any], n: int) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        keep = [build(i) for i in range(n)]
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    total = sum(s.size_diff for s in after.compare_to(before, "filename"))
    del keep
    return total / n


def _memory_rows(n: int) -> list[dict[str, Any]]:
    from context_core.gateway.sanitize import Gateway
    from context_core.session.state import SessionState

    gw = Gateway()
    base = SessionState.start("s-mem", "u-mem", "check pump-0042 pressure", gateway=gw)
    base = base.record_tool_call("read_sensor", {"id": "pump-0042"}, call_id="c1")
    base = base.record_tool_result("c1", {"p": 4.2}, status="ok").advance(
        last_device_id="pump-0042"
    )
    plain_cls = _plain_twin()
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(SessionState)}
    plain0 = plain_cls(**values)
    steps = [1000 + i for i in range(n)]  # same int objects for both variants

    slots_b = _traced_bytes(lambda i: base.advance(current_step=steps[i]), n)
    plain_b = _traced_bytes(lambda i: dataclasses.replace(plain0, current_step=steps[i]), n)

    one_plain = dataclasses.replace(plain0, current_step=steps[0])
    plain_get = sys.getsizeof(one_plain) + sys.getsizeof(one_plain.__dict__)
    slots_get = sys.getsizeof(base)
    return [
        {
            "variant": "plain @dataclass (baseline)",
            "getsizeof B (+__dict__)": plain_get,
            "tracemalloc B/instance": plain_b,
            "vs plain": 1.0,
        },
        {
            "variant": "SessionState (frozen, slots)",
            "getsizeof B (+__dict__)": slots_get,
            "tracemalloc B/instance": slots_b,
            "vs plain": slots_b / plain_b,
        },
    ]


# --------------------------------------------------------------------------------------
# 4. series window write cost
# --------------------------------------------------------------------------------------


def _client(url: str, **kwargs: Any) -> Any:
    """A plain client, or a cluster client for ``redis+cluster://`` URLs."""
    from redis.cluster import RedisCluster

    from context_core.redis.connection import split_cluster_url

    plain, cluster = split_cluster_url(url)
    return (
        RedisCluster.from_url(plain, **kwargs) if cluster else redis.Redis.from_url(url, **kwargs)
    )


def _series_rows(label: str, url: str, ops: int, window: int) -> list[dict[str, Any]]:
    client = _client(url, decode_responses=True)
    tag = uuid.uuid4().hex[:10]
    zkey, lkey = f"wm:{{bench-{tag}}}:series:z", f"wm:{{bench-{tag}}}:series:l"
    try:
        pipe = client.pipeline(transaction=False)
        for i in range(window):
            pipe.zadd(zkey, {f"{i}|1.0": i})
            pipe.lpush(lkey, f"{i}|1.0")
        pipe.execute()

        def run(step: Callable[[Any, int], None], batch: int = 1) -> float:
            """ops/s of ``step`` per point; ``batch`` points share one round trip."""
            t0 = time.perf_counter()
            for start in range(window, window + ops, batch):
                p = client.pipeline(transaction=batch == 1)
                for i in range(start, min(start + batch, window + ops)):
                    step(p, i)
                p.execute()
            return ops / (time.perf_counter() - t0)

        def zset(p: Any, i: int) -> None:
            p.zadd(zkey, {f"{i}|1.0": i})
            p.zremrangebyrank(zkey, 0, -(window + 1))

        def lst(p: Any, i: int) -> None:
            p.lpush(lkey, f"{i}|1.0")
            p.ltrim(lkey, 0, window - 1)

        rows = []
        for mode, batch in (("one MULTI per point", 1), ("100 points per round trip", 100)):
            lst_ops = run(lst, batch)
            z_ops = run(zset, batch)
            for what, v in (
                ("LPUSH + LTRIM (baseline)", lst_ops),
                ("ZADD + ZREMRANGEBYRANK", z_ops),
            ):
                rows.append(
                    {
                        "server": label,
                        "mode": mode,
                        "write": what,
                        "window": window,
                        "ops/s": v,
                        "vs LPUSH+LTRIM": v / lst_ops,
                    }
                )
        assert client.zcard(zkey) == window and client.llen(lkey) == window
        return rows
    finally:
        client.delete(zkey, lkey)
        client.close()


# --------------------------------------------------------------------------------------


def _servers(args: argparse.Namespace, stack: list[Any]) -> list[tuple[str, str]]:
    servers: list[tuple[str, str]] = []
    try:
        c = redis.Redis.from_url(args.redis_url, socket_connect_timeout=1.0)
        c.ping()
        info = c.info("server")
        c.close()
        servers.append((f"Redis {info.get('redis_version', '?')} (system)", args.redis_url))
    except redis.RedisError as e:
        print(f"skipping {args.redis_url}: {e}", file=sys.stderr)
    if not args.no_valkey:
        from context_core.config import get_settings
        from context_core.platform import build_platform

        tmp = tempfile.TemporaryDirectory(prefix="bench-valkey-")
        stack.append(tmp)
        valkey = build_platform(
            get_settings(data_dir=Path(tmp.name), redis_url=None), with_knowledge=False
        )
        stack.append(valkey)
        servers.append(("Valkey (embedded)", valkey.provider.url))
    if args.cluster_url:
        try:
            c = _client(args.cluster_url, socket_connect_timeout=1.0)
            info = c.info("server")
            masters = len(c.get_primaries())
            c.close()
            label = f"Redis {info.get('redis_version', '?')} Cluster ({masters} masters)"
            servers.append((label, args.cluster_url))
        except (redis.RedisError, redis.exceptions.RedisClusterException) as e:
            print(f"skipping {args.cluster_url}: {e}", file=sys.stderr)
    return servers


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.l2_latency", description=__doc__)
    ap.add_argument("--iterations", type=int, default=10_000, help="bundle loads per row")
    ap.add_argument("--series-ops", type=int, default=20_000, help="window writes per row")
    ap.add_argument("--instances", type=int, default=10_000, help="L1 instances measured")
    ap.add_argument(
        "--redis-url",
        default=os.environ.get("CTX_BENCH_REDIS_URL", DEFAULT_REDIS),
        help=f"system Redis to measure (default {DEFAULT_REDIS})",
    )
    ap.add_argument("--no-valkey", action="store_true", help="skip the embedded Valkey rows")
    ap.add_argument(
        "--cluster-url",
        default=os.environ.get("CTX_BENCH_CLUSTER_URL"),
        help="also measure this Redis Cluster (redis+cluster://host:port)",
    )
    ap.add_argument(
        "--report", type=Path, default=REPORT, help=f"markdown report to update (default {REPORT})"
    )
    args = ap.parse_args(argv)

    stack: list[Any] = []
    try:
        servers = _servers(args, stack)
        if not servers:
            print("no server to measure", file=sys.stderr)
            return 1
        bundle = [r for label, url in servers for r in _bundle_rows(label, url, args.iterations)]
        writes = [r for label, url in servers for r in _write_rows(label, url, args.iterations)]
        series = [
            r for label, url in servers for r in _series_rows(label, url, args.series_ops, 1000)
        ]
    finally:
        for obj in reversed(stack):
            (obj.close if hasattr(obj, "close") else obj.cleanup)()
    memory = _memory_rows(args.instances)

    print_table("L1 + L2 context bundle load (loopback)", bundle)
    print_table("Step writes under a stored plan", writes)
    print_table("Bytes per L1 instance", memory)
    print_table("Series window writes (1,000 points)", series)
    body = (
        f"Bundle = advance an L1 `SessionState` + read one step-result hash and one API "
        f"response of the session ({args.iterations:,} iterations per row). Baselines: PING on "
        f"the same connection and the reference design's {REFERENCE_MS:g} ms.\n\n"
        + markdown_table(bundle)
        + f"\nStep writes with a plan applied ({args.iterations:,} per row; the output's "
        "TTL comes from the plan, 300 s x 2):\n\n"
        + markdown_table(writes)
        + f"\nBytes per L1 instance ({args.instances:,} instances, same field values, "
        "tracemalloc):\n\n"
        + markdown_table(memory)
        + f"\nSeries window writes, {args.series_ops:,} points per row, same connection:\n\n"
        + markdown_table(series)
    )
    write_section(
        "l2", "L2 working memory: bundle latency, L1 size, series window", body, report=args.report
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
