"""`ctx` commands: ingest (knowledge refresh from a Confluence export) and hot-merge."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from context_core.errors import ContextError

if TYPE_CHECKING:
    from context_core.ingest.pipeline import RefreshSummary


def _fail(message: str) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=1)


def ingest(
    path: Annotated[
        Path | None,
        typer.Argument(
            help="Confluence 'Export space -> HTML' output: the folder holding index.html, "
            "or the .zip itself. Leave out with --confluence-url.",
            show_default=False,
        ),
    ] = None,
    collection: Annotated[
        str | None,
        typer.Option(help="Target collection [default: CTX_COLLECTION_MAIN, knowledge_main]."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="Embedding model: minilm (offline), bge-m3, or a local directory."),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar per stage.")] = True,
    space: Annotated[
        list[str] | None,
        typer.Option(
            help="Space key. With --confluence-url: a space to sync (repeat for several). "
            "With an export: its key [default: 'Key' in index.html, else the name]."
        ),
    ] = None,
    confluence_url: Annotated[
        str | None,
        typer.Option(
            help="Sync straight from this Confluence site instead of an export: "
            "https://<site>.atlassian.net/wiki (Cloud) or https://host[/context] (Data "
            "Center). Credentials come from CTX_CONFLUENCE_USER + CTX_CONFLUENCE_TOKEN "
            "(Cloud) or CTX_CONFLUENCE_TOKEN alone (Data Center), never from the command line.",
            show_default=False,
        ),
    ] = None,
    source_id: Annotated[
        str | None,
        typer.Option(
            help="Name of the Confluence instance the export came from; needed only when two "
            "instances have a space with the same key [default: confluence-export]."
        ),
    ] = None,
    allow_deletes: Annotated[
        bool,
        typer.Option(
            "--allow-deletes",
            help="Let this run delete more than CTX_INGEST_MAX_DELETE_SHARE (20%) of the "
            "space's pages (pages really removed from Confluence).",
        ),
    ] = False,
) -> None:
    """Refresh L3 knowledge from a Confluence export: parse, chunk, validate, embed, upsert.

    Incremental: pages whose content did not change are skipped. Deletes are scoped: only
    pages of the space this export holds are ever deleted, and only when a complete space
    export no longer has them; other spaces and merged hot answers in the collection are never
    touched. The run stops before writing anything when the export has no readable page or
    would delete more than 20% of the space (override with --allow-deletes). Bad pages are
    quarantined (appended to reports/quarantine.jsonl with the run id); a failed data-quality
    check stops the run before anything is written. Remove a whole space with
    `ctx remove-space KEY`.
    """
    from context_core.ingest.pipeline import job_settings, run_refresh

    if confluence_url is not None:
        if path is not None:
            raise _fail("pass either an export path or --confluence-url, not both")
        if source_id is not None:
            raise _fail("--source-id is for exports; a site is named by its --confluence-url")
        _sync(confluence_url, space or [], collection, model, allow_deletes)
        return
    if path is None:
        raise _fail("pass an export path, or --confluence-url URL --space KEY to sync a site")
    if space and len(space) > 1:
        raise _fail("an export holds one space: pass --space once (or use --confluence-url)")
    if not path.exists():
        raise _fail(
            f"export {path} does not exist; pass the folder Confluence exported "
            "(it contains index.html) or the .zip"
        )
    try:
        settings = job_settings(collection=collection, model=model)
        summary = run_refresh(
            path,
            settings=settings,
            progress=progress,
            space=space[0] if space else None,
            source_id=source_id,
            allow_deletes=allow_deletes,
        )
    except ContextError as e:
        raise _fail(str(e)) from e
    _print_summary(summary, settings.reports_dir / "ingest_summary.json")


def _sync(
    url: str, spaces: list[str], collection: str | None, model: str | None, allow_deletes: bool
) -> None:
    """``ctx ingest --confluence-url``: sync the spaces, then one table per space."""
    from context_core.ingest.pipeline import job_settings
    from context_core.ingest.sync import sync_confluence

    if not spaces:
        raise _fail("--confluence-url needs at least one --space KEY")
    try:
        settings = job_settings(collection=collection, model=model)
        results = sync_confluence(settings, url, spaces, allow_deletes=allow_deletes)
    except ContextError as e:
        raise _fail(str(e)) from e
    for r in results:
        skipped = ", ".join(f"{k} {v}" for k, v in r.attachments_skipped.items()) or "none"
        _print_summary(
            r.summary,
            settings.reports_dir / "ingest_summary.json",
            extra=(
                ("pages listed", f"{r.pages_listed:,}"),
                ("bodies fetched", f"{r.bodies_fetched:,}"),
                ("attachments ingested", f"{r.attachments_ingested:,}"),
                ("attachments unchanged", f"{r.attachments_unchanged:,}"),
                ("attachments skipped", skipped),
                ("HTTP requests (run)", f"{r.requests['requests']:,}"),
                ("retries / throttled", f"{r.requests['retries']} / {r.requests['throttled']}"),
            ),
        )
        typer.echo(f"cursor: {r.cursor_file}")
    typer.echo(f"sync report: {settings.reports_dir / 'confluence_sync.json'}")


def _print_summary(
    summary: RefreshSummary, summary_file: Path, extra: tuple[tuple[str, str], ...] = ()
) -> None:
    """The run's counts and stage times as a table, then where its reports are."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"ingest {summary.export_path} -> {summary.collection} ({summary.model})")
    table.add_column("what")
    table.add_column("count / seconds", justify="right")
    table.add_row("run id", summary.run_id)
    table.add_row("scope", ", ".join(summary.scopes.values()))
    kind = "complete" if summary.complete else "partial"
    table.add_row("export", f"{summary.export_kind} ({kind})")
    for label, value in (
        ("pages of the space before", summary.pages_in_scope),
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
    for label, text in extra:
        table.add_row(label, text)
    for stage, secs in summary.seconds.items():
        table.add_row(f"{stage} s", f"{secs:.2f}")
    table.add_row("total s", f"{summary.total_seconds:.2f}")
    console = Console()
    console.print(table)
    console.print(f"summary: {summary_file}")
    if not summary.complete and summary.export_kind != "confluence":
        console.print(
            "partial export (no space index): pages missing from it were kept, none deleted"
        )
    if summary.pages_quarantined or summary.warnings:
        console.print(
            f"quarantined pages / warnings: {summary.quarantine_file} (run {summary.run_id})"
        )


def remove_space(
    space: Annotated[str, typer.Argument(help="Key of the space to remove.", show_default=False)],
    collection: Annotated[
        str | None,
        typer.Option(help="Collection [default: CTX_COLLECTION_MAIN, knowledge_main]."),
    ] = None,
    source_id: Annotated[
        str | None,
        typer.Option(
            help="Instance name the space was ingested with [default: confluence-export]."
        ),
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Delete without asking for confirmation.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only count; delete nothing.")] = False,
) -> None:
    """Delete every chunk of one space from L3, and nothing else.

    A refresh never removes a space as a side effect; this command is the one way to. Other
    spaces and merged hot answers in the collection are left alone.
    """
    from rich.console import Console

    from context_core.ingest.pipeline import job_settings
    from context_core.ingest.pipeline import remove_space as _remove

    console = Console()
    try:
        settings = job_settings(collection=collection)
        found = _remove(space, settings=settings, source_id=source_id, dry_run=True)
        console.print(
            f"space {space!r} ({found.scope}) in {found.collection}: "
            f"{found.pages:,} pages, {found.chunks:,} chunks"
        )
        if dry_run or not found.chunks:
            console.print("nothing deleted" + (" (dry run)" if dry_run and found.chunks else ""))
            return
        if not yes and not typer.confirm(f"delete these {found.chunks:,} chunks?", default=False):
            raise _fail("aborted: nothing deleted (pass --yes to skip the question)")
        done = _remove(space, settings=settings, source_id=source_id)
    except ContextError as e:
        raise _fail(str(e)) from e
    console.print(f"deleted {done.pages:,} pages, {done.chunks:,} chunks of space {space!r}")


def hot_merge() -> None:
    """Merge confirmed hot answers into knowledge_main and drop expired ones.

    A confirmed, unexpired point in hot_knowledge moves to the main collection unless a
    near-duplicate (cosine >= 0.95) is already there; the daily DAG runs the same code.
    """
    from rich.console import Console

    from context_core.ingest.pipeline import job_settings
    from context_core.platform import run_hot_merge

    try:
        summary = run_hot_merge(job_settings())
    except ContextError as e:
        raise _fail(str(e)) from e
    Console().print(summary.to_dict())


def unscoped_merged(
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Delete without asking for confirmation.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only count; delete nothing.")] = False,
) -> None:
    """Find (and delete) merged answers in knowledge_main that carry no namespace.

    knowledge_main is shared by every organisation of a deployment. Answers merged before
    merges kept their scope have `merged_from` set and no `namespace`: nobody can tell whose
    they are, so no reader is shown them; this removes them (docs/security.md). Curated
    (ingested) chunks are never touched.
    """
    from rich.console import Console

    from context_core.ingest.hot import unscoped_merged as _find
    from context_core.ingest.pipeline import job_settings
    from context_core.knowledge import open_store

    console = Console()
    try:
        settings = job_settings()
        main = settings.collection_main
        store = open_store(settings)
        try:
            found = _find(store, main)
            console.print(f"{len(found):,} unscoped merged answer(s) in {main}")
            if dry_run or not found:
                console.print("nothing deleted" + (" (dry run)" if dry_run and found else ""))
                return
            if not yes and not typer.confirm(f"delete these {len(found):,}?", default=False):
                raise _fail("aborted: nothing deleted (pass --yes to skip the question)")
            done = _find(store, main, delete=True)
        finally:
            store.close()
    except ContextError as e:
        raise _fail(str(e)) from e
    console.print(f"deleted {len(done):,} unscoped merged answer(s)")


def add_sparse(
    collection: Annotated[
        str | None,
        typer.Option(help="Collection [default: CTX_COLLECTION_MAIN, knowledge_main]."),
    ] = None,
    hot: Annotated[
        bool, typer.Option(help="Also the hot collection (CTX_COLLECTION_HOT), if it exists.")
    ] = True,
) -> None:
    """Add sparse (BM25) vectors to a collection built before hybrid retrieval.

    The dense vectors are not re-embedded or rewritten: the sparse vector is added to the
    collection in place and set on every point from its stored text. Safe to interrupt and
    re-run (points that have one are skipped). `ctx ingest` does the same by itself when it
    refreshes a dense-only collection.
    """
    from rich.console import Console

    from context_core.ingest.add_sparse import add_sparse_vectors
    from context_core.ingest.pipeline import job_settings
    from context_core.knowledge import open_store

    console = Console()
    try:
        settings = job_settings(collection=collection)
        store = open_store(settings)
        try:
            names = [settings.collection_main]
            if hot and store.info(settings.collection_hot) is not None:
                names.append(settings.collection_hot)
            for name in names:
                console.print(add_sparse_vectors(store, name).to_dict())
        finally:
            store.close()
    except ContextError as e:
        raise _fail(str(e)) from e


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command("ingest")(ingest)
    app.command("add-sparse")(add_sparse)
    app.command("remove-space")(remove_space)
    app.command("hot-merge")(hot_merge)
    app.command("unscoped-merged")(unscoped_merged)
