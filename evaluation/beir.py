"""Calibration on real human judgements: BEIR-layout datasets and the sample export's qrels.

A BEIR folder holds ``corpus.jsonl`` (``{_id, title, text}``), ``queries.jsonl``
(``{_id, text}``) and ``qrels/<split>.tsv`` (header ``query-id corpus-id score``). The corpus is
embedded into a *scratch* Qdrant Edge collection under ``<data_dir>/scratch/`` (deleted
afterwards), every judged query retrieves its top-k, and each hit is labelled from the qrels
(score > 0 -> relevant). The labels then go through the same validation and calibration as a
hand-annotated file, so the thresholds answer "how similar is similar enough" for this model
on text people actually judged.

Unjudged hits count as irrelevant (the usual BEIR convention); on sparsely judged sets this
makes the negatives slightly pessimistic, which the report states.
"""

from __future__ import annotations

import csv
import json
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from context_core.errors import DataValidationError

if TYPE_CHECKING:
    import pandas as pd

    from context_core.config import Settings
    from context_core.knowledge.embedding import Encoder
    from context_core.knowledge.store import VectorStore
    from evaluation.calibration import CalibrationResult
    from evaluation.labels import LabelSet
    from evaluation.relevance_calibration import RelevanceFit
    from evaluation.workflows import Staged

__all__ = [
    "BeirDataset",
    "CalibrationRun",
    "RetrievalStats",
    "calibrate_beir",
    "calibrate_sample",
    "label_hits",
    "load_beir",
    "load_qrels",
]

SAMPLE_EVAL_DIR = Path(__file__).resolve().parents[1] / "context_core" / "sample_data" / "eval"


@dataclass(frozen=True)
class BeirDataset:
    name: str
    corpus: Mapping[str, tuple[str, str]]  # doc id -> (title, text)
    queries: Mapping[str, str]  # query id -> text (only judged queries, file order)
    qrels: Mapping[str, Mapping[str, int]]  # query id -> doc id -> graded relevance


def _jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    if not path.is_file():
        raise DataValidationError(f"{path} is missing (BEIR layout needs it)")
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataValidationError(f"{path} line {lineno} is not JSON: {e}") from e


def load_qrels(path: Path) -> dict[str, dict[str, int]]:
    """``query-id corpus-id score`` TSV (header optional) -> nested dict."""
    if not path.is_file():
        raise DataValidationError(f"qrels file {path} is missing")
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8", newline="") as f:
        for lineno, row in enumerate(csv.reader(f, delimiter="\t"), start=1):
            if not row or (lineno == 1 and row[0] == "query-id"):
                continue
            if len(row) < 3:
                raise DataValidationError(
                    f"{path} line {lineno}: expected 'query-id<TAB>corpus-id<TAB>score'"
                )
            try:
                score = int(float(row[2]))
            except ValueError as e:
                raise DataValidationError(f"{path} line {lineno}: score {row[2]!r}") from e
            qrels.setdefault(row[0], {})[row[1]] = score
    return qrels


def load_beir(
    path: Path | str,
    *,
    split: str = "test",
    limit_queries: int | None = None,
    limit_docs: int | None = None,
) -> BeirDataset:
    """Read a BEIR folder. Only queries with at least one relevant judgement are kept (file
    order); ``limit_queries`` keeps the first N of those. ``limit_docs`` caps the corpus for
    quick runs: the documents judged for the kept queries always stay, the other slots are
    filled in file order (so relevant hits stay findable, with fewer distractors)."""
    path = Path(path)
    corpus = {
        str(o["_id"]): (str(o.get("title") or ""), str(o.get("text") or ""))
        for _, o in _jsonl(path / "corpus.jsonl")
    }
    qrels = load_qrels(path / "qrels" / f"{split}.tsv")
    queries: dict[str, str] = {}
    for _, o in _jsonl(path / "queries.jsonl"):
        qid = str(o["_id"])
        if any(s > 0 for s in qrels.get(qid, {}).values()):
            queries[qid] = str(o["text"])
            if limit_queries is not None and len(queries) >= limit_queries:
                break
    if not queries:
        raise DataValidationError(f"{path}: no query in queries.jsonl has a positive qrel")
    if limit_docs is not None and limit_docs < len(corpus):
        judged = {d for q in queries for d in qrels[q] if d in corpus}
        fill = max(0, limit_docs - len(judged))
        others = [d for d in corpus if d not in judged][:fill]
        keep = judged | set(others)
        corpus = {d: v for d, v in corpus.items() if d in keep}
    return BeirDataset(
        name=path.name,
        corpus=corpus,
        queries=queries,
        qrels={q: qrels[q] for q in queries},
    )


