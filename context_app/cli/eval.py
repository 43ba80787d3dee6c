"""`ctx eval ...`: threshold calibration, annotation sheets, CER and the context-health report.

Every command is a thin shell over :mod:`evaluation` (usable from a notebook the same way).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

import typer

from context_app.cli.thresholds import app as thresholds_app
from context_core.errors import ContextError

app = typer.Typer(
    no_args_is_help=True,
    help="Threshold calibration, annotation candidates, CER and health reports.",
)
app.add_typer(thresholds_app, name="thresholds")

_ACCEPT_HELP = (
    "How to pick ACCEPT: 'youden' (max TPR-FPR) or 'precision' (lowest threshold reaching "
    "--target-precision)."
)
_SKIP_HELP = "How to pick SKIP: 'recall' (highest threshold keeping --target-recall of relevant)."
_RELEVANCE_HELP = (
    "Also fit the relevance model (p_relevant) on the same labels and write it next to the "
    "thresholds (relevance_model*.json); the router labels L3 hits by it when present."
)


_FORCE_HELP = "Promote even when a promotion gate fails (needs --reason; recorded)."
_REASON_HELP = "Why the gates are overridden (with --force), kept in the provenance."


def _print_staged(staged: Any, quality: Any = None) -> None:
    """The label-quality notes, the gates and the verdict; exit 1 when not promoted because a
    gate failed (the calibration in force is then untouched)."""
    from evaluation.promotion import format_gates

    for f in getattr(quality, "findings", ()):
        typer.echo(f"label quality: {f.describe()}")
    typer.echo(f"candidate {staged.version.id} -> {staged.version.path}")
    for line in format_gates(staged.gates):
        typer.echo(f"  gate {line.strip()}")
    if staged.promoted:
        forced = staged.gates.failed
        typer.secho(
            f"PROMOTED {staged.version.id}: now in force ({staged.in_force_path})"
            + (f" [forced past: {', '.join(forced)}]" if forced else ""),
            fg=typer.colors.GREEN,
        )
    elif staged.gates.failed:
        typer.secho(
            f"NOT PROMOTED: gate(s) failed: {', '.join(staged.gates.failed)}. The calibration "
            f"in force is unchanged; candidate kept as {staged.version.id} "
            "(`ctx eval thresholds show` / `shadow`; --force --reason to override).",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(code=1)


def _fail(message: str) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=1)


def _settings() -> Any:
    from context_core.config import get_settings

    return get_settings()


def _print_result(run_result: Any, paths: dict[str, Path], *, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    r = run_result
    table = Table(title=title)
    for col in ("", "value", f"{r.ci['auc'].level:.0%} CI"):
        table.add_column(col, justify="right" if col else "left")
    for name, value in (("accept", r.accept), ("skip", r.skip), ("AUC", r.auc)):
        ci = r.ci[name.lower()]
        table.add_row(name, f"{value:.4f}", f"{ci.low:.4f} – {ci.high:.4f}")
    table.add_row("hits", f"{r.n} ({r.n_pos} relevant)", "")
    console = Console()
    console.print(table)
    for adj in r.adjustments:
        console.print(f"[yellow]note:[/] {adj}")
    for name, path in paths.items():
        console.print(f"{name:>18}: {path}")


def _print_relevance(fit: Any, path: Any) -> None:
    """One line on the p_relevant model: what was chosen and how it did on held-out queries."""
    if fit is None:
        return
    held = fit.summary()["held_out"]
    typer.echo(
        f"p_relevant: {fit.kind} over {','.join(fit.model.features)}; held-out AUC "
        f"{held['auc_p_relevant']:.3f} (cosine {held['auc_cosine']:.3f}), Brier "
        f"{held['brier_p_relevant']:.4f} (cosine as probability "
        f"{held['brier_cosine']:.4f}); accept p >= {fit.model.accept:.3f}, skip p >= "
        f"{fit.model.skip:.3f} -> {path or 'not kept (gate p_relevant)'}"
    )


@app.command()
def calibrate(
    labels: Annotated[
        Path,
        typer.Argument(
            help="Labels CSV/JSONL: query_id,query,point_id,similarity,label[,annotator]",
            show_default=False,
        ),
    ],
    accept_criterion: Annotated[str, typer.Option(help=_ACCEPT_HELP)] = "youden",
    target_precision: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.9,
    skip_criterion: Annotated[str, typer.Option(help=_SKIP_HELP)] = "recall",
    target_recall: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.95,
    n_boot: Annotated[int, typer.Option(min=0, help="Bootstrap resamples for CIs.")] = 1000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
    min_rows: Annotated[int, typer.Option(min=1, help="Refuse files with fewer rows.")] = 20,
    model: Annotated[str | None, typer.Option(help="Model name for provenance.")] = None,
    collection: Annotated[str | None, typer.Option(help="Collection for provenance.")] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="thresholds.json to write [default: the one the router reads]."),
    ] = None,
    relevance: Annotated[bool, typer.Option(help=_RELEVANCE_HELP)] = True,
    force: Annotated[bool, typer.Option("--force", help=_FORCE_HELP)] = False,
    reason: Annotated[str | None, typer.Option(help=_REASON_HELP)] = None,
) -> None:
    """Fit ACCEPT/SKIP on a labels file, store it as a candidate version, and promote it to
    the thresholds the router reads only when the promotion gates pass.

    The labels pass the label-quality checks and a Great Expectations suite first; a bad file
    stops here naming its rows. A failed gate exits 1 and names it; nothing in force changes.
    """
    from evaluation.workflows import calibrate_labels_file

    try:
        run = calibrate_labels_file(
            labels, _settings(), out=out, min_rows=min_rows, model=model,
            collection=collection, accept_criterion=accept_criterion,
            skip_criterion=skip_criterion, target_precision=target_precision,
            target_recall=target_recall, n_boot=n_boot, seed=seed, relevance=relevance,
            force=force, reason=reason,
        )  # fmt: skip
    except ContextError as e:
        raise _fail(str(e)) from e
    ch = run.change
    typer.echo(
        f"vs thresholds in force (accept {ch.current_accept:.3f}, skip {ch.current_skip:.3f}): "
        f"{ch.changed_share:.1%} of hits change label"
    )
    _print_result(
        run.result, {"thresholds": run.thresholds_path, **run.report},
        title=f"calibration of {labels}",
    )  # fmt: skip
    _print_relevance(run.relevance, run.relevance_path)
    _print_staged(run.staged, run.quality)


@app.command("calibrate-beir")
def calibrate_beir_cmd(
    directory: Annotated[
        Path,
        typer.Argument(
            help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv",
            show_default=False,
        ),
    ],
    k: Annotated[int, typer.Option(min=1, max=100, help="Hits retrieved per query.")] = 10,
    model: Annotated[str, typer.Option(help="Embedding model (minilm offline, bge-m3).")] = (
        "minilm"
    ),
    limit_queries: Annotated[
        int | None, typer.Option(min=1, help="Use only the first N judged queries.")
    ] = None,
    limit_docs: Annotated[
        int | None,
        typer.Option(min=1, help="Cap the corpus (judged docs kept, distractors trimmed)."),
    ] = None,
    split: Annotated[str, typer.Option(help="qrels/<split>.tsv to read.")] = "test",
    accept_criterion: Annotated[str, typer.Option(help=_ACCEPT_HELP)] = "youden",
    target_precision: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.9,
    skip_criterion: Annotated[str, typer.Option(help=_SKIP_HELP)] = "recall",
    target_recall: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.95,
    n_boot: Annotated[int, typer.Option(min=0)] = 1000,
    seed: Annotated[int, typer.Option()] = 0,
    out: Annotated[
        Path | None,
        typer.Option(help="Where to write thresholds [default: reports/thresholds_<name>.json]."),
    ] = None,
    install: Annotated[
        bool,
        typer.Option(
            help="Promote the candidate to the thresholds the router reads (if the gates pass)."
        ),
    ] = False,
    force: Annotated[bool, typer.Option("--force", help=_FORCE_HELP)] = False,
    reason: Annotated[str | None, typer.Option(help=_REASON_HELP)] = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
    relevance: Annotated[bool, typer.Option(help=_RELEVANCE_HELP)] = True,
    mode: Annotated[
        str | None,
        typer.Option(
            help="Retrieval behind the labels: dense, sparse, hybrid [default: "
            "CTX_RETRIEVAL_MODE, what the router runs]."
        ),
    ] = None,
) -> None:
    """Calibrate on human relevance judgements from a BEIR-layout dataset.

    The corpus is embedded into a scratch Qdrant Edge collection (deleted afterwards), every
    judged query retrieves its top-k, each hit is labelled from the qrels (score > 0 =
    relevant), and the labels go through the usual validation and calibration.
    """
    from evaluation.beir import calibrate_beir

    settings = _settings()
    try:
        run = calibrate_beir(
            directory, settings, k=k, model=model, limit_queries=limit_queries,
            limit_docs=limit_docs, split=split, out=out, install=install, progress=progress,
            accept_criterion=accept_criterion, skip_criterion=skip_criterion,
            target_precision=target_precision, target_recall=target_recall, n_boot=n_boot,
            seed=seed, relevance=relevance, mode=mode, force=force, reason=reason,
        )  # fmt: skip
    except ContextError as e:
        raise _fail(str(e)) from e
    s = run.stats
    paths = {"thresholds": run.thresholds_path, **run.report}
    if run.installed_path:
        paths["installed"] = run.installed_path
    if run.relevance_installed:
        paths["relevance installed"] = run.relevance_installed
    _print_result(
        run.result,
        paths,
        title=f"{run.dataset}: {s.n_queries} queries x top-{s.k}, {run.n_docs} docs "
        f"({run.model}); recall@{s.k} {s.recall_at_k:.3f}, MRR {s.mrr_at_k:.3f}",
    )
    _print_relevance(run.relevance, run.relevance_path)
    if run.staged is not None and (install or not run.staged.gates.passed):
        if install:
            _print_staged(run.staged)
        else:
            typer.echo(
                f"candidate {run.staged.version.id} stored (not promoted without --install); "
                f"failed gates: {', '.join(run.staged.gates.failed)}"
            )
    elif run.staged is not None:
        typer.echo(f"candidate {run.staged.version.id} stored (promote with --install or "
                   f"`ctx eval thresholds promote {run.staged.version.id}`)")  # fmt: skip


@app.command("compare-retrieval")
def compare_retrieval_cmd(
    directory: Annotated[
        Path,
        typer.Argument(
            help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv",
            show_default=False,
        ),
    ],
    limit_queries: Annotated[
        int | None, typer.Option(min=2, help="Use only the first N judged queries.")
    ] = None,
    limit_docs: Annotated[
        int | None,
        typer.Option(min=1, help="Cap the corpus (judged docs kept, distractors trimmed)."),
    ] = None,
    split: Annotated[str, typer.Option(help="qrels/<split>.tsv to read.")] = "test",
    k: Annotated[int, typer.Option(min=1, max=100, help="Documents per query (the @k).")] = 10,
    model: Annotated[str, typer.Option(help="Embedding model (minilm offline, bge-m3).")] = (
        "minilm"
    ),
    modes: Annotated[
        str, typer.Option(help="Comma-separated retrieval modes to compare.")
    ] = "dense,sparse,hybrid",
    train_share: Annotated[
        float,
        typer.Option(min=0.05, max=0.95, help="Share of queries the relevance model is fit on."),
    ] = 0.5,
    relevance_kind: Annotated[
        str,
        typer.Option(
            help="Relevance model: 'auto' (the fitting job picks its candidate by "
            "out-of-fold Brier, as calibrate-beir does) or one candidate: 'logistic', "
            "'logistic_cosine', 'isotonic'."
        ),
    ] = "auto",
    n_boot: Annotated[int, typer.Option(min=0, help="Bootstrap resamples over queries.")] = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the query split and the bootstrap.")] = 0,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
    encoders: Annotated[
        bool,
        typer.Option(
            "--encoders",
            help="Instead: the fp32 torch vs int8 ONNX encoder (CTX_EMBED_BACKEND) side by "
            "side: nDCG@k by exact search and cosine agreement, with the issue's goals.",
        ),
    ] = False,
) -> None:
    """Dense-only vs sparse-only vs hybrid retrieval, and cosine vs p_relevant, in one run.

    The corpus is cut into model-window chunks and indexed once (dense + sparse vectors) into
    a scratch Qdrant Edge collection, deleted afterwards. Every judged query then runs in each
    mode through the router's L3 search, timed round-robin.

    Outputs, in reports/retrieval_<dataset>.{md,json,png}: per mode nDCG@k, recall@k and
    MRR@k with 95 % bootstrap CIs over queries, and search latency p50/p99; the confidence
    signal: AUC of cosine vs p_relevant for telling relevant from irrelevant top-k hits,
    where p_relevant is fitted on a seeded train half of the queries and every figure comes
    from the held-out half (CI over held-out queries), the Brier score and a reliability
    plot; the precision and recall of hits labelled `confident` at each signal's accept
    threshold; and the issue's goals (hybrid recall@k >= 1.15 x dense, AUC >= 0.80) marked
    PASS or FAIL. A mode the library cannot run is skipped, and the report says why.
    """
    from rich.console import Console
    from rich.table import Table

    from evaluation.retrieval_compare import compare_retrieval

    if encoders:
        _compare_encoders(directory, model=model, k=k, limit_docs=limit_docs)
        return
    wanted = tuple(m.strip() for m in modes.split(",") if m.strip())
    console = Console()
    try:
        run = compare_retrieval(
            directory, _settings(), k=k, model=model, limit_queries=limit_queries,
            limit_docs=limit_docs, split=split, modes=wanted, n_boot=n_boot, seed=seed,
            train_share=train_share, relevance_kind=relevance_kind, progress=progress,
            log=lambda msg: console.print(f"[yellow]note:[/] {msg}"),
        )  # fmt: skip
    except (ContextError, ValueError) as e:
        raise _fail(str(e)) from e
    table = Table(
        title=f"{run.dataset}: {run.n_queries} queries, {run.n_docs} docs ({run.model}), "
        f"top-{run.k}, 95 % CI"
    )
    for col in ("mode", f"nDCG@{k}", f"recall@{k}", f"MRR@{k}", "p50 ms", "p99 ms"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for m, r in run.modes.items():
        cells = [
            f"{r.mean[x]:.3f} [{r.ci[x].low:.2f}–{r.ci[x].high:.2f}]"
            for x in ("ndcg", "recall", "mrr")
        ]
        table.add_row(m, *cells, f"{r.latency_ms['p50']:.2f}", f"{r.latency_ms['p99']:.2f}")
    console.print(table)
    for m, c in run.confidence.items():
        parts = [f"{s} {a:.3f}" for s, a in c.auc.items()]
        console.print(f"AUC on held-out {m} hits: {', '.join(parts) or c.skipped}")
    for g in run.goals:
        console.print(f"goal {g.name} {g.target}: {g.measured:.3f} -> [bold]{g.verdict}[/]")
    for name, path in run.report.items():
        console.print(f"{name:>10}: {path}")


def _compare_encoders(directory: Path, *, model: str, k: int, limit_docs: int | None) -> None:
    from rich.console import Console
    from rich.table import Table

    from evaluation.encoder_compare import backend_pair, compare_encoders, rows

    try:
        fp32, int8 = backend_pair(model)
        result = compare_encoders(directory, fp32, int8, k=k, limit_docs=limit_docs)
    except (ContextError, ValueError) as e:
        raise _fail(str(e)) from e
    (row,) = rows([result], k=k)
    table = Table(title=f"{result.dataset}: fp32 torch vs int8 ONNX ({model}), top-{k}")
    for col in row:
        table.add_column(col, justify="left" if col == "dataset" else "right")
    table.add_row(*row.values())
    Console().print(table)
    verdict = "PASS" if result.met else "FAIL"
    typer.echo(f"goal nDCG@{k} within 0.01 of fp32 and mean cosine >= 0.99: {verdict}")


@app.command("export-candidates")
def export_candidates_cmd(
    queries: Annotated[
        Path,
        typer.Argument(
            help="JSONL of queries: {query_id, query} (or BEIR {_id, text}).",
            show_default=False,
        ),
    ],
    k: Annotated[int, typer.Option(min=1, max=100, help="Hits per query.")] = 10,
    out: Annotated[Path, typer.Option(help="CSV to write.")] = Path("candidates.csv"),
    collection: Annotated[
        str | None, typer.Option(help="Collection [default: CTX_COLLECTION_MAIN].")
    ] = None,
) -> None:
    """Write the top-k hits per query as a CSV with an empty 'label' column to annotate.

    Fill 'label' with 1 (relevant) or 0, then run `ctx eval calibrate <file>`.
    """
    from context_core.knowledge.store import SearchQuery
    from context_core.platform import build_platform
    from evaluation.labels import export_candidates, read_queries, write_candidates_csv

    settings = _settings()
    name = collection or settings.collection_main
    try:
        qs = read_queries(queries)
        # the store and the model only: no Redis (no embedding cache), no L2
        with build_platform(settings, with_knowledge=False, embed_cache=False) as platform:
            encoder = platform.encoder
            store = platform.store
            if store.info(name) is None:
                raise _fail(f"collection {name!r} does not exist; run `ctx ingest` first")

            def search(text: str, limit: int) -> Any:
                vec = encoder.encode_query(text).tolist()
                return store.search(vec, SearchQuery(name, limit))

            rows = export_candidates(qs, search, k=k)
        path = write_candidates_csv(rows, out)
    except ContextError as e:
        raise _fail(str(e)) from e
    typer.echo(f"{len(rows)} candidates for {len(qs)} queries written to {path}")


def _date(value: str | None) -> dt.date | None:
    if value is None:
        return None
    try:
        return dt.date.fromisoformat(value)
    except ValueError as e:
        raise typer.BadParameter(f"{value!r} is not a YYYY-MM-DD date") from e


@app.command()
def cer(
    since: Annotated[str | None, typer.Option(help="First day (YYYY-MM-DD), inclusive.")] = None,
    until: Annotated[str | None, typer.Option(help="Last day (YYYY-MM-DD), inclusive.")] = None,
    rules: Annotated[
        Path | None,
        typer.Option(help='JSON rules: [{"name", "pattern", "intents"?, "require_in_context"?}]'),
    ] = None,
    show: Annotated[int, typer.Option(min=0, help="Failing steps to print.")] = 10,
) -> None:
    """Context Effectiveness Rate from the trace files: loaded AND used / all steps.

    Writes reports/cer_report.{md,json} and cer_per_intent.png; prints why steps failed.
    """
    from rich.console import Console
    from rich.table import Table

    from context_core.routing.confidence import ConfidencePolicy
    from evaluation.cer import DEFAULT_RULES, compute_cer, load_rules
    from evaluation.report import write_cer_report

    settings = _settings()
    try:
        policy = ConfidencePolicy.load(settings)
        rule_set = load_rules(rules) if rules else DEFAULT_RULES
        report = compute_cer(
            settings.traces_dir, accept=policy.accept, since=_date(since), until=_date(until),
            rules=rule_set,
        )  # fmt: skip
        paths = write_cer_report(report, settings.reports_dir, accept=policy.accept)
    except ContextError as e:
        raise _fail(str(e)) from e
    console = Console()
    table = Table(title=f"CER from {settings.traces_dir} (accept {policy.accept:.3f})")
    for col in ("slice", "steps", "loaded", "used", "CER"):
        table.add_column(col, justify="left" if col == "slice" else "right")
    rows = [("all", report.overall)] + [(f"intent {k}", v) for k, v in report.by_intent.items()]
    rows += [(f"week {k}", v) for k, v in report.by_week.items()]
    for name, r in rows:
        cer_txt = f"{r.cer:.1%}" if r.n_steps else "n/a"
        table.add_row(name, str(r.n_steps), str(r.n_loaded), str(r.n_used), cer_txt)
    console.print(table)
    for v in report.failures[:show]:
        console.print(f"[red]{v.trace_id[:12]}[/] {v.intent} step {v.step}: {'; '.join(v.reasons)}")
    for name, path in paths.items():
        console.print(f"{name:>10}: {path}")


@app.command()
def health(
    day: Annotated[
        str | None, typer.Option(help="Report day (YYYY-MM-DD) [default: today, UTC].")
    ] = None,
) -> None:
    """Write reports/context_health_report.md (+ PNGs, JSON): L1, L2, L3, CER.

    Re-running on the same day replaces that day's record in the history (idempotent).
    """
    from evaluation.health import run_health_report

    settings = _settings()
    try:
        paths = run_health_report(settings, day=_date(day))
    except ContextError as e:
        raise _fail(str(e)) from e
    for name, path in paths.items():
        typer.echo(f"{name:>12}: {path}")
