"""L3 search at 100k chunks in Qdrant Edge, against the reference design's key lookup by vector.

What is measured, all in one run on the same 100k records:

1. **Filtered top-3 search** (the router's L3 call): HNSW built (checked via the shard's
   ``indexed_vectors_count``), filter ``section == <one of 20>``, 1,000 queries near stored
   points. Target p99 <= 5 ms. Recall@3 against numpy exact cosine over the section is
   reported so speed is not bought with wrong answers.
2. **Exact-key lookups, two ways**: the reference design fetches a record by searching for its
   own vector. Here that is a Qdrant Edge ``exact=True`` search (brute force over all 100k
   original vectors, no HNSW, no filter, limit 1; the answer is checked to be the key), and, as
   an extra row, the same lookup through HNSW. The baseline: an L2 ``GET`` of the same record
   by key (JSON payload, decoded) on Redis. Target KV/vector-full-scan ratio >= 50x.
3. **Memory** of the 100k collection: process RSS growth from before the collection is
   created to after it is built and indexed, and its size on disk.

Vectors are random but clustered (200 centres, noise around each), 384-d like MiniLM; each
cluster belongs to one of 20 sections, so a section filter keeps ~5% of the points.

Run: ``python -m benchmarks.l3_search [--points 100000] [--queries 1000] [--scan-queries 200]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import redis

from benchmarks._common import (
    markdown_table,
    percentile,
    print_table,
    summarize_ms,
    write_section,
)

DEFAULT_REDIS = "redis://127.0.0.1:6379/12"  # not the test suite's DB 13
TARGET_P99_MS = 5.0
TARGET_RATIO = 50.0
COLLECTION = "bench_l3"


def _dataset(n: int, dim: int, sections: int, seed: int) -> tuple[np.ndarray, list[dict[str, Any]]]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(200, dim)).astype(np.float32)
    cluster = rng.integers(0, len(centres), size=n)
    vecs = centres[cluster] + 0.35 * rng.normal(size=(n, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    payloads = [
        {
            "source": f"doc-{i // 8:05d}",
            "chunk_index": i % 8,
            "section": f"S{int(cluster[i]) % sections:02d}",
            "title": f"Document {i // 8}",
            "text": f"chunk {i} of a synthetic manual page about cluster {int(cluster[i])}",
            "updated_at_ts": 1.7e9 + i,
        }
        for i in range(n)
    ]
    return vecs, payloads


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def _redis_client(url: str | None, tmp: Path) -> tuple[redis.Redis, str, Any]:
    """System Redis when reachable (or the URL given), else an embedded Valkey."""
    candidates = [url] if url else [DEFAULT_REDIS]
    for u in candidates:
        try:
            c = redis.Redis.from_url(u, socket_connect_timeout=1.0)
            c.ping()
            return c, u, None
        except (redis.RedisError, OSError):
            if url:
                raise
    from context_core.config import get_settings
    from context_core.redis.connection import RedisProvider

    provider = RedisProvider(get_settings(data_dir=tmp / "valkey", redis_url=None))
    return provider.client(decode_responses=False), f"embedded Valkey {provider.safe_url}", provider


def _build(
    store: Any, vecs: np.ndarray, payloads: list[dict[str, Any]], ids: list[str]
) -> tuple[float, float, Any]:
    """Create the collection, upsert every point, build HNSW: (upsert s, optimize s, status)."""
    from rich.progress import Progress

    from context_core.knowledge.store import PointRecord

    store.create_collection(COLLECTION, dim=vecs.shape[1], model="bench-random")
    t0 = time.perf_counter()
    batch = 2_000
    with Progress(transient=True) as bar:
        task = bar.add_task("upsert", total=len(ids))
        for s in range(0, len(ids), batch):
            e = min(len(ids), s + batch)
            store.upsert(
                COLLECTION, [PointRecord(ids[i], vecs[i], payloads[i]) for i in range(s, e)]
            )
            bar.update(task, advance=e - s)
    upsert_s = time.perf_counter() - t0
    print(f"upserted in {upsert_s:.1f} s; building HNSW (optimize) ...", flush=True)
    t0 = time.perf_counter()
    status = store.optimize(COLLECTION)
    return upsert_s, time.perf_counter() - t0, status


BUILD_FORMAT = 1  # bump when _dataset or the ids change: old cached builds stop matching


def _build_params(args: argparse.Namespace) -> dict[str, Any]:
    """Everything the built collection depends on; its hash names the cache entry."""
    from importlib.metadata import version

    from context_core.knowledge import edge

    return {
        "format": BUILD_FORMAT,
        "points": args.points,
        "dim": args.dim,
        "sections": args.sections,
        "seed": args.seed,
        "vectors_on_disk": bool(args.vectors_on_disk),
        "hnsw_m": args.hnsw_m if args.hnsw_m is not None else edge.HNSW_M,
        "hnsw_ef_construct": (
            args.ef_construct if args.ef_construct is not None else edge.HNSW_EF_CONSTRUCT
        ),
        "qdrant_edge": version("qdrant-edge-py"),
    }


def _cached_collection(
    args: argparse.Namespace,
    vecs: np.ndarray,
    payloads: list[dict[str, Any]],
    ids: list[str],
    rss0: float,
) -> tuple[Path, dict[str, Any]]:
    """The built collection for these parameters: reused from the cache when its manifest
    matches, else built in a private directory and renamed into place (a run killed halfway
    leaves only a ``.building-*`` directory that the next build ignores, and two runs building
    the same entry at once both finish: the second rename loses and its copy is removed)."""
    import hashlib
    import resource

    from context_core.fsutil import atomic_write_text
    from context_core.knowledge.edge import EdgeStore

    params = _build_params(args)
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    final = args.cache_dir.expanduser().resolve() / f"l3-{args.points}-{key}"
    manifest_path = final / "manifest.json"
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("params") == params:
            print(f"reusing the built collection {final} (manifest matches)", flush=True)
            return final / "qdrant", {**manifest, "reused": True}
        print(f"{manifest_path} does not match these parameters: rebuilding", flush=True)
        shutil.rmtree(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{final.name}.building-", dir=final.parent))
    try:
        with EdgeStore(
            work / "qdrant",
            search_threads=args.search_threads,
            on_disk=args.vectors_on_disk,
            hnsw_m=params["hnsw_m"],
            ef_construct=params["hnsw_ef_construct"],
        ) as store:
            upsert_s, optimize_s, status = _build(store, vecs, payloads, ids)
            rss_growth = _rss_mb() - rss0
        manifest = {
            "params": params,
            "key": key,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "upsert_s": round(upsert_s, 1),
            "optimize_s": round(optimize_s, 1),
            "build_rss_growth_mb": round(rss_growth),
            # ru_maxrss is in KiB on Linux: the whole process, data set included
            "build_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "points": status.points,
            "indexed_vectors": status.indexed_vectors,
            "segments": status.segments,
        }
        atomic_write_text(work / "manifest.json", json.dumps(manifest, indent=2) + "\n")
        try:
            work.rename(final)
        except OSError:  # another run renamed its build into place first: use that one
            shutil.rmtree(work, ignore_errors=True)
            manifest = json.loads(manifest_path.read_text())
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    print(f"built and cached under {final}", flush=True)
    return final / "qdrant", {**manifest, "reused": False}


WARMUP = 30  # searches run before the timing starts


def _warm(n: int, warmup: int = WARMUP) -> int:
    """The warm-up of a run of ``n``: at most its first half, so something is always timed."""
    return min(warmup, n // 2)


def _timed(fn: Any, args: list[Any], warmup: int = WARMUP) -> list[float]:
    """Times ``fn`` over ``args[warmup:]`` after running it on ``args[:warmup]``: the warm-up
    arguments are not timed again (Edge keeps recent answers, so they would be cache hits).
    A short run warms up on its first half at most (:func:`_warm`)."""
    warmup = _warm(len(args), warmup)
    for a in args[:warmup]:
        fn(a)
    out = []
    pc = time.perf_counter
    for a in args[warmup:]:
        t0 = pc()
        fn(a)
        out.append((pc() - t0) * 1000.0)
    return out


def _parse_sweep(spec: str) -> list[tuple[int | None, float | None]]:
    """``"64:2,128:3"`` -> ``[(64, 2.0), (128, 3.0)]``; a bad item names itself."""
    out: list[tuple[int | None, float | None]] = []
    for item in filter(None, (p.strip() for p in spec.split(","))):
        ef, _, over = item.partition(":")
        try:
            out.append((int(ef), float(over) if over else None))
        except ValueError:
            raise SystemExit(
                f"--sweep: {item!r} is not EF:OVERSAMPLING (e.g. 128:2); "
                "EF an integer, OVERSAMPLING a number"
            ) from None
    return out


def _exact_top3(
    queries: list[tuple[list[float], str]],
    vecs: np.ndarray,
    sections: np.ndarray,
    ids: list[str],
) -> dict[int, set[str]]:
    """The exact top 3 (numpy, within the query's section) of the 200 queries after the
    warm-up: what recall@3 is measured against, for the timed pass and the sweep alike."""
    warm = _warm(len(queries))
    truth = {}
    for j in range(warm, min(warm + 200, len(queries))):
        idx = np.flatnonzero(sections == queries[j][1])
        qv = np.asarray(queries[j][0], dtype=np.float32)
        truth[j] = {ids[i] for i in idx[np.argsort(-(vecs[idx] @ qv))[:3]]}
    return truth


def _recall(truth: dict[int, set[str]], found: dict[int, list[str]]) -> float:
    return float(np.mean([len(truth[j] & set(found[j])) / 3 for j in truth]))


def _sweep(
    store: Any,
    args: argparse.Namespace,
    queries: list[tuple[list[float], str]],
    truth: dict[int, set[str]],
) -> list[dict[str, Any]]:
    """p50/p99/recall@3 of the filtered search per ``--sweep`` setting plus the run's own,
    timed interleaved so that every setting sees the same machine load (in a rotating order,
    so that none is always the one that pays a query's first page faults).

    Interleaved over *different* queries: at step ``t`` setting ``k`` searches query
    ``(t + k * n / K) % n``, so every setting searches every query once, but never right after
    another setting searched the same one. (Searching one query under every setting back to
    back made all but the first run on CPU caches warmed by the first: ef 512 read p99 4.8 ms
    there against 6.2 ms alone, in one run.)"""
    from context_core.knowledge.store import SearchQuery

    settings = [(args.hnsw_ef, args.oversampling), *_parse_sweep(args.sweep)]
    if len(settings) == 1:
        return []
    times: list[list[float]] = [[] for _ in settings]
    found: list[dict[int, list[str]]] = [{} for _ in settings]
    store._changed(COLLECTION)  # no answer the timed pass cached may answer a sweep search
    n, n_set = len(queries), len(settings)
    stride = max(1, n // n_set)
    warm = _warm(n)  # warm-up steps are not timed (Edge keeps answers)
    for t in range(n):
        # the order rotates step by step: the first search after a pause pays page faults
        # (vectors on disk) and would make whichever setting comes first look slower
        for k in [(t + i) % n_set for i in range(n_set)]:
            j = (t + k * stride) % n  # each setting its own query (see above)
            q, sec = queries[j]
            ef, over = settings[k]
            store.hnsw_ef, store.oversampling = ef, over
            t0 = time.perf_counter()
            hits = store.search(q, SearchQuery(COLLECTION, 3, filter={"section": sec}))
            if t >= warm:
                times[k].append((time.perf_counter() - t0) * 1000)
            found[k][j] = [h.id for h in hits]
    store.hnsw_ef, store.oversampling = args.hnsw_ef, args.oversampling
    rows = []
    for k, (ef, over) in enumerate(settings):
        summ = summarize_ms(times[k])
        rec = _recall(truth, found[k])
        rows.append(
            {
                "hnsw_ef": ef or "default",
                "oversampling": f"{over:g}" if over else "default",
                "n": summ["n"],
                "p50 ms": summ["p50_ms"],
                "p99 ms": summ["p99_ms"],
                "recall@3": f"{rec:.3f}",
                "p99 target met": "yes" if summ["p99_ms"] <= TARGET_P99_MS else "NO",
                "recall >= 0.99": "yes" if rec >= 0.99 else "NO",
            }
        )
    print_table("L3 filtered search: settings sweep (interleaved)", rows)
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.l3_search",
        description="Filtered top-3 L3 search on Qdrant Edge at 100k points, vs exact-key "
        "lookups by vector full scan and by Redis GET; writes reports/benchmarks.md (l3).",
    )
    ap.add_argument("--points", type=int, default=100_000, help="collection size")
    ap.add_argument("--queries", type=int, default=1_000, help="filtered searches to time")
    ap.add_argument(
        "--scan-queries", type=int, default=200, help="key lookups done by full-scan search"
    )
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--sections", type=int, default=20)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--redis-url", default=None, help=f"default {DEFAULT_REDIS}, else Valkey")
    ap.add_argument(
        "--search-threads",
        type=int,
        default=None,
        help="Edge search pool size per shard (default: one per CPU)",
    )
    ap.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("CTX_BENCH_CACHE", "~/.cache/context-platform/bench")),
        help="built collections are kept here, one per set of build parameters, with a "
        "manifest, and reused by the next run (default $CTX_BENCH_CACHE or "
        "~/.cache/context-platform/bench; keep it outside the repo)",
    )
    ap.add_argument(
        "--hnsw-ef", type=int, default=None, help="search beam width (default: the engine's)"
    )
    ap.add_argument(
        "--hnsw-m",
        type=int,
        default=None,
        help="graph links per node of the build (default: the store's HNSW_M, 32); part of "
        "the cached build's identity",
    )
    ap.add_argument(
        "--ef-construct",
        type=int,
        default=None,
        help="build beam width (default: the store's HNSW_EF_CONSTRUCT, 128); part of the "
        "cached build's identity. Build time grows about linearly with it",
    )
    ap.add_argument(
        "--oversampling",
        type=float,
        default=None,
        help="int8 candidates per wanted hit before float rescoring (default QUANT_OVERSAMPLING)",
    )
    ap.add_argument(
        "--sweep",
        default="",
        metavar="EF:OVERSAMPLING,...",
        help="also time these search settings on the same collection, interleaved query by "
        "query with the run's own setting (e.g. 64:2,128:2,256:3); each gets a p50/p99 and "
        "recall@3 row",
    )
    ap.add_argument("--no-cache", action="store_true", help="build in a temp dir, keep nothing")
    ap.add_argument(
        "--vectors-on-disk",
        action="store_true",
        help="original vectors and payloads memory-mapped from disk (int8 copies stay in RAM)",
    )
    ap.add_argument(
        "--kv-points",
        type=int,
        default=100_000,
        help="records loaded into Redis for the key-lookup baseline (at most --points)",
    )
    ap.add_argument("--no-write", action="store_true", help="print only, leave the report")
    args = ap.parse_args(argv)

    from context_core.knowledge.edge import EdgeStore
    from context_core.knowledge.store import SearchQuery, point_id

    tmp = Path(tempfile.mkdtemp(prefix="bench-l3-"))
    provider = None
    rclient = None
    kv_prefix = f"bench:l3:{uuid.uuid4().hex[:8]}:"
    try:
        print(f"generating {args.points:,} clustered {args.dim}-d vectors ...", flush=True)
        vecs, payloads = _dataset(args.points, args.dim, args.sections, args.seed)
        ids = [point_id(p["source"], p["chunk_index"]) for p in payloads]
        sections = np.array([p["section"] for p in payloads])
        gc.collect()
        rss0 = _rss_mb()

        if args.no_cache:
            root, manifest = tmp / "qdrant", None
            store = EdgeStore(
                root,
                search_threads=args.search_threads,
                on_disk=args.vectors_on_disk,
                hnsw_ef=args.hnsw_ef,
                oversampling=args.oversampling,
            )
            upsert_s, optimize_s, status = _build(store, vecs, payloads, ids)
            build_rss_mb = _rss_mb() - rss0
        else:
            root, manifest = _cached_collection(args, vecs, payloads, ids, rss0)
            upsert_s, optimize_s = manifest["upsert_s"], manifest["optimize_s"]
            build_rss_mb = manifest["build_rss_growth_mb"]
            store = EdgeStore(
                root,
                search_threads=args.search_threads,
                on_disk=args.vectors_on_disk,
                hnsw_ef=args.hnsw_ef,
                oversampling=args.oversampling,
            )
            status = store.index_status(COLLECTION)
        reused = manifest is not None and manifest.get("reused", False)
        gc.collect()
        rss1 = _rss_mb()
        coll_dir = root / COLLECTION
        disk_mb, wal_mb = _dir_mb(coll_dir), _dir_mb(coll_dir / "wal")
        print(
            f"optimize {optimize_s:.1f} s: points={status.points:,} "
            f"indexed_vectors={status.indexed_vectors:,} segments={status.segments}",
            flush=True,
        )
        if status.indexed_vectors < 0.95 * status.points:
            print("WARNING: HNSW covers less than 95% of the points", flush=True)

        # --- 1. filtered top-3 -----------------------------------------------------------
        rng = np.random.default_rng(args.seed + 1)
        picks = rng.integers(0, args.points, size=args.queries)
        qvecs = vecs[picks] + 0.05 * rng.normal(size=(args.queries, args.dim)).astype(np.float32)
        qvecs /= np.linalg.norm(qvecs, axis=1, keepdims=True)
        queries = [(qvecs[j].tolist(), str(sections[picks[j]])) for j in range(args.queries)]
        results: dict[int, list[str]] = {}

        def filtered(j: int) -> None:
            q, sec = queries[j]
            found = store.search(q, SearchQuery(COLLECTION, 3, filter={"section": sec}))
            results[j] = [h.id for h in found]

        # A freshly opened shard maps its graph and vector pages in as searches first reach
        # them (a minor fault per page): the first search of a neighbourhood costs ~0.8 ms
        # more at p50 on 1M points. The first pass over the queries is that cold start,
        # timed apart; then the answers it cached are dropped and the same queries are timed
        # again (each a thousand searches after its first: CPU caches long cold, only the
        # mappings left), the steady state of a serving process.
        cold_ms = _timed(filtered, list(range(args.queries)), warmup=0)
        store._changed(COLLECTION)
        print(f"timing {args.queries:,} filtered top-3 searches ...", flush=True)
        search_ms = _timed(filtered, list(range(args.queries)))
        rss2 = _rss_mb()
        truth = _exact_top3(queries, vecs, sections, ids)  # the timed ones (not the warm-up)
        recall = _recall(truth, results)

        sweep_rows = _sweep(store, args, queries, truth)

        # --- 2. exact-key lookups: KV vs vector ------------------------------------------
        rclient, kv_where, provider = _redis_client(args.redis_url, tmp)
        kv_points = min(args.kv_points, args.points)
        print(f"loading {kv_points:,} records into {kv_where} ...", flush=True)
        pipe = rclient.pipeline(transaction=False)
        for i in range(kv_points):
            pipe.set(kv_prefix + ids[i], json.dumps(payloads[i]))
            if i % 5_000 == 4_999:
                pipe.execute()
        pipe.execute()

        keys = [int(k) for k in rng.integers(0, kv_points, size=args.queries)]
        key_vecs = {k: vecs[k].tolist() for k in keys}

        def kv_get(k: int) -> None:
            raw = rclient.get(kv_prefix + ids[k])
            assert raw is not None and json.loads(raw)["chunk_index"] == payloads[k]["chunk_index"]

        def full_scan(k: int) -> None:
            hit = store.search(key_vecs[k], SearchQuery(COLLECTION, 1, exact=True))
            assert hit[0].id == ids[k], "full-scan lookup returned the wrong record"

        def hnsw_lookup(k: int) -> None:
            store.search(key_vecs[k], SearchQuery(COLLECTION, 1))

        print("timing key lookups: Redis GET, HNSW, full scan ...", flush=True)
        kv_ms = _timed(kv_get, keys)
        hnsw_ms = _timed(hnsw_lookup, keys)
        scan_ms = _timed(full_scan, keys[: args.scan_queries], warmup=5)

        s_search, s_kv = summarize_ms(search_ms), summarize_ms(kv_ms)
        s_scan, s_hnsw = summarize_ms(scan_ms), summarize_ms(hnsw_ms)
        rows = [
            {
                "operation": "L3 filtered top-3 (HNSW, section filter)",
                "n": s_search["n"],
                "p50 ms": s_search["p50_ms"],
                "p95 ms": percentile(search_ms, 95),
                "p99 ms": s_search["p99_ms"],
                "target": f"p99 <= {TARGET_P99_MS} ms",
                "met": "yes" if s_search["p99_ms"] <= TARGET_P99_MS else "NO",
            },
            {
                "operation": f"key lookup: L2 GET ({'Redis' if provider is None else 'Valkey'})",
                "n": s_kv["n"],
                "p50 ms": s_kv["p50_ms"],
                "p95 ms": percentile(kv_ms, 95),
                "p99 ms": s_kv["p99_ms"],
                "target": "baseline",
                "met": "",
            },
            {
                "operation": "key lookup: vector search, full scan (exact=True)",
                "n": s_scan["n"],
                "p50 ms": s_scan["p50_ms"],
                "p95 ms": percentile(scan_ms, 95),
                "p99 ms": s_scan["p99_ms"],
                "target": f"KV >= {TARGET_RATIO:.0f}x faster",
                "met": "yes" if s_scan["p50_ms"] / s_kv["p50_ms"] >= TARGET_RATIO else "NO",
            },
            {
                "operation": "key lookup: vector search, HNSW",
                "n": s_hnsw["n"],
                "p50 ms": s_hnsw["p50_ms"],
                "p95 ms": percentile(hnsw_ms, 95),
                "p99 ms": s_hnsw["p99_ms"],
                "target": "(extra)",
                "met": "",
            },
        ]
        ratio_p50 = s_scan["p50_ms"] / s_kv["p50_ms"]
        ratio_p99 = s_scan["p99_ms"] / s_kv["p99_ms"]
        ratio_hnsw = s_hnsw["p50_ms"] / s_kv["p50_ms"]
        load1, load5, _ = os.getloadavg()
        facts = [
            {
                "figure": "machine load average (1 / 5 min) at the end of the run",
                "value": f"{load1:.1f} / {load5:.1f} on {os.cpu_count()} CPUs (shared)",
            },
            {
                "figure": "cold start: the first pass of the same queries on the freshly "
                "opened shard (its pages mapped in as searches reach them)",
                "value": "p50 {p50_ms:.2f} ms / p99 {p99_ms:.2f} ms".format(
                    **summarize_ms(cold_ms)
                ),
            },
            {
                "figure": "points / dim / sections",
                "value": f"{args.points:,} / {args.dim} / {args.sections}",
            },
            {
                "figure": "HNSW indexed vectors (ShardInfo)",
                "value": f"{status.indexed_vectors:,}"
                f" of {status.points:,} in {status.segments} segment(s)",
            },
            {
                "figure": "upsert time / HNSW build (optimize) time",
                "value": f"{upsert_s:.1f} s / {optimize_s:.1f} s"
                + (f" (cached build of {manifest['built_at']}, reused)" if reused else ""),
            },
            {
                "figure": "recall@3 vs numpy exact (the first 200 timed filtered queries; "
                f"hnsw_ef {args.hnsw_ef or 'default'}, oversampling "
                f"{args.oversampling or 'default'})",
                "value": f"{recall:.3f}",
            },
            {
                "figure": "KV vs vector full scan, p50 ratio (p99 ratio)",
                "value": f"{ratio_p50:,.0f}x ({ratio_p99:,.0f}x)",
            },
            {"figure": "KV vs vector HNSW lookup, p50 ratio", "value": f"{ratio_hnsw:,.0f}x"},
            {
                "figure": "RSS growth for the collection (opened, before any search)",
                "value": f"{rss1 - rss0:,.0f} MB",
            },
            {
                "figure": "RSS growth after the filtered searches",
                "value": f"{rss2 - rss0:,.0f} MB",
            },
            {
                "figure": "build: RSS growth / peak process RSS (data set included)",
                "value": f"{build_rss_mb:,.0f} MB / "
                + (f"{manifest['build_peak_rss_mb']:,} MB" if manifest else "n/a"),
            },
            {
                "figure": "collection on disk",
                "value": f"{disk_mb:,.0f} MB (of which WAL {wal_mb:,.0f} MB)",
            },
            {"figure": "raw float32 vectors, for scale", "value": f"{vecs.nbytes / 2**20:,.0f} MB"},
        ]
        print_table("L3 search and key-lookup latency", rows)
        print_table("L3 collection facts", facts)
        built = _build_params(args)
        body = (
            f"Qdrant Edge (in-process), HNSW m={built['hnsw_m']} ef_construct="
            f"{built['hnsw_ef_construct']}, int8 scalar quantisation in "
            "RAM, payload index on `section`. Filtered search = `KnowledgeMemory`'s L3 call "
            "(top-3, `section == S<k>`, ~5% of points). Key lookup baseline = the reference "
            "design fetching a record by searching for its own vector with a full scan "
            "(`exact=True`: brute force over all original vectors), vs an L2 `GET` + JSON "
            f"decode of the same record by key ({kv_where.split('?')[0]}).\n\n"
            + markdown_table(rows)
            + "\n"
            + markdown_table(facts)
            + (
                "\nSearch settings timed interleaved in the same run (each setting searches "
                "every query once, never right after another setting searched the same one; "
                "recall@3 over 200 queries against numpy exact search in the query's "
                "section):\n\n" + markdown_table(sweep_rows)
                if sweep_rows
                else ""
            )
            + "\np99 on this shared machine is dominated by scheduling stalls: compare it with "
            "the p99 of the Redis GET baseline (a ~0.05 ms operation) in the same run.\n"
            + f"\nRun: `python -m benchmarks.l3_search --points {args.points} "
            f"--queries {args.queries} --scan-queries {args.scan_queries}"
            + (" --vectors-on-disk" if args.vectors_on_disk else "")
            + (f" --hnsw-ef {args.hnsw_ef}" if args.hnsw_ef else "")
            + (f" --oversampling {args.oversampling:g}" if args.oversampling else "")
            + (f" --hnsw-m {args.hnsw_m}" if args.hnsw_m else "")
            + (f" --ef-construct {args.ef_construct}" if args.ef_construct else "")
            + (f" --sweep {args.sweep}" if args.sweep else "")
            + "`\n"
        )
        if not args.no_write:
            key = "l3" if args.points == 100_000 else f"l3-{args.points}"
            write_section(key, f"L3 search: Qdrant Edge, {args.points:,} x {args.dim}-d", body)
        store.close()
    finally:
        if rclient is not None:
            batch = list(rclient.scan_iter(match=kv_prefix + "*", count=5_000))
            for s in range(0, len(batch), 5_000):
                rclient.delete(*batch[s : s + 5_000])
            if provider is None:
                rclient.close()
        if provider is not None:
            provider.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
