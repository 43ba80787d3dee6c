"""`ctx` commands: ingest (knowledge refresh from a Confluence export) and hot-merge."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from context_core.errors import ContextError


def _fail(message: str) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=1)


def ingest(
    path: Annotated[
        Path,
        typer.Argument(
            help="Confluence 'Export space -> HTML' output: the folder holding index.html, "
            "or the .zip itself.",
            show_default=False,
        ),
    ],
    collection: Annotated[
        str | None,
        typer.Option(help="Target collection [default: CTX_COLLECTION_MAIN, knowledge_main]."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="Embedding model: minilm (offline), bge-m3, or a local directory."),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar per stage.")] = True,
) -> None:
    """Refresh L3 knowledge from a Confluence export: parse, chunk, validate, embed, upsert.

    Incremental: pages whose content did not change are skipped; chunks of deleted pages are
    removed. Bad pages are quarantined (see reports/quarantine.jsonl); a failed data-quality
    check stops the run before anything is written.
    """
    from rich.console import Console
    from rich.table import Table

    from context_core.ingest.pipeline import job_settings, run_refresh

    if not path.exists():
        raise _fail(
            f"export {path} does not exist; pass the folder Confluence exported "
            "(it contains index.html) or the .zip"
        )
    try:
        settings = job_settings(collection=collection, model=model)
        summary = run_refresh(path, settings=settings, progress=progress)
    except ContextError as e:
        raise _fail(str(e)) from e

    table = Table(title=f"ingest {summary.export_path} -> {summary.collection} ({summary.model})")
    table.add_column("what")
    table.add_column("count / seconds", justify="right")
    for label, value in (
        ("pages seen", summary.pages_seen),
        ("pages new", summary.pages_new),
        ("pages changed", summary.pages_changed),
        ("pages unchanged", summary.pages_unchanged),
        ("pages deleted", summary.pages_deleted),
        ("pages quarantined", summary.pages_quarantined),
        ("chunks written", summary.chunks_written),
        ("chunks deleted", summary.chunks_deleted),
    ):
        table.add_row(label, f"{value:,}")
    for stage, secs in summary.seconds.items():
        table.add_row(f"{stage} s", f"{secs:.2f}")
    table.add_row("total s", f"{summary.total_seconds:.2f}")
    console = Console()
    console.print(table)
    console.print(f"summary: {settings.reports_dir / 'ingest_summary.json'}")
    if summary.pages_quarantined:
        console.print(f"quarantined pages: {settings.reports_dir / 'quarantine.jsonl'}")


def hot_merge() -> None:
    """Merge confirmed hot answers into knowledge_main and drop expired ones.

    A confirmed, unexpired point in hot_knowledge moves to the main collection unless a
    near-duplicate (cosine >= 0.95) is already there; the daily DAG runs the same code.
    """
    from rich.console import Console

    from context_core.ingest.hot import run_merge
    from context_core.ingest.pipeline import job_settings

    try:
        summary = run_merge(job_settings())
    except ContextError as e:
        raise _fail(str(e)) from e
    Console().print(summary.to_dict())


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command("ingest")(ingest)
    app.command("hot-merge")(hot_merge)
