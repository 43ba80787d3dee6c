"""Knowledge-refresh throughput on the real DLX export, against raw fp32 ``model.encode``.

What is measured, all in one run on the same export and the same chunk texts, each measure
in its own fresh child process (so each peak RSS is that measure's alone):

1. **Baseline: raw fp32 encode** of exactly the chunk texts a run stores (taken from a dry
   plan in the parent), one ``SentenceTransformer.encode`` call (batch size
   ``CTX_EMBED_BATCH_SIZE``), timed before the pipeline runs and again after them
   (``--raw-runs 2``, the default), averaged: this brackets the pipelines against the shared
   machine's drift.
2. **The refresh, end to end** (``run_refresh`` into a fresh Qdrant Edge store: parse, chunk,
   GX validation, embed, upsert, HNSW build) with the encoder backend under test
   (``--backend``, default ``onnx-int8``: length-bucketed batches, tokenisation and BM25 on a
   helper thread), then the same export again unchanged (nothing to embed). Targets:
   chunks/s >= 2.5 x the raw fp32 baseline; the re-run <= 5 % of the first run. The stored
   texts are checked against the plan's.
3. **Today's refresh** (``--compare-backend``, default ``torch``, the fp32 path): the same
   end-to-end run, for the side-by-side chunks/s and peak RSS (target: the backend under test
   peaks no higher).
4. **Where the ONNX encoder's time goes** (an ONNX backend under test only): ONNX Runtime's
   profiler on one batch of the median token length, summed by operator type, and the
   multiply-add rate of the FFN's product shape as int8 (``DynamicQuantizeMatMul``) and as
   fp32 ``MatMul`` on this CPU: the ceiling of what int8 weights can buy here.

Models are loaded (and warmed up, the ONNX export made if missing) before any timing: loading
is a per-process cost, not a per-run one.

Run: ``python -m benchmarks.ingest_throughput [--export DIR] [--model minilm]
[--backend onnx-int8] [--compare-backend torch|none]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import markdown_table, print_table, write_section

DEFAULT_EXPORT = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "confluence" / "DLX-confluence"
)
TARGET_RATIO = 2.5
TARGET_RERUN = 0.05


def _peak_rss_mb() -> float:
    """This process's peak RSS. On Linux the high-water mark of its own memory map (VmHWM):
    ``ru_maxrss`` of a spawned child also counts the parent's RSS at the fork that preceded
    the exec, so every child would report at least the parent's size."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _settings(tmp: Path, model: str, backend: str) -> Any:
    from context_core.config import get_settings

    return get_settings(
        data_dir=tmp / "ctx", reports_dir=tmp / "reports", embed_model=model, embed_backend=backend
    )


def _child_raw(model: str, texts: list[str], tmp: str) -> dict[str, Any]:
    """Raw fp32 ``SentenceTransformer.encode`` of ``texts`` (a fresh process)."""
    from context_core.knowledge.embedding import load_encoder

    encoder = load_encoder(_settings(Path(tmp), model, "torch"))
    encoder.encode(["warm-up sentence for the benchmark"] * 8)
    batch = encoder.batch_size
    t0 = time.perf_counter()
    encoder.model.encode(texts, batch_size=batch, normalize_embeddings=True, convert_to_numpy=True)
    return {"seconds": time.perf_counter() - t0, "peak_rss_mb": _peak_rss_mb()}


def _child_refresh(
    model: str, backend: str, export: str, texts: list[str], tmp: str
) -> dict[str, Any]:
    """The refresh end to end, then unchanged again, with ``backend`` (a fresh process)."""
    from context_core.ingest.pipeline import run_refresh
    from context_core.knowledge.edge import EdgeStore
    from context_core.knowledge.embedding import load_encoder

    root = Path(tmp) / backend
    settings = _settings(root, model, backend)
    t0 = time.perf_counter()
    encoder = load_encoder(settings)
    load_s = time.perf_counter() - t0
    encoder.encode(["warm-up sentence for the benchmark"] * 8)
    with EdgeStore(settings.qdrant_dir) as store:
        t0 = time.perf_counter()
        first = run_refresh(
            Path(export), settings=settings, store=store, encoder=encoder, progress=False
        )
        first_s = time.perf_counter() - t0
        stored = sorted(r.payload["text"] for r in store.scroll(settings.collection_main))
        t0 = time.perf_counter()
        again = run_refresh(
            Path(export), settings=settings, store=store, encoder=encoder, progress=False
        )
        rerun_s = time.perf_counter() - t0
    return {
        "encoder": encoder.name,
        "batch": settings.embed_batch_size,
        "same_texts": stored == sorted(texts),
        "load_s": load_s,
        "first_s": first_s,
        "rerun_s": rerun_s,
        "pages": first.pages_seen,
        "quarantined": first.pages_quarantined,
        "chunks": first.chunks_written,
        "again_pages": again.pages_seen,
        "again_chunks": again.chunks_written,
        "stages": dict(first.seconds),
        "again_stages": dict(again.seconds),
        "peak_rss_mb": _peak_rss_mb(),
    }


