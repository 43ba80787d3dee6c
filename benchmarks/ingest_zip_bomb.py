"""Peak memory of reading a zip export that holds a 1 GiB page member (a zip bomb).

What is measured: ``read_html_export`` (what ``ctx ingest`` runs over an export, with the
library's default caps: max_page_bytes 5 MiB, max_export_bytes 2 GiB) in a fresh child
process per run, and that child's own peak RSS (``ru_maxrss`` from ``os.wait4`` on its pid: the
per-child figure ``getrusage(RUSAGE_CHILDREN)`` would report, without one child's peak masking
another's). Runs:

1. **Baseline**: a child that imports the reader and reads a normal 2-page zip export.
2. **Bomb, header check**: a zip with the same 2 pages plus one member of 1 GiB of repeated
   HTML (about 1 MB compressed). Its header admits the size, so it is quarantined unread.
3. **Bomb, streamed**: the same zip with the reader told to ignore zip headers (as if they
   lied), so the counted stream alone must stop the member after ``max_page_bytes + 1`` bytes.
4. **``ctx ingest``, normal zip vs bomb zip**: the whole command (torch, the embedding model,
   Qdrant Edge, the refresh into a fresh data dir), as an operator would run it. The model
   dominates its memory; the bomb must add next to nothing on top.

Target: every bomb run peaks below 600 MB (before the bounds, the reader held the whole
member in memory: over 1 GiB).

Run: ``python -m benchmarks.ingest_zip_bomb [--member-mib 1024]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from benchmarks._common import markdown_table, print_table, write_section

TARGET_MB = 600
REPO = Path(__file__).resolve().parents[1]
_PIECE = 1024 * 1024


def _page(title: str, body: str) -> str:
    return (
        f"<!DOCTYPE html><html><head><title>BENCH : {title}</title></head><body>"
        '<div id="breadcrumb-section"><ol id="breadcrumbs"><li><a href="index.html">BENCH</a>'
        f'</li></ol></div><span id="title-text">BENCH : {title}</span>'
        '<div class="page-metadata">Created by <span class="author">Bench</span>, last '
        "modified on Jun 29, 2019</div>"
        f'<div id="main-content" class="wiki-content group">{body}</div></body></html>'
    )


def _build(tmp: Path, member_mib: int) -> tuple[Path, Path]:
    """(baseline zip, bomb zip); the bomb member is written streaming, 1 MiB at a time."""
    pages = {
        "BENCH/Pump-Checks_900000001.html": _page("Pump checks", "<p>Check the seal.</p>"),
        "BENCH/Fan-Belts_900000002.html": _page("Fan belts", "<p>Tension the belt.</p>"),
    }
    baseline = tmp / "baseline.zip"
    with zipfile.ZipFile(baseline, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, html in pages.items():
            zf.writestr(name, html)
    bomb = tmp / "bomb.zip"
    row = b"<tr><td>PUMP-0042</td><td>vibration 2.8 mm/s</td><td>ok</td></tr>\n"
    piece = (row * (_PIECE // len(row) + 1))[:_PIECE]
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, html in pages.items():
            zf.writestr(name, html)
        with zf.open("BENCH/Bomb_900000003.html", "w", force_zip64=True) as member:
            member.write(b'<html><body><div id="main-content" class="wiki-content"><table>')
            for _ in range(member_mib):
                member.write(piece)
    return baseline, bomb


def _child(mode: str, export: str) -> int:
    """Runs in the measured process: read the export, print what came out as JSON."""
    t0 = time.perf_counter()
    from context_core.ingest import archive
    from context_core.ingest.confluence import read_html_export

    largest = 0
    real_read_capped = archive.read_capped

    def counted(stream: Any, limit: int) -> bytes:
        nonlocal largest
        data = real_read_capped(stream, limit)
        largest = max(largest, len(data))
        return data

    archive.read_capped = counted
    if mode == "streamed":
        archive._declared_size = lambda info: None
    results = list(read_html_export(export))
    seconds = time.perf_counter() - t0
    quarantined = [r for r in results if not hasattr(r, "page_id")]
    print(
        json.dumps(
            {
                "pages": len(results) - len(quarantined),
                "quarantined": len(quarantined),
                "reasons": [getattr(q, "reason", "") for q in quarantined],
                "largest_read": largest,
                "seconds": seconds,
                "self_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            }
        )
    )
    return 0


def _run_child(
    name: str, cmd: list[str], tmp: Path, env: dict[str, str] | None = None
) -> tuple[Path, float, float]:
    """Run one child; (stdout path, seconds, peak RSS MB from wait4 on its own pid)."""
    out_path, err_path = tmp / f"{name}.out", tmp / f"{name}.err"
    t0 = time.perf_counter()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=REPO, env=env)
        _pid, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"child {name} failed:\n{err_path.read_text(errors='replace')[-3000:]}")
    return out_path, seconds, usage.ru_maxrss / 1024.0  # KiB on Linux


def _measure(mode: str, export: Path, tmp: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.ingest_zip_bomb", "--child", mode, str(export)]
    out_path, _s, peak = _run_child(mode, cmd, tmp)
    report: dict[str, Any] = json.loads(out_path.read_text().strip().splitlines()[-1])
    report["peak_rss_mb"] = peak
    return report


def _measure_ctx(name: str, export: Path, tmp: Path) -> dict[str, Any]:
    """``ctx ingest EXPORT`` end to end into a fresh data dir; figures from its summary."""
    ctx = Path(sys.executable).with_name("ctx")
    cmd = [str(ctx), "ingest", str(export), "--no-progress", "--collection", "bench_bomb"]
    env = {
        **os.environ,
        "CTX_DATA_DIR": str(tmp / f"{name}-data"),
        "CTX_REPORTS_DIR": str(tmp / f"{name}-reports"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    _out, seconds, peak = _run_child(name, cmd, tmp, env)
    summary = json.loads((tmp / f"{name}-reports" / "ingest_summary.json").read_text())
    return {
        "pages": summary["pages_new"],
        "quarantined": summary["pages_quarantined"],
        "largest_read": None,
        "seconds": seconds,
        "peak_rss_mb": peak,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--member-mib", type=int, default=1024)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "EXPORT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(*args.child)

    tmp = Path(tempfile.mkdtemp(prefix="bench_zip_bomb_"))
    try:
        t0 = time.perf_counter()
        baseline, bomb = _build(tmp, args.member_mib)
        build_s = time.perf_counter() - t0
        bomb_zip_bytes = bomb.stat().st_size
        runs = [
            ("baseline: import + normal 2-page zip", "header", baseline),
            ("bomb zip, header check", "header", bomb),
            ("bomb zip, headers ignored (streamed)", "streamed", bomb),
        ]
        measured = [(label, _measure(mode, path, tmp)) for label, mode, path in runs]
        ctx_runs = [
            ("`ctx ingest` normal 2-page zip", _measure_ctx("ctx-baseline", baseline, tmp)),
            ("`ctx ingest` bomb zip", _measure_ctx("ctx-bomb", bomb, tmp)),
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    children_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0

    rows: list[dict[str, Any]] = []
    for group in (measured, ctx_runs):
        base_mb = group[0][1]["peak_rss_mb"]
        for label, r in group:
            rows.append(
                {
                    "run": label,
                    "pages": r["pages"],
                    "quarantined": r["quarantined"],
                    "largest read (bytes)": r["largest_read"] if r["largest_read"] else "-",
                    "seconds": r["seconds"],
                    "peak RSS MB": r["peak_rss_mb"],
                    "vs its baseline": f"{r['peak_rss_mb'] / base_mb:.2f}x",
                }
            )
    base_mb = measured[0][1]["peak_rss_mb"]
    worst = max(r["peak_rss_mb"] for _, r in measured[1:])
    ctx_bomb, ctx_base = ctx_runs[1][1]["peak_rss_mb"], ctx_runs[0][1]["peak_rss_mb"]
    verdict = (
        f"bomb member {args.member_mib} MiB uncompressed in a {bomb_zip_bytes / 1e6:.1f} MB zip "
        f"(built in {build_s:.1f} s); worst bomb peak RSS {worst:,.0f} MB vs baseline "
        f"{base_mb:,.0f} MB ({'meets' if worst < TARGET_MB else 'misses'} the < {TARGET_MB} MB "
        f"target); max over all children (RUSAGE_CHILDREN) {children_peak:,.0f} MB. "
        f"`ctx ingest` of the bomb zip peaks at {ctx_bomb:,.0f} MB vs {ctx_base:,.0f} MB for the "
        f"normal zip ({'meets' if ctx_bomb < TARGET_MB else 'misses'} the < {TARGET_MB} MB "
        "target; the embedding model is most of both). "
        f"Quarantine reasons: {measured[1][1]['reasons']} / {measured[2][1]['reasons']}"
    )
    print_table("Zip-bomb export: peak RSS of the reading child", rows)
    print(verdict)
    body = (
        "Each run is a fresh child process: `read_html_export` over a zip (default caps), or "
        "the whole `ctx ingest` command into a fresh data dir; peak RSS is that child's "
        "`ru_maxrss`. `python -m benchmarks.ingest_zip_bomb`"
        "\n\n" + markdown_table(rows) + "\n" + verdict + "\n"
    )
    write_section("ingest_zip_bomb", "Zip-bomb export: bounded reading (1 GiB member)", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