def _truncate(encoder: Encoder, text: str) -> tuple[str, bool]:
    """Cut ``text`` at the model's window (minus [CLS]/[SEP]) on a token boundary."""
    budget = max(1, encoder.max_tokens - 2)
    try:
        offsets = encoder.token_offsets(text)
    except Exception:  # a model without a fast tokenizer: let the model truncate
        return text, False
    if len(offsets) <= budget:
        return text, False
    return text[: offsets[budget - 1][1]], True


def _progress(enabled: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not enabled,
        transient=False,
    )


def _index_corpus(
    dataset: BeirDataset,
    store: VectorStore,
    encoder: Encoder,
    collection: str,
    *,
    batch: int,
    progress: bool,
    sparse_encoder: Any = None,
) -> int:
    """Embed title + text of every document into ``collection`` (with its sparse vector when a
    ``sparse_encoder`` is given); return how many were cut at the model's window."""
    from context_core.knowledge.store import PointRecord, point_id

    if sparse_encoder is not None:
        store.create_collection(
            collection, dim=encoder.dim, model=encoder.name, sparse=sparse_encoder.name
        )
    else:
        store.create_collection(collection, dim=encoder.dim, model=encoder.name)
    items = list(dataset.corpus.items())
    n_cut = 0
    with _progress(progress) as bar:
        task = bar.add_task(f"embedding {dataset.name} corpus", total=len(items))
        for start in range(0, len(items), batch):
            chunk = items[start : start + batch]
            texts = []
            for _, (title, text) in chunk:
                full = f"{title}\n{text}" if title and not text.startswith(title) else text
                cut, was_cut = _truncate(encoder, full)
                n_cut += was_cut
                texts.append(cut)
            vectors = encoder.encode(texts)
            sparse = (
                sparse_encoder.encode_documents(texts)
                if sparse_encoder is not None
                else [None] * len(texts)
            )
            store.upsert(
                collection,
                [
                    PointRecord(
                        point_id(doc_id, 0),
                        vec.tolist(),
                        {
                            "source": doc_id,
                            "title": title,
                            "section": dataset.name,
                            "text": t[:300],
                        },
                        **({"sparse": sv} if sv is not None else {}),
                    )
                    for (doc_id, (title, _)), vec, t, sv in zip(
                        chunk, vectors, texts, sparse, strict=True
                    )
                ],
            )
            bar.advance(task, len(chunk))
    return n_cut


@dataclass(frozen=True, slots=True)
class RetrievalStats:
    """How well retrieval itself did, to read the thresholds against."""

    n_queries: int
    k: int
    recall_at_k: float  # share of relevant documents found in the top-k, macro-averaged
    hit_rate_at_k: float  # share of queries with at least one relevant hit in the top-k
    mrr_at_k: float


def label_hits(
    queries: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, int]],
    search: Any,
    *,
    k: int,
    progress: bool = False,
    desc: str = "retrieving",
) -> tuple[pd.DataFrame, RetrievalStats]:
    """Top-``k`` per query via ``search(text, k) -> hits``; a hit is relevant when its payload
    ``source`` has a qrel score > 0 for that query. Returns the labels frame and stats.

    Each row also carries the relevance model's features of the hit in its list
    (:func:`context_core.routing.relevance.hit_features`: ``rank``, ``margin``, ``query_len``, and
    ``sparse_score`` when the search ran a sparse leg), so the same labels fit ``p_relevant``.
    """
    import pandas as pd

    from context_core.routing.relevance import FEATURES, hit_features, query_length

    rows: list[dict[str, Any]] = []
    recalls: list[float] = []
    rr: list[float] = []
    with _progress(progress) as bar:
        task = bar.add_task(desc, total=len(queries))
        for qid, text in queries.items():
            relevant = {d for d, s in qrels.get(qid, {}).items() if s > 0}
            seen: set[str] = set()
            first = 0
            hits = list(search(text, k))
            feats = hit_features(hits, query_length(text))
            for rank, (hit, f) in enumerate(zip(hits, feats, strict=True), start=1):
                source = str((hit.payload or {}).get("source", ""))
                label = int(source in relevant)
                rows.append({"query_id": qid, "query": text, "point_id": str(hit.id),
                             "source": source, "similarity": min(1.0, max(-1.0, hit.score)),
                             "label": label})  # fmt: skip
                for name, value in zip(FEATURES[1:], f[1:], strict=True):
                    if name != "sparse_score" or getattr(hit, "sparse_score", None) is not None:
                        rows[-1][name] = float(value)
                if label:
                    seen.add(source)
                    first = first or rank
            recalls.append(len(seen) / len(relevant) if relevant else 0.0)
            rr.append(1.0 / first if first else 0.0)
            bar.advance(task)
    n = len(queries)
    stats = RetrievalStats(
        n_queries=n,
        k=k,
        recall_at_k=sum(recalls) / n if n else float("nan"),
        hit_rate_at_k=sum(1 for r in rr if r > 0) / n if n else float("nan"),
        mrr_at_k=sum(rr) / n if n else float("nan"),
    )
    return pd.DataFrame(rows), stats


