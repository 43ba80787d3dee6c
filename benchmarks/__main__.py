"""Run every benchmark script in turn (each writes its own section of reports/benchmarks.md)."""

from __future__ import annotations

import importlib
import sys

SCRIPTS = [
    "l2_latency",
    "l3_search",
    "route_latency",
    "delta_recall",
    "grpc_context",
    "ingest_throughput",
    "ingest_zip_bomb",
    "service_capacity",
    "loadtest_profiles",
    "redaction",
    "output_sanitizer",
]


def main(argv: list[str]) -> int:
    chosen = argv or SCRIPTS
    for name in chosen:
        if name not in SCRIPTS:
            print(f"unknown benchmark {name!r}; choose from {', '.join(SCRIPTS)}", file=sys.stderr)
            return 2
    for name in chosen:
        print(f"=== benchmarks.{name}")
        importlib.import_module(f"benchmarks.{name}").main([])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
