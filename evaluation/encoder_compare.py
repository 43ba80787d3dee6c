"""fp32 torch vs int8 ONNX encoder on a BEIR folder: retrieval quality and vector agreement.

Decides whether ``CTX_EMBED_BACKEND=onnx-int8`` may be the default. Both encoders embed the
same chunks (cut as :func:`evaluation.retrieval_compare.doc_chunks` cuts them, i.e. as
ingestion would) and the same judged queries; retrieval is exact (numpy dot products over
every chunk, a document scored by its best chunk), so the nDCG difference is the encoder's
alone, not HNSW's. Reported per dataset:

- nDCG@10 of each backend and the difference (goal: int8 within 0.01 of fp32);
- mean (and 1st percentile) cosine between the two backends' vectors of the same text, over
  chunks and queries (goal: mean >= 0.99);
- encode time of the chunks per backend, measured in the same run.

Run: ``python -m evaluation.encoder_compare DIR [DIR ...]``; writes the ``encoder-quality``
section of ``reports/benchmarks.md`` unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evaluation.beir import load_beir
from evaluation.retrieval_compare import doc_chunks
from evaluation.retrieval_metrics import ndcg_at_k

NDCG_TOLERANCE = 0.01
COSINE_GOAL = 0.99


@dataclass(frozen=True)
class EncoderComparison:
    dataset: str
    docs: int
    chunks: int
    queries: int
    ndcg_fp32: float
    ndcg_int8: float
    cosine_mean: float
    cosine_p1: float
    encode_s_fp32: float
    encode_s_int8: float

    @property
    def met(self) -> bool:
        return self.ndcg_fp32 - self.ndcg_int8 <= NDCG_TOLERANCE and self.cosine_mean >= COSINE_GOAL


def rank_docs(
    chunk_vecs: np.ndarray, chunk_docs: Sequence[str], query_vec: np.ndarray, k: int
) -> list[str]:
    """Document ids by their best chunk's cosine, best first (exact search)."""
    scores = chunk_vecs @ query_vec
    best: dict[str, float] = {}
    for i in np.argsort(-scores):
        d = chunk_docs[int(i)]
        if d not in best:
            best[d] = float(scores[int(i)])
            if len(best) >= k:
                break
    return list(best)


def compare_encoders(
    path: Path, fp32: Any, int8: Any, *, k: int = 10, limit_docs: int | None = None
) -> EncoderComparison:
    """Both encoders (``Encoder`` objects) on one BEIR folder."""
    data = load_beir(path, limit_docs=limit_docs)
    texts: list[str] = []
    owners: list[str] = []
    for doc_id, (title, text) in data.corpus.items():
        for piece in doc_chunks(fp32, title, text):
            texts.append(piece)
            owners.append(doc_id)
    qids = list(data.queries)
    qtexts = [data.queries[q] for q in qids]
    vecs: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
    for name, enc in (("fp32", fp32), ("int8", int8)):
        enc.encode(texts[:64])  # warm-up outside the timing
        t0 = time.perf_counter()
        chunk_vecs = enc.encode(texts)
        took = time.perf_counter() - t0
        vecs[name] = (chunk_vecs, enc.encode(qtexts), took)
    ndcg = {
        name: float(
            np.mean(
                [
                    ndcg_at_k(rank_docs(c, owners, q[j], k), data.qrels[qid], k)
                    for j, qid in enumerate(qids)
                ]
            )
        )
        for name, (c, q, _) in vecs.items()
    }
    agree = np.concatenate(
        [
            np.sum(vecs["fp32"][0] * vecs["int8"][0], axis=1),
            np.sum(vecs["fp32"][1] * vecs["int8"][1], axis=1),
        ]
    )
    return EncoderComparison(
        dataset=data.name,
        docs=len(data.corpus),
        chunks=len(texts),
        queries=len(qids),
        ndcg_fp32=ndcg["fp32"],
        ndcg_int8=ndcg["int8"],
        cosine_mean=float(agree.mean()),
        cosine_p1=float(np.percentile(agree, 1)),
        encode_s_fp32=vecs["fp32"][2],
        encode_s_int8=vecs["int8"][2],
    )


def layer_sweep(
    path: Path, fp32: Any, *, limit_docs: int | None = None, limit_texts: int = 600
) -> list[dict[str, Any]]:
    """Which layers' FFN outputs lose most to int8: the model exported once per variant (all
    weight MatMuls int8 as recipe 1; recipe 1 with one layer's FFN output kept fp32, per layer;
    the shipped recipe), each variant's vectors compared with fp32 on the same texts (the
    first ``limit_texts`` chunks and queries of the folder)."""
    import tempfile

    from context_core.knowledge.onnx_encoder import FP32_FFN_OUTPUT_LAYERS, OnnxRunner, export_int8

    data = load_beir(path, limit_docs=limit_docs)
    texts = [p for title, text in data.corpus.values() for p in doc_chunks(fp32, title, text)]
    half = limit_texts // 2
    texts = texts[:half] + list(data.queries.values())[: limit_texts - min(half, len(texts))]
    ref = fp32.encode(texts)
    n_layers = len(fp32.model[0].auto_model.encoder.layer)
    shipped = list(range(FP32_FFN_OUTPUT_LAYERS))
    variants: list[tuple[str, list[int]]] = [("none (recipe 1: every MatMul int8)", [])]
    variants += [(f"layer {i}", [i]) for i in range(n_layers)]
    variants.append((f"layers 0-{FP32_FFN_OUTPUT_LAYERS - 1} (recipe 2, shipped)", shipped))
    out: list[dict[str, Any]] = []
    base = 0.0
    for label, keep in variants:
        with tempfile.TemporaryDirectory(prefix="ctx-sweep-") as tmp:
            runner = OnnxRunner(
                export_int8(fp32.model, Path(tmp), keep),
                fp32.model.tokenizer.backend_tokenizer,
                fp32.max_tokens,
            )
            vecs = runner.encode(texts)
            runner.close()
        cos = np.sum(ref * vecs, axis=1)
        base = base or float(cos.mean())
        out.append(
            {
                "dataset": data.name,
                "FFN output kept fp32": label,
                "texts": f"{len(texts):,}",
                "cosine mean": f"{cos.mean():.4f}",
                "cosine p1": f"{np.percentile(cos, 1):.4f}",
                "gain vs recipe 1": f"{cos.mean() - base:+.4f}",
            }
        )
    return out