def _child_profile(model: str, backend: str, texts: list[str], tmp: str) -> dict[str, Any]:
    """The ONNX encoder's op profile on one median-length batch, and int8 vs fp32 GEMM rates
    at the FFN's shape (a fresh process)."""
    from benchmarks._ort_profile import gemm_rates, op_profile
    from context_core.knowledge.embedding import load_encoder
    from context_core.knowledge.onnx_encoder import length_buckets

    settings = _settings(Path(tmp) / "profile", model, backend)
    encoder = load_encoder(settings)
    runner = encoder._runner
    if runner is None:
        raise SystemExit(f"backend {backend!r} has no ONNX model to profile")
    ids = runner.tokenize(texts)
    # the middle one of the length-sorted batches the encoder itself makes
    buckets = length_buckets([len(x) for x in ids], settings.embed_batch_size)
    batch = [ids[int(i)] for i in buckets[len(buckets) // 2]]
    prof = op_profile(runner.path, batch)
    rows, width = prof["shape"]
    gemm = gemm_rates(rows * width, encoder.dim, 4 * encoder.dim)
    return {"profile": prof, "gemm": gemm, "model_file": runner.path.name, "dim": encoder.dim}


def _in_child(fn: Any, *args: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    with ctx.Pool(1, maxtasksperchild=1) as pool:
        result: dict[str, Any] = pool.apply(fn, args)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", type=Path, default=DEFAULT_EXPORT)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--backend", choices=("torch", "onnx-int8"), default="onnx-int8")
    parser.add_argument(
        "--compare-backend", choices=("torch", "onnx-int8", "none"), default="torch"
    )
    parser.add_argument("--raw-runs", type=int, choices=(1, 2), default=2)
    args = parser.parse_args(argv)
    if not args.export.is_dir():
        print(f"skipped: export {args.export} is absent (only in the project workspace)")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from context_core.ingest.pipeline import plan_refresh
    from context_core.knowledge.edge import EdgeStore
    from context_core.knowledge.embedding import load_encoder

    tmp = Path(tempfile.mkdtemp(prefix="bench_ingest_"))
    try:
        settings = _settings(tmp / "plan", args.model, args.backend)
        # The chunk texts, known before any write: a plan on an empty scratch store. Loading
        # the backend here also makes the ONNX export if it is missing (not timed anywhere).
        encoder = load_encoder(settings)
        with EdgeStore(tmp / "scratch") as scratch:
            plan = plan_refresh(args.export, settings=settings, store=scratch, encoder=encoder)
        texts = [pt.text for pt in plan.points]
        del encoder, plan
        print(f"{len(texts):,} chunk texts; raw fp32 baseline ...", flush=True)
        raws = [_in_child(_child_raw, args.model, texts, str(tmp))]
        print(f"refresh with {args.backend} ...", flush=True)
        runs = {
            args.backend: _in_child(
                _child_refresh, args.model, args.backend, str(args.export), texts, str(tmp)
            )
        }
        if args.compare_backend not in ("none", args.backend):
            print(f"refresh with {args.compare_backend} ...", flush=True)
            runs[args.compare_backend] = _in_child(
                _child_refresh,
                args.model,
                args.compare_backend,
                str(args.export),
                texts,
                str(tmp),
            )
        prof: dict[str, Any] | None = None
        if args.backend != "torch":
            print(f"{args.backend} op profile ...", flush=True)
            prof = _in_child(_child_profile, args.model, args.backend, texts, str(tmp))
        if args.raw_runs == 2:
            print("raw fp32 baseline again ...", flush=True)
            raws.append(_in_child(_child_raw, args.model, texts, str(tmp)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    for name, run in runs.items():
        if not run["same_texts"]:
            raise SystemExit(f"the {name} run stored other texts than the plan: baseline invalid")
    n = len(texts)
    raw_s = sum(r["seconds"] for r in raws) / len(raws)
    raw_cps = n / raw_s
    main_run = runs[args.backend]
    ratio = main_run["chunks"] / main_run["first_s"] / raw_cps
    rerun_ratio = main_run["rerun_s"] / main_run["first_s"]
    rows: list[dict[str, Any]] = []
    for name, run in runs.items():
        cps = run["chunks"] / run["first_s"]
        rows.append(
            {
                "measure": f"refresh end to end, {run['encoder']}",
                "pages": run["pages"],
                "chunks": run["chunks"],
                "seconds": run["first_s"],
                "chunks/s": cps,
                "vs baseline": f"{cps / raw_cps:.2f}x raw"
                + (f" (target >= {TARGET_RATIO})" if name == args.backend else ""),
                "peak RSS MB": run["peak_rss_mb"],
            }
        )
    rows.append(
        {
            "measure": "baseline: raw fp32 model.encode, same texts",
            "pages": "",
            "chunks": n,
            "seconds": raw_s,
            "chunks/s": raw_cps,
            "vs baseline": "1.00 (runs: " + ", ".join(f"{r['seconds']:.1f} s" for r in raws) + ")",
            "peak RSS MB": max(r["peak_rss_mb"] for r in raws),
        }
    )
    rows.append(
        {
            "measure": f"unchanged re-run, {main_run['encoder']}",
            "pages": main_run["again_pages"],
            "chunks": main_run["again_chunks"],
            "seconds": main_run["rerun_s"],
            "chunks/s": "",
            "vs baseline": f"{rerun_ratio:.1%} of first run (target <= {TARGET_RERUN:.0%})",
            "peak RSS MB": "",
        }
    )
    stages = [
        {"stage": k}
        | {f"{runs[b]['encoder']} s": runs[b]["stages"].get(k, 0.0) for b in runs}
        | {"re-run s": main_run["again_stages"].get(k, 0.0)}
        for k in main_run["stages"]
    ]
    print_table("Ingest throughput", rows)
    print_table("Seconds per stage", stages)
    outside = 1.0 - main_run["stages"]["embed"] / main_run["first_s"]
    rss_note = ""
    if len(runs) > 1:
        other = next(r for b, r in runs.items() if b != args.backend)
        higher = main_run["peak_rss_mb"] > other["peak_rss_mb"]
        rss_note = (
            f"peak RSS {main_run['peak_rss_mb']:,.0f} MB vs {other['peak_rss_mb']:,.0f} MB with "
            f"{other['encoder']} ({'HIGHER: misses' if higher else 'meets'} the not-higher "
            "target); "
        )
    verdict = (
        f"refresh/raw fp32 = {ratio:.2f}x ({'meets' if ratio >= TARGET_RATIO else 'misses'} the "
        f">= {TARGET_RATIO}x target); time outside embedding = {outside:.1%} of the first run; "
        f"re-run = {rerun_ratio:.1%} of the first run "
        f"({'meets' if rerun_ratio <= TARGET_RERUN else 'misses'} the <= 5 % target); "
        + rss_note
        + f"model load {main_run['load_s']:.1f} s (not in the timings)."
    )
    print(verdict)
    prof_md = ""
    if prof is not None:
        p, g = prof["profile"], prof["gemm"]
        op_rows = [
            {
                "op type": op,
                "share of kernel time": f"{share:.1%}",
                "ms per batch": share * p["kernel_ms"],
            }
            for op, share in p["ops"].items()
            if share >= 0.001
        ]
        print_table("ONNX encoder op profile", op_rows)
        prof_note = (
            f"One batch of {p['shape'][0]} x {p['shape'][1]} tokens (the median length) through "
            f"`{prof['model_file']}`, ONNX Runtime's profiler, one warm-up then {p['runs']} runs: "
            f"{p['wall_ms']:,.0f} ms per run ({p['shape'][0] / p['wall_ms'] * 1e3:.1f} texts/s). "
            f"The FFN's first product ([{p['shape'][0] * p['shape'][1]:,} x {prof['dim']}] x "
            f"[{prof['dim']} x {4 * prof['dim']:,}]) on this CPU: int8 "
            f"{g['int8_gmacs']:.0f} GMAC/s, fp32 {g['fp32_gmacs']:.0f} GMAC/s, "
            f"**{g['ratio']:.2f}x**: the most int8 weights can buy over fp32 for the products; "
            "attention's scores, LayerNorm and GELU run in fp32 either way."
        )
        print(prof_note)
        prof_md = "\n" + markdown_table(op_rows) + "\n" + prof_note + "\n"
    cmd = "python -m benchmarks.ingest_throughput"
    if args.backend != "onnx-int8" or args.compare_backend != "torch":
        cmd += f" --backend {args.backend} --compare-backend {args.compare_backend}"
    body = (
        f"Export `{args.export.name}` ({main_run['pages']} page files, "
        f"{main_run['quarantined']} quarantined), model `{args.model}`, batch "
        f"{main_run['batch']}, Qdrant Edge on a temp dir; each row its own fresh process "
        f"(peak RSS = that process's `ru_maxrss`). `{cmd}`\n\n"
        + markdown_table(rows)
        + "\n"
        + markdown_table(stages)
        + "\n"
        + verdict
        + "\n"
        + prof_md
    )
    write_section("ingest", "Knowledge refresh throughput (DLX export)", body)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