@dataclass(frozen=True)
class CalibrationRun:
    """Everything one end-to-end calibration produced (for the CLI and notebooks)."""

    dataset: str
    model: str
    labels: LabelSet
    result: CalibrationResult
    stats: RetrievalStats
    thresholds_path: Path
    installed_path: Path | None
    report: Mapping[str, Path]
    n_docs: int = 0
    n_truncated: int = 0
    relevance: RelevanceFit | None = None  # p_relevant, fitted on the same labels
    relevance_path: Path | None = None  # relevance_model_<dataset>.json next to the thresholds
    relevance_installed: Path | None = None  # the runtime relevance_model.json, when installed
    staged: Staged | None = None  # the candidate version, its gates, whether it was promoted


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "dataset"


def _finish(
    frame: pd.DataFrame,
    stats: RetrievalStats,
    *,
    settings: Settings,
    dataset: str,
    model: str,
    collection: str,
    out: Path | None,
    install: bool,
    calib_kwargs: Mapping[str, Any],
    report_name: str,
    title: str,
    min_rows: int,
    n_docs: int = 0,
    n_truncated: int = 0,
    relevance: bool = True,
    retrieval_mode: str | None = None,
    force: bool = False,
    reason: str | None = None,
    by: str | None = None,
) -> CalibrationRun:
    """Store labels, check and validate them, calibrate, write thresholds and the relevance
    model (``out``: a report artefact the router does not read), store the result as a
    candidate version of the router's thresholds, promote it with ``install`` when the
    promotion gates pass (or ``force`` with ``reason``), and write the report."""
    from context_core.routing.confidence import ConfidencePolicy
    from context_core.routing.relevance import relevance_path_for
    from evaluation.calibration import (
        Provenance,
        calibrate,
        compare_with_current,
        write_thresholds,
    )
    from evaluation.label_quality import load_checked_labels
    from evaluation.relevance_calibration import try_fit_relevance, write_relevance_model
    from evaluation.report import write_calibration_report
    from evaluation.workflows import append_gates, check_force, stage

    check_force(force, reason)
    current = ConfidencePolicy.load(settings)  # what the router uses now, before any --install
    reports = Path(settings.reports_dir)
    labels_csv = reports / f"{report_name}_labels.csv"
    labels_csv.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(labels_csv, index=False)
    # quality checks, then the GX suite; either raises naming rows
    labels, quality = load_checked_labels(labels_csv, min_rows=min_rows)
    result = calibrate(labels.scores, labels.labels, **calib_kwargs)
    prov = Provenance(
        model=model, collection=collection, labels_sha256=labels.sha256,
        labels_path=str(labels_csv),
    ).filled()  # fmt: skip
    target = Path(out) if out else reports / f"thresholds_{_safe_name(dataset)}.json"
    write_thresholds(result, target, prov)
    fit, note = try_fit_relevance(
        labels,
        model=model,
        dataset=dataset,
        enabled=relevance,
        calib_kwargs=calib_kwargs,
        retrieval_mode=retrieval_mode,
    )
    rel_path = rel_installed = None
    if fit is not None:
        rel_path = write_relevance_model(fit.model, relevance_path_for(target))
    staged = stage(
        labels, result, fit, prov, settings, promote=install, force=force, reason=reason,
        by=by, quality=quality, extra={"dataset": dataset, "retrieval_mode": retrieval_mode},
    )  # fmt: skip
    installed = staged.in_force_path if staged.promoted else None
    if staged.promoted and staged.version.relevance is not None:
        rel_installed = relevance_path_for(staged.in_force_path)
    change = compare_with_current(result, None, current.accept, current.skip)
    paths = write_calibration_report(
        result,
        reports,
        provenance=prov,
        change=change,
        name=report_name,
        title=title,
        thresholds_path=installed or target,
        relevance=fit,
        relevance_path=rel_installed or rel_path,
        relevance_note=note,
    )
    _append_stats(paths["markdown"], stats, n_docs, n_truncated)
    append_gates(paths["markdown"], staged)
    return CalibrationRun(
        dataset=dataset,
        model=model,
        labels=labels,
        result=result,
        stats=stats,
        thresholds_path=target,
        installed_path=installed,
        report=paths,
        n_docs=n_docs,
        n_truncated=n_truncated,
        relevance=fit,
        relevance_path=rel_path,
        relevance_installed=rel_installed,
        staged=staged,
    )