def backend_pair(model: str = "minilm") -> tuple[Any, Any]:
    """``(fp32 torch, int8 ONNX)`` encoders of ``model`` (the ONNX one exported on first use)."""
    from context_core.config import get_settings
    from context_core.knowledge.embedding import load_encoder

    fp32 = load_encoder(get_settings(embed_model=model, embed_backend="torch"))
    int8 = load_encoder(get_settings(embed_model=model, embed_backend="onnx-int8"))
    return fp32, int8


def rows(results: Sequence[EncoderComparison], k: int = 10) -> list[dict[str, Any]]:
    return [
        {
            "dataset": r.dataset,
            "docs / chunks / queries": f"{r.docs:,} / {r.chunks:,} / {r.queries:,}",
            f"nDCG@{k} fp32": f"{r.ndcg_fp32:.4f}",
            f"nDCG@{k} int8": f"{r.ndcg_int8:.4f}",
            "diff": f"{r.ndcg_int8 - r.ndcg_fp32:+.4f}",
            "cosine mean (p1)": f"{r.cosine_mean:.4f} ({r.cosine_p1:.4f})",
            "chunk encode s fp32 / int8": f"{r.encode_s_fp32:.1f} / {r.encode_s_int8:.1f} "
            f"({r.encode_s_fp32 / max(r.encode_s_int8, 1e-9):.2f}x)",
            "goals met": "yes" if r.met else "NO",
        }
        for r in results
    ]


def _command(flag: str, dirs: Sequence[Path], limit_docs: int | None) -> str:
    """The command line a report section records (the data folder as ``<data>``)."""
    parts = ["python -m evaluation.encoder_compare", flag, *(f"<data>/{d.name}" for d in dirs)]
    if limit_docs:
        parts.append(f"--limit-docs {limit_docs}")
    return " ".join(p for p in parts if p)


def main(argv: list[str]) -> int:
    from benchmarks._common import markdown_table, print_table, write_section
    from context_core.config import get_settings
    from context_core.knowledge.embedding import load_encoder

    ap = argparse.ArgumentParser(
        prog="python -m evaluation.encoder_compare",
        description="fp32 torch vs int8 ONNX MiniLM on BEIR folders: nDCG@10, cosine agreement",
    )
    ap.add_argument("dirs", nargs="+", type=Path, help="BEIR folders (corpus, queries, qrels)")
    ap.add_argument("--limit-docs", type=int, default=None)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument(
        "--layer-sweep",
        action="store_true",
        help="instead: which layers' FFN outputs lose most to int8 (one export per variant)",
    )
    args = ap.parse_args(argv)
    for d in args.dirs:
        if not (d / "corpus.jsonl").is_file():
            ap.error(f"{d} is not a BEIR folder (no corpus.jsonl); pass e.g. a dataset folder")
    if args.layer_sweep:
        fp32 = load_encoder(get_settings(embed_backend="torch"))
        sweep = [r for d in args.dirs for r in layer_sweep(d, fp32, limit_docs=args.limit_docs)]
        print_table("int8 encoder: cosine with fp32 by FFN output kept fp32", sweep)
        if not args.no_write:
            cmd = _command("--layer-sweep", args.dirs, args.limit_docs)
            body = (
                "The int8 recipe's choice of fp32 layers: the packaged MiniLM exported once "
                "per variant with every weight MatMul int8 except the FFN output (the MLP's "
                "second Linear) of the named layers, its vectors compared with torch fp32 on "
                "the same texts (the first 300 chunks and the first 300 queries of each "
                "folder)."
                "\n\n" + markdown_table(sweep) + f"\nRun: `{cmd}`\n"
            )
            write_section("encoder-layers", "Encoder: int8 loss by layer", body)
        return 0
    fp32, int8 = backend_pair()
    results = [compare_encoders(d, fp32, int8, limit_docs=args.limit_docs) for d in args.dirs]
    table = rows(results)
    print_table("fp32 torch vs int8 ONNX encoder", table)
    if not args.no_write:
        cmd = _command("", args.dirs, args.limit_docs)
        body = (
            "The packaged MiniLM run by torch (fp32) and by ONNX Runtime with dynamic int8 "
            "quantisation (`CTX_EMBED_BACKEND=onnx-int8`), both embedding the same chunks and "
            "queries in one run; exact search (numpy), a document ranked by its best chunk. "
            f"Goals: nDCG@10 within {NDCG_TOLERANCE} of fp32, mean cosine agreement >= "
            f"{COSINE_GOAL}.\n\n" + markdown_table(table) + f"\nRun: `{cmd}`\n"
        )
        write_section("encoder-quality", "Encoder: fp32 torch vs int8 ONNX (quality)", body)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
