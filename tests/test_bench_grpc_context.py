"""benchmarks/grpc_context.py: the round-robin timing. (The whole benchmark at a tiny N takes
~40 s on 2 cores, two ingests of the sample export and a service start, so it is left to
`python -m benchmarks.grpc_context`, which checks itself that the three paths answer the same
fragments before timing.)"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/ is a directory of scripts, not an installed package (see test_bench_service_capacity)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import grpc_context as gc


def test_interleaved_calls_each_path_once_per_round() -> None:
    calls: list[str] = []
    fns = [lambda name=name: calls.append(name) for name in ("lib", "http", "grpc")]
    samples = gc._interleaved(fns, 4, warmup=1)
    assert calls == ["lib", "http", "grpc"] * 5  # one warm-up round, then 4 timed rounds
    assert [len(s) for s in samples] == [4, 4, 4]
    assert all(ms >= 0 for s in samples for ms in s)