def _append_stats(md: Path, stats: RetrievalStats, n_docs: int, n_truncated: int) -> None:
    extra = [
        "## Retrieval behind these labels",
        "",
        f"{stats.n_queries} judged queries, top-{stats.k} each"
        + (
            f", {n_docs} documents ({n_truncated} cut at the model's token window)"
            if n_docs
            else ""
        )
        + f": recall@{stats.k} {stats.recall_at_k:.3f}, hit rate@{stats.k} "
        f"{stats.hit_rate_at_k:.3f}, MRR@{stats.k} {stats.mrr_at_k:.3f}. "
        "Unjudged hits count as irrelevant.",
        "",
    ]
    text = md.read_text(encoding="utf-8")
    head, sep, tail = text.partition("## Plots")
    md.write_text(head + "\n".join(extra) + "\n" + sep + tail, encoding="utf-8")


def calibrate_beir(
    path: Path | str,
    settings: Settings,
    *,
    k: int = 10,
    model: str | None = None,
    limit_queries: int | None = None,
    limit_docs: int | None = None,
    split: str = "test",
    out: Path | None = None,
    install: bool = False,
    progress: bool = True,
    min_rows: int = 20,
    batch: int = 64,
    relevance: bool = True,
    mode: str | None = None,
    force: bool = False,
    reason: str | None = None,
    by: str | None = None,
    **calib_kwargs: Any,
) -> CalibrationRun:
    """BEIR folder -> scratch collection -> top-k -> labels -> thresholds + report.

    Thresholds go to ``out`` (default ``<reports>/thresholds_<dataset>.json``) and the
    relevance model (``relevance=True``) next to them (``relevance_model_<dataset>.json``);
    both are also stored as a candidate version of the router's thresholds
    (:mod:`evaluation.promotion`), promoted to the runtime files only with ``install=True``
    and when the promotion gates pass (or ``force`` with ``reason``). ``mode`` is the
    retrieval that produces the hits (default ``CTX_RETRIEVAL_MODE``, what the router runs;
    sparse and hybrid index the library's sparse vectors too), so the labels and the relevance
    model's features (sparse score, fused rank, margin) match what the router will see.
    ``calib_kwargs`` go to :func:`evaluation.calibration.calibrate` (criteria, targets,
    n_boot, seed).
    """
    from context_core.knowledge.edge import EdgeStore
    from context_core.knowledge.embedding import load_encoder
    from context_core.knowledge.store import SearchQuery

    dataset = load_beir(path, split=split, limit_queries=limit_queries, limit_docs=limit_docs)
    run_settings = settings.model_copy(update={"embed_model": model}) if model else settings
    encoder = load_encoder(run_settings)
    collection = f"beir_{_safe_name(dataset.name)}"
    mode = str(mode or getattr(settings, "retrieval_mode", "dense"))
    fusion = str(getattr(settings, "hybrid_fusion", "rrf"))
    feedback = int(getattr(settings, "hybrid_feedback", 0))  # as the router searches
    sparse_encoder = _sparse_encoder() if mode != "dense" else None
    if sparse_encoder is None:
        mode = "dense"
    scratch_root = Path(settings.data_dir) / "scratch"
    scratch_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="beir-", dir=scratch_root) as tmp:
        store = EdgeStore(Path(tmp) / "qdrant")
        try:
            n_cut = _index_corpus(
                dataset, store, encoder, collection, batch=batch, progress=progress,
                sparse_encoder=sparse_encoder,
            )  # fmt: skip
            store.optimize(collection)

            texts = list(dataset.queries.values())
            qvecs = encoder.encode([_truncate(encoder, t)[0] for t in texts])
            by_text = dict(zip(texts, qvecs, strict=True))

            def search(text: str, limit: int) -> Sequence[Any]:
                vec = by_text[text].tolist()
                if sparse_encoder is None:
                    return store.search(vec, SearchQuery(collection, limit, exact=True))
                q = SearchQuery(collection, limit, exact=True, mode=mode, fusion=fusion,
                                feedback=feedback)  # fmt: skip
                return store.search(vec, q, sparse=sparse_encoder.encode_query(text))

            frame, stats = label_hits(
                dataset.queries,
                dataset.qrels,
                search,
                k=k,
                progress=progress,
                desc=f"retrieving top-{k} for {dataset.name}",
            )
        finally:
            store.close()
    return _finish(
        frame,
        stats,
        settings=settings,
        dataset=dataset.name,
        model=encoder.name,
        collection=f"scratch:{collection}",
        out=out,
        install=install,
        calib_kwargs=calib_kwargs,
        report_name=f"calibration_beir_{_safe_name(dataset.name)}",
        title=f"Threshold calibration on {dataset.name} (BEIR qrels)",
        min_rows=min_rows,
        n_docs=len(dataset.corpus),
        n_truncated=n_cut,
        relevance=relevance,
        force=force,
        reason=reason,
        by=by,
        retrieval_mode=mode,
    )


