"""Shared helpers for benchmark scripts: percentiles, a table printer, and section-wise
updates of ``reports/benchmarks.md`` (each script owns one section, delimited by markers,
so scripts can run alone without clobbering each other's figures).

This machine is shared and noisy: every figure should come with a baseline measured in the
same run, and the table should quote the ratio.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPORT = Path(__file__).resolve().parents[1] / "reports" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\n"
    "Written by `make bench` (`python -m benchmarks`); each section by its own script in "
    "`benchmarks/`.\nEvery figure has a baseline measured in the same run: read the ratios, "
    "the machine is shared and noisy.\n"
)


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``samples``."""
    if not samples:
        raise ValueError("percentile of an empty sample")
    s = sorted(samples)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


def time_calls(fn: Callable[[], Any], n: int, warmup: int = 50) -> list[float]:
    """Run ``fn`` ``n`` times and return per-call latencies in milliseconds."""
    for _ in range(warmup):
        fn()
    out = []
    pc = time.perf_counter
    for _ in range(n):
        t0 = pc()
        fn()
        out.append((pc() - t0) * 1000.0)
    return out


def summarize_ms(samples: Sequence[float]) -> dict[str, float]:
    return {
        "p50_ms": statistics.median(samples),
        "p99_ms": percentile(samples, 99),
        "mean_ms": statistics.fmean(samples),
        "n": len(samples),
    }


def fmt(v: Any) -> str:
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.4f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "_no rows_\n"
    cols: list[str] = []
    for r in rows:
        for c in r:
            if c not in cols:
                cols.append(c)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines) + "\n"


#: CPU features that move the figures most (int8 and fp32 matrix kernels), widest first.
_ISA_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni", "avx512f", "avx2")


def cpu_line(cpuinfo: str | None = None) -> str:
    """The CPU's model name and the widest matrix features it has, from ``/proc/cpuinfo``
    (e.g. "AMD EPYC, avx2"): the int8 encoder runs several times faster with VNNI or AMX,
    so sections measured on different machines are only comparable with this. Empty where
    the file is absent (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
    model, flags = "", set[str]()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "model name" and not model:
            model = " ".join(value.split())
        elif name.strip() == "flags" and not flags:
            flags = set(value.split())
    isa = "/".join(f for f in _ISA_FLAGS if f in flags) or "no avx2"
    return f"{model or 'unknown CPU'}, {isa}"


def machine_line() -> str:
    cpu = cpu_line()
    return (
        f"{platform.processor() or platform.machine()}"
        + (f" ({cpu})" if cpu else "")
        + f", {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC"
    )


def write_section(key: str, title: str, body_md: str, report: Path = REPORT) -> None:
    """Replace (or append) the section ``key`` in ``reports/benchmarks.md``."""
    report.parent.mkdir(parents=True, exist_ok=True)
    text = report.read_text(encoding="utf-8") if report.exists() else HEADER
    start, end = f"<!-- bench:{key} -->", f"<!-- /bench:{key} -->"
    section = f"{start}\n## {title}\n\n_{machine_line()}_\n\n{body_md.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section, text)
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    report.write_text(text, encoding="utf-8")


def print_table(title: str, rows: Sequence[dict[str, Any]]) -> None:
    print(f"\n{title}\n")
    print(markdown_table(rows))