def _sparse_encoder() -> Any:
    """The library's sparse encoder."""
    from context_core.knowledge.sparse import SparseEncoder

    return SparseEncoder()


def calibrate_sample(
    settings: Settings,
    *,
    eval_dir: Path | None = None,
    k: int = 10,
    progress: bool = False,
    min_rows: int = 20,
    relevance: bool = True,
    force: bool = False,
    reason: str | None = None,
    by: str | None = None,
    **calib_kwargs: Any,
) -> CalibrationRun:
    """The main job's calibration: sample queries + page-level qrels against the already
    ingested ``CTX_COLLECTION_MAIN``; promotes the candidate for the router when the gates
    pass (the first run promotes: nothing is in force; a rerun on the same labels passes
    ``not_worse`` with a difference of 0).

    ``eval_dir`` holds ``queries.jsonl`` and ``qrels.tsv`` (or ``qrels/test.tsv``) whose
    corpus ids are page ids: a hit is relevant when its payload ``source`` is one of them.
    """
    from context_core.knowledge import open_store
    from context_core.knowledge.embedding import load_encoder
    from context_core.knowledge.store import SearchQuery

    eval_dir = Path(eval_dir or SAMPLE_EVAL_DIR)
    qrels_path = eval_dir / "qrels.tsv"
    if not qrels_path.is_file():
        qrels_path = eval_dir / "qrels" / "test.tsv"
    qrels = load_qrels(qrels_path)
    from evaluation.labels import read_queries

    queries = {q.query_id: q.text for q in read_queries(eval_dir / "queries.jsonl")}
    queries = {q: t for q, t in queries.items() if any(s > 0 for s in qrels.get(q, {}).values())}
    if not queries:
        raise DataValidationError(f"{eval_dir}: no query has a positive qrel in {qrels_path}")
    collection = settings.collection_main
    store = open_store(settings)
    try:
        info = store.info(collection)
        if info is None:
            raise DataValidationError(
                f"collection {collection!r} does not exist under {settings.qdrant_dir}; "
                "run the ingestion first (ctx ingest refresh / ctx run)"
            )
        # CTX_EMBED_BACKEND=auto queries the collection with the backend that built it
        encoder = load_encoder(settings, recorded=info.model)

        def search(text: str, limit: int) -> Sequence[Any]:
            vec = encoder.encode([text])[0].tolist()
            return store.search(vec, SearchQuery(collection, limit))

        frame, stats = label_hits(queries, qrels, search, k=k, progress=progress)
    finally:
        store.close()
    return _finish(
        frame,
        stats,
        settings=settings,
        dataset="sample",
        model=encoder.name,
        collection=collection,
        out=settings.reports_dir / "thresholds_sample.json",
        install=True,
        calib_kwargs=calib_kwargs,
        report_name="calibration",
        title="Threshold calibration (sample export)",
        min_rows=min_rows,
        relevance=relevance,
        force=force,
        reason=reason,
        by=by,
    )
