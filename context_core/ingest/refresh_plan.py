"""The plan half of the knowledge refresh: read the export and the collection, decide what changes.

:func:`plan_refresh` writes nothing; its :class:`RefreshPlan` is applied by
:func:`context_core.ingest.pipeline.apply_refresh`, in the same process (CLI) or after being
staged on disk (:meth:`RefreshPlan.save` / :meth:`RefreshPlan.load`, the Airflow DAG). Split out
of :mod:`context_core.ingest.pipeline`, which re-exports both names; the incremental and
idempotency rules are described there. The plan holds one :class:`PlannedPoint` per chunk to
write (its point id and typed :class:`ChunkPayload`); it becomes a
:class:`~context_core.knowledge.store.PointRecord` only when embedded
(:meth:`PlannedPoint.record`).

Deletes are scoped, because one collection holds many spaces (and the hot merge's confirmed
answers). Every point records its ``scope``: the source identity plus the space key
(:func:`source_scope`). A run only looks at, and only ever deletes, points of the scope(s) it
read; and it deletes whole pages only when the export claims to be the *complete* space (a space
export with its index). A page export or a folder of loose pages never deletes a page it did
not read. Two guards stop a run before anything is written: an export with no readable page
(:class:`~context_core.errors.EmptyExportError`: a wrong or half-mounted path must not read as
"every page was deleted") and a run that would delete more than ``ingest_max_delete_share`` of
a space's pages (:class:`~context_core.errors.MassDeleteError`, overridden by
``allow_deletes``).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from context_core.config import Settings
from context_core.errors import EmptyExportError, IngestError, MassDeleteError
from context_core.fsutil import atomic_write_text
from context_core.ingest.model import Chunk, Page, Quarantined, Section
from context_core.ingest.progress import StageProgress, timed
from context_core.knowledge.store import PointRecord, point_id

if TYPE_CHECKING:
    from context_core.gateway.sanitize import Gateway
    from context_core.knowledge.embedding import Encoder
    from context_core.knowledge.store import SparseVector, Vector, VectorStore

__all__ = [
    "DEFAULT_SOURCE_ID",
    "PLAN_SCHEMA",
    "ChunkPayload",
    "PlannedPoint",
    "RefreshPlan",
    "StoredPage",
    "load_encoder_lazily",
    "new_run_id",
    "owner_space",
    "page_point_id",
    "plan_pages",
    "plan_refresh",
    "source_scope",
]

PLAN_SCHEMA = 2  # 2: scoped deletes (scope, complete, run_id, warnings)
DEFAULT_SOURCE_ID = "confluence-export"


def source_scope(space: str, source_id: str | None = None) -> str:
    """The owner of a page's points: ``"<source id>#<space key>"``.

    ``source_id`` names the Confluence instance (its base URL for the REST source; for HTML
    exports, which carry no instance identity, an operator-chosen name, default
    ``confluence-export``). Two instances that both have a space ``DOC`` need two source ids.
    """
    return f"{source_id or DEFAULT_SOURCE_ID}#{space}"


def new_run_id() -> str:
    """A sortable, unique id for one refresh run (Airflow passes its own run id instead)."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


@dataclass(frozen=True, slots=True)
class ChunkPayload:
    """The payload of one knowledge chunk, as stored with its point (field order = key order).

    ``updated_at`` is ISO 8601 with its zone and ``updated_at_ts`` the same instant in epoch
    seconds; ``content_hash``, ``n_chunks`` and ``model`` make the next run's "unchanged"
    check possible; ``scope`` owns the point (:func:`source_scope`).
    """

    source: str  # the page id
    title: str
    section: str
    heading_path: tuple[str, ...]
    updated_at: str
    updated_at_ts: float
    chunk_index: int
    n_chunks: int
    n_tokens: int
    content_hash: str
    text: str
    model: str
    space: str
    scope: str
    source_file: str  # the page's file name inside the export
    # Confluence REST sync only (left out of the stored payload when empty): the page's or
    # attachment's URL, and for an attachment's chunks the page it hangs on and its title.
    url: str = ""
    page: str = ""
    attachment: str = ""

    @classmethod
    def of(
        cls,
        page: Page,
        chunk: Chunk,
        *,
        n_chunks: int,
        model: str,
        scope: str,
        cites: dict[str, str] | None = None,
    ) -> ChunkPayload:
        """The payload of ``chunk`` of the (cleaned) ``page``; ``cites`` sets the optional
        ``url`` / ``page`` / ``attachment`` fields."""
        updated = page.updated_at
        if updated.tzinfo is None:  # readers promise tz-aware; never store a naive time
            updated = updated.replace(tzinfo=UTC)
        return cls(
            source=page.page_id,
            title=page.title,
            section=chunk.section,
            heading_path=tuple(chunk.heading_path),
            updated_at=updated.isoformat(),
            updated_at_ts=updated.timestamp(),
            chunk_index=chunk.chunk_index,
            n_chunks=n_chunks,
            n_tokens=chunk.n_tokens,
            content_hash=page.content_hash,
            text=chunk.text,
            model=model,
            space=page.space,
            scope=scope,
            source_file=PurePath(page.source_path.split("!/")[-1]).name,
            **(cites or {}),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChunkPayload:
        return cls(**{**data, "heading_path": tuple(data["heading_path"])})

    def to_dict(self) -> dict[str, Any]:
        """The stored (JSON) form: ``heading_path`` as a list."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["heading_path"] = list(self.heading_path)
        for name in _OPTIONAL_CITES:
            if not out[name]:
                del out[name]
        return out


_OPTIONAL_CITES = ("url", "page", "attachment")


def page_point_id(source: str, chunk_index: int, id_prefix: str = "") -> str:
    """The point id of chunk ``chunk_index`` of page ``source``.

    ``id_prefix`` is empty for exports (``point_id(page_id, i)``, as ever) and the site for
    the REST sync (``point_id("<site>|<page id>", i)``): two Confluence sites with the same
    page id never share a point.
    """
    return point_id(f"{id_prefix}|{source}" if id_prefix else source, chunk_index)


@dataclass(frozen=True, slots=True)
class PlannedPoint:
    """One chunk a run will write: its deterministic point id and its payload (no vector).

    Staged on disk as ``{"id": ..., "payload": {...}}`` (:meth:`to_dict`); becomes a
    :class:`~context_core.knowledge.store.PointRecord` only in :meth:`record`, once embedded.
    """

    id: str
    payload: ChunkPayload

    @classmethod
    def of(
        cls,
        page: Page,
        chunk: Chunk,
        *,
        n_chunks: int,
        model: str,
        scope: str,
        id_prefix: str = "",
        cites: dict[str, str] | None = None,
    ) -> PlannedPoint:
        payload = ChunkPayload.of(
            page, chunk, n_chunks=n_chunks, model=model, scope=scope, cites=cites
        )
        return cls(id=page_point_id(page.page_id, chunk.chunk_index, id_prefix), payload=payload)

    @property
    def text(self) -> str:
        """What gets embedded."""
        return self.payload.text

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlannedPoint:
        return cls(id=str(data["id"]), payload=ChunkPayload.from_dict(data["payload"]))

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "payload": self.payload.to_dict()}

    def record(self, vector: Vector, sparse: SparseVector | None = None) -> PointRecord:
        """The point to upsert, once embedded: the one place a plan's point meets the store."""
        return PointRecord(id=self.id, vector=vector, payload=self.payload.to_dict(), sparse=sparse)


@dataclass(slots=True)
class StoredPage:
    """One page of the run's own scope as the collection holds it before the run.

    ``idx`` maps each stored chunk index to its ``(content_hash, model, n_chunks)``.
    """

    space: str
    file: str | None
    title: str | None
    idx: dict[int, tuple[Any, Any, Any]] = field(default_factory=dict)

    def is_current(self, page: Page, model: str) -> bool:
        """Every stored chunk carries the page's hash and model, indexes exactly 0..n-1."""
        values = set(self.idx.values())
        if len(values) != 1:
            return False
        ((h, m, n),) = values
        return (
            h == page.content_hash
            and m == model
            and isinstance(n, int)
            and set(self.idx) == set(range(n))
        )


@dataclass(slots=True)
class RefreshPlan:
    """What a run will write and delete; JSON-serialisable (no vectors)."""

    export_path: str
    collection: str
    model: str
    points: list[PlannedPoint]  # longest text first
    delete_ids: list[str]
    quarantined: list[dict[str, str]]  # {"source_path", "reason"}
    run_id: str = ""
    scopes: dict[str, str] = field(default_factory=dict)  # space key -> scope
    export_kind: str = "space"  # "space" (complete), "page" or "pages" (partial)
    complete: bool = True  # pages missing from the export may be deleted
    allow_deletes: bool = False
    warnings: list[dict[str, str]] = field(default_factory=list)  # {"source_path", "warning"}
    pages_in_scope: int = 0  # pages of the read space(s) in the collection before the run
    pages_seen: int = 0
    pages_new: int = 0
    pages_changed: int = 0
    pages_unchanged: int = 0
    pages_deleted: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def save(self, path: Path) -> Path:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["points"] = [pt.to_dict() for pt in self.points]
        return atomic_write_text(
            path, json.dumps({"schema": PLAN_SCHEMA, **data}, ensure_ascii=False)
        )

    @classmethod
    def load(cls, path: Path) -> RefreshPlan:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise IngestError(f"staged refresh plan {path} is unreadable ({e}); re-run plan") from e
        if data.pop("schema", None) != PLAN_SCHEMA:
            raise IngestError(f"staged refresh plan {path} has another schema; re-run plan")
        points = [PlannedPoint.from_dict(pt) for pt in data.pop("points")]
        return cls(points=points, **data)

    def page_counts(self) -> dict[str, int]:
        """The page counts of a summary (``new + changed + unchanged + quarantined == seen``)."""
        return {
            "pages_seen": self.pages_seen,
            "pages_new": self.pages_new,
            "pages_changed": self.pages_changed,
            "pages_unchanged": self.pages_unchanged,
            "pages_deleted": self.pages_deleted,
            "pages_quarantined": len(self.quarantined),
        }

    def counts(self) -> dict[str, int]:
        """:meth:`page_counts` plus the chunks to write and delete (the plan task's XCom)."""
        return {
            **self.page_counts(),
            "chunks_to_write": len(self.points),
            "chunks_to_delete": len(self.delete_ids),
        }


def owner_space(payload: dict[str, Any], scopes: dict[str, str]) -> str | None:
    """The space key whose scope owns this point, or None when the run must not touch it.

    Points written before scopes existed carry only ``space``: they count as the run's when
    that space is one it read (the next rewrite stamps the scope).
    """
    if payload.get("merged_from"):  # merged hot answers belong to no export page: never touch
        return None
    scope = payload.get("scope")
    space = payload.get("space")
    if scope is not None:
        return str(space) if scopes.get(str(space)) == scope else None
    return str(space) if space is not None and str(space) in scopes else None


def _existing(store: VectorStore, collection: str, scopes: dict[str, str]) -> dict[str, StoredPage]:
    """The run's own pages, by source (page id).

    One scroll; points of other scopes (other spaces, other instances, merged hot answers) are
    left out, so nothing below can plan to delete them.
    """
    if store.info(collection) is None:
        return {}
    out: dict[str, StoredPage] = {}
    for rec in store.scroll(collection, with_vectors=False, batch=1024):
        p = rec.payload
        space = owner_space(p, scopes)
        if space is None:
            continue
        src = str(p.get("source", ""))
        entry = out.get(src)
        if entry is None:
            entry = out[src] = StoredPage(space, p.get("source_file"), p.get("title"))
        entry.idx[int(p.get("chunk_index", -1))] = (
            p.get("content_hash"),
            p.get("model"),
            p.get("n_chunks"),
        )
    return out


def _is_unchanged(page: Page, stored: StoredPage | None, model: str) -> bool:
    return stored is not None and stored.is_current(page, model)


def _clean_page(page: Page, gateway: Gateway) -> Page:
    """Everything that ends up in a payload passes the gateway (PII, secrets)."""
    where = f"ingest:{page.page_id}"

    def c(text: str) -> str:
        return gateway.clean_text(text, where=where)

    return dataclasses.replace(
        page,
        title=c(page.title),
        ancestors=tuple(c(a) for a in page.ancestors),
        sections=tuple(
            Section(tuple(c(h) for h in s.heading_path), c(s.text)) for s in page.sections
        ),
    )


def _chunks_for(page: Page, encoder: Encoder, settings: Settings) -> list[Chunk]:
    from context_core.ingest.chunking import chunk_page

    return list(
        chunk_page(
            page,
            encoder,
            max_tokens=settings.chunk_max_tokens,
            overlap=settings.chunk_overlap_tokens,
        )
    )


def _read_export(
    export_path: Path, settings: Settings, space: str | None
) -> Iterator[Page | Quarantined]:
    from context_core.ingest.confluence import read_html_export

    return read_html_export(
        export_path,
        max_page_bytes=settings.max_page_bytes,
        max_export_bytes=settings.max_export_bytes,
        max_markup_depth=settings.max_markup_depth,
        space=space,
    )


def _guard_deletes(
    gone: list[str],
    existing: dict[str, StoredPage],
    *,
    share: float,
    allow: bool,
    export: Path | str,
    fix: str = "if the export is incomplete, fix the export path.",
) -> None:
    """Refuse a run that would delete more than ``share`` of any space's pages.

    ``export`` names what the pages are missing from; ``fix`` the advice when that source,
    not the space, is at fault."""
    if allow or not gone:
        return
    for space in sorted({e.space for e in existing.values()}):
        in_scope = sum(1 for e in existing.values() if e.space == space)
        doomed = [src for src in gone if existing[src].space == space]
        if in_scope and len(doomed) / in_scope > share:
            sample = ", ".join(f"{src} ({existing[src].title or '?'})" for src in doomed[:5])
            more = f" and {len(doomed) - 5} more" if len(doomed) > 5 else ""
            raise MassDeleteError(
                f"refusing to delete {len(doomed)} of {in_scope} pages "
                f"({len(doomed) / in_scope:.0%}) of space {space!r}: more than the allowed "
                f"{share:.0%} (CTX_INGEST_MAX_DELETE_SHARE). They are missing from {export}: "
                f"{sample}{more}. Nothing was written. If the pages really were removed, re-run "
                f"with --allow-deletes (DAG param allow_deletes=true); {fix}",
                would_delete=len(doomed),
                in_scope=in_scope,
            )


def _describe(export: Path, settings: Settings) -> tuple[str, bool]:
    """(kind, complete) of an HTML export: only a space export's index vouches for deletes."""
    from context_core.ingest.confluence import describe_export

    info = describe_export(export, max_page_bytes=settings.max_page_bytes)
    return info.kind, info.complete


def plan_refresh(
    export_path: Path | str,
    *,
    settings: Settings,
    store: VectorStore,
    encoder: Encoder | None = None,
    gateway: Gateway | None = None,
    collection: str | None = None,
    progress: bool = False,
    encoder_factory: Callable[[], Encoder] | None = None,
    chunker: Callable[[Page], list[Chunk]] | None = None,
    space: str | None = None,
    source_id: str | None = None,
    allow_deletes: bool = False,
    run_id: str | None = None,
) -> RefreshPlan:
    """Read the export and the collection; decide what to write and delete. Writes nothing.

    ``space`` overrides the export's space key, ``source_id`` names the Confluence instance
    (see :func:`source_scope`). Raises :class:`EmptyExportError` when no page is readable and
    :class:`MassDeleteError` when the run would delete more than
    ``settings.ingest_max_delete_share`` of a space's pages and ``allow_deletes`` is false.

    The encoder is only needed (and only loaded, via ``encoder_factory``) when some page must
    be chunked: an unchanged re-run never touches the model. ``chunker`` replaces the
    heading-aware token chunker (tests use it to prove the quality gate catches a bad one).
    Raises DataValidationError when the chunk suite fails (naming the rows) and IngestError
    when the export is unreadable. The guards run before any chunking or model loading.
    """
    from context_core.gateway.sanitize import Gateway as _Gateway

    export = _existing_export(export_path)
    collection = collection or settings.collection_main
    gateway = gateway or _Gateway.from_settings(settings)
    model = encoder.name if encoder is not None else _model_name(settings, store, collection)
    seconds: dict[str, float] = {s: 0.0 for s in ("parse", "chunk", "validate")}
    run_id = run_id or new_run_id()
    kind, complete = _describe(export, settings)

    with StageProgress(progress) as bar:
        with timed(seconds, "parse"):
            seen = _read_run(export, settings, store, collection, space, source_id, bar)
        # Whole pages are deleted only when the export vouches for the whole space.
        return _plan_seen(
            seen,
            gone=seen.gone() if complete else [],
            settings=settings,
            store=store,
            collection=collection,
            source=str(export),
            kind=kind,
            complete=complete,
            encoder=encoder,
            gateway=gateway,
            model=model,
            encoder_factory=encoder_factory,
            chunker=chunker,
            allow_deletes=allow_deletes,
            run_id=run_id,
            seconds=seconds,
            bar=bar,
        )


def plan_pages(
    items: Iterable[Page | Quarantined],
    *,
    space: str,
    source_id: str,
    kept: set[str],
    settings: Settings,
    store: VectorStore,
    source: str,
    encoder: Encoder | None = None,
    gateway: Gateway | None = None,
    collection: str | None = None,
    encoder_factory: Callable[[], Encoder] | None = None,
    allow_deletes: bool = False,
    run_id: str | None = None,
    cites: dict[str, dict[str, str]] | None = None,
    seconds: dict[str, float] | None = None,
) -> RefreshPlan:
    """The plan of a live source (the Confluence REST sync): ``items`` are the pages it
    re-read, ``kept`` the ids it knows are still there unchanged (not re-read). Writes nothing.

    Every stored page of the scope that is neither in ``items`` nor in ``kept`` is gone and is
    deleted, under the same mass-delete guard as an export (``source`` names the site and space
    in its message). Point ids are site-scoped (:func:`page_point_id` with ``source_id``).
    """
    from context_core.gateway.sanitize import Gateway as _Gateway

    collection = collection or settings.collection_main
    gateway = gateway or _Gateway.from_settings(settings)
    model = encoder.name if encoder is not None else _model_name(settings, store, collection)
    seconds = {s: 0.0 for s in ("parse", "chunk", "validate")} | (seconds or {})
    pages: dict[str, Page] = {}
    quarantined: list[dict[str, str]] = []
    for item in items:
        if isinstance(item, Quarantined):
            quarantined.append({"source_path": item.source_path, "reason": item.reason})
        else:
            pages[item.page_id] = item
    scopes = {space: source_scope(space, source_id)}
    existing = _existing(store, collection, scopes)
    seen = _Seen(
        pages,
        quarantined,
        scopes,
        existing,
        n_seen=len(pages) + len(quarantined) + len(kept),
        kept=set(kept),
        id_prefix=source_id,
    )
    with StageProgress(False) as bar:
        return _plan_seen(
            seen,
            gone=seen.gone(),
            settings=settings,
            store=store,
            collection=collection,
            source=source,
            kind="confluence",
            complete=True,
            encoder=encoder,
            gateway=gateway,
            model=model,
            encoder_factory=encoder_factory,
            chunker=None,
            allow_deletes=allow_deletes,
            run_id=run_id or new_run_id(),
            seconds=seconds,
            bar=bar,
            cites=cites,
            fix="if pages are missing because the syncing account lost access to them, "
            "restore its permission on the space in Confluence.",
        )


def _plan_seen(
    seen: _Seen,
    *,
    gone: list[str],
    settings: Settings,
    store: VectorStore,
    collection: str,
    source: str,
    kind: str,
    complete: bool,
    encoder: Encoder | None,
    gateway: Gateway,
    model: str,
    encoder_factory: Callable[[], Encoder] | None,
    chunker: Callable[[Page], list[Chunk]] | None,
    allow_deletes: bool,
    run_id: str,
    seconds: dict[str, float],
    bar: StageProgress,
    cites: dict[str, dict[str, str]] | None = None,
    fix: str | None = None,
) -> RefreshPlan:
    """Guard, chunk and validate what a run read; the plan (shared by exports and the sync)."""
    _guard_deletes(
        gone,
        seen.existing,
        share=settings.ingest_max_delete_share,
        allow=allow_deletes,
        export=source,
        **({"fix": fix} if fix else {}),
    )
    warnings = _date_warnings(seen.pages)  # before chunking drops pages with no text
    todo = seen.changed(model)
    if todo and encoder is None and chunker is None:
        with timed(seconds, "load_model"):  # a per-process cost, kept out of "chunk"
            encoder = (
                encoder_factory()
                if encoder_factory
                else load_encoder_lazily(settings, store, collection)
            )
        model = encoder.name
    with timed(seconds, "chunk"):
        chunk = chunker or _token_chunker(encoder, settings)
        chunked = _chunk_pages(
            todo,
            chunk,
            bar,
            gateway=gateway,
            model=model,
            scopes=seen.scopes,
            id_prefix=seen.id_prefix,
            cites=cites,
        )
        seen.quarantine_empty(chunked.empty)
    with timed(seconds, "validate"):
        _validate(chunked.points, chunked.source_paths, settings)

    return RefreshPlan(
        export_path=source,
        collection=collection,
        model=model,
        # Longest texts first: each embedding batch holds texts of similar length (less padding)
        points=sorted(chunked.points, key=lambda pt: -len(pt.text)),
        delete_ids=chunked.stale_ids(seen.existing, seen.id_prefix) + seen.gone_ids(gone),
        quarantined=seen.quarantined,
        run_id=run_id,
        scopes=seen.scopes,
        export_kind=kind,
        complete=complete,
        allow_deletes=allow_deletes,
        warnings=warnings,
        seconds=seconds,
        **seen.page_counts(chunked.written, gone),
    )


# The steps of plan_refresh, in the order it runs them.


def _existing_export(export_path: Path | str) -> Path:
    export = Path(export_path).expanduser()
    if not export.exists():
        raise IngestError(
            f"export {export} does not exist; pass a Confluence HTML space export "
            "(a folder with index.html, or its .zip)"
        )
    return export


@dataclass(slots=True)
class _Seen:
    """What the run read: the export's pages and the collection's pages of the same scopes."""

    pages: dict[str, Page]  # page id -> page (readable, first of its id)
    quarantined: list[dict[str, str]]  # {"source_path", "reason"}
    scopes: dict[str, str]  # space key -> scope
    existing: dict[str, StoredPage]  # source -> the stored page of the run's scopes
    n_seen: int  # page files read, quarantined ones included
    kept: set[str] = field(default_factory=set)  # sources still there but not re-read (REST)
    id_prefix: str = ""  # see page_point_id

    def gone(self) -> list[str]:
        """Stored pages the (complete) export no longer has; a page merely quarantined this
        time keeps its last good chunks."""
        q_files = {PurePath(q["source_path"].split("!/")[-1]).name for q in self.quarantined}
        return [
            src
            for src, entry in self.existing.items()
            if src not in self.pages and src not in self.kept and entry.file not in q_files
        ]

    def gone_ids(self, gone: list[str]) -> list[str]:
        """Every stored chunk of the pages that left the export."""
        return [
            page_point_id(src, i, self.id_prefix)
            for src in gone
            for i in sorted(self.existing[src].idx)
        ]

    def changed(self, model: str) -> list[Page]:
        """The pages to chunk: new, changed, or stored with another model or a torn write."""
        return [
            p
            for p in self.pages.values()
            if not _is_unchanged(p, self.existing.get(p.page_id), model)
        ]

    def quarantine_empty(self, empty: list[Page]) -> None:
        for page in empty:
            self.quarantined.append(
                {"source_path": page.source_path, "reason": "no text left to chunk"}
            )
            del self.pages[page.page_id]

    def page_counts(self, written: list[Page], gone: list[str]) -> dict[str, int]:
        """The plan's page counts, once chunking has dropped the pages with no text."""
        n_new = sum(1 for p in written if p.page_id not in self.existing)
        return {
            "pages_in_scope": len(self.existing),
            "pages_seen": self.n_seen,
            "pages_new": n_new,
            "pages_changed": len(written) - n_new,
            "pages_unchanged": len(self.pages) - len(written) + len(self.kept),
            "pages_deleted": len(gone),
        }


def _read_run(
    export: Path,
    settings: Settings,
    store: VectorStore,
    collection: str,
    space: str | None,
    source_id: str | None,
    bar: StageProgress,
) -> _Seen:
    """Parse the export (a repeated page id is quarantined), then scroll the collection for
    the stored pages of the spaces read. Raises :class:`EmptyExportError` when no page is
    readable."""
    pages: dict[str, Page] = {}
    quarantined: list[dict[str, str]] = []
    task = bar.stage("parse", None)
    for item in _read_export(export, settings, space):
        bar.advance(task)
        if isinstance(item, Quarantined):
            quarantined.append({"source_path": item.source_path, "reason": item.reason})
        elif item.page_id in pages:
            quarantined.append(
                {
                    "source_path": item.source_path,
                    "reason": f"duplicate page id {item.page_id} (first seen in "
                    f"{pages[item.page_id].source_path})",
                }
            )
        else:
            pages[item.page_id] = item
    bar.finish(task)
    if not pages:
        raise EmptyExportError(_empty_message(export, quarantined))
    scopes = {sp: source_scope(sp, source_id) for sp in sorted({p.space for p in pages.values()})}
    existing = _existing(store, collection, scopes)
    return _Seen(pages, quarantined, scopes, existing, n_seen=len(pages) + len(quarantined))


def _date_warnings(pages: dict[str, Page]) -> list[dict[str, str]]:
    """One warning per page whose date fell back to the file's modification time."""
    return [
        {
            "source_path": p.source_path,
            "warning": p.date_note
            or "no parseable last-modified date; the file modification time was used",
        }
        for p in pages.values()
        if p.date_source == "mtime"
    ]


def _token_chunker(encoder: Encoder | None, settings: Settings) -> Callable[[Page], list[Chunk]]:
    """The heading-aware token chunker; the encoder is loaded whenever a page is to be chunked."""

    def chunk(page: Page) -> list[Chunk]:
        assert encoder is not None
        return _chunks_for(page, encoder, settings)

    return chunk


@dataclass(slots=True)
class _Chunked:
    """What chunking the changed pages produced."""

    points: list[PlannedPoint] = field(default_factory=list)
    source_paths: list[str] = field(default_factory=list)  # the page file of each point
    written: list[Page] = field(default_factory=list)  # pages that yielded chunks
    n_chunks: dict[str, int] = field(default_factory=dict)  # page id -> its chunk count
    empty: list[Page] = field(default_factory=list)  # pages with no text left to chunk

    def stale_ids(self, existing: dict[str, StoredPage], id_prefix: str = "") -> list[str]:
        """Chunk indexes a rewritten page no longer has."""
        out: list[str] = []
        for page in self.written:
            stored = existing.get(page.page_id)
            if stored:
                n = self.n_chunks[page.page_id]
                out += [
                    page_point_id(page.page_id, i, id_prefix) for i in sorted(stored.idx) if i >= n
                ]
        return out


def _chunk_pages(
    todo: list[Page],
    chunk: Callable[[Page], list[Chunk]],
    bar: StageProgress,
    *,
    gateway: Gateway,
    model: str,
    scopes: dict[str, str],
    id_prefix: str = "",
    cites: dict[str, dict[str, str]] | None = None,
) -> _Chunked:
    """Clean each new or changed page through the gateway and plan a point per chunk."""
    out = _Chunked()
    task = bar.stage("chunk", len(todo))
    for page in todo:
        bar.advance(task)
        clean = _clean_page(page, gateway)
        chunks = chunk(clean)
        if not chunks:
            out.empty.append(page)
            continue
        out.written.append(page)
        out.n_chunks[page.page_id] = len(chunks)
        scope = scopes[page.space]
        for ch in chunks:
            out.points.append(
                PlannedPoint.of(
                    clean,
                    ch,
                    n_chunks=len(chunks),
                    model=model,
                    scope=scope,
                    id_prefix=id_prefix,
                    cites=(cites or {}).get(page.page_id),
                )
            )
            out.source_paths.append(page.source_path)
    bar.finish(task)
    return out


def _validate(points: list[PlannedPoint], source_paths: list[str], settings: Settings) -> None:
    """The chunk quality gate (raises DataValidationError naming the failing rows)."""
    if not points:  # nothing to write -> nothing to gate (and no GX start-up cost)
        return
    from context_core.ingest.validation import validate_chunks

    rows = [
        {
            "row_id": f"{path}#{pt.payload.chunk_index}",
            "point_id": pt.id,
            "source": pt.payload.source,
            "section": pt.payload.section,
            "text": pt.payload.text,
            "n_tokens": pt.payload.n_tokens,
            "updated_at": pt.payload.updated_at,
        }
        for pt, path in zip(points, source_paths, strict=True)
    ]
    validate_chunks(rows, max_tokens=settings.chunk_max_tokens)


def _empty_message(export: Path, quarantined: list[dict[str, str]]) -> str:
    reasons = "".join(f"\n  - {q['source_path']}: {q['reason']}" for q in quarantined[:5])
    more = f"\n  ... and {len(quarantined) - 5} more" if len(quarantined) > 5 else ""
    what = (
        f"all {len(quarantined)} page files were quarantined:{reasons}{more}"
        if quarantined
        else "no page file was found"
    )
    return (
        f"export {export} holds no readable Confluence page ({what}). Nothing was written or "
        "deleted. Check the path: it must be a Confluence HTML export (a space export's folder "
        "holding index.html and the page files, a page export, or the .zip of either)."
    )


def _model_name(settings: Settings, store: VectorStore, collection: str) -> str:
    """The name an encoder for these settings will report on ``collection``, without loading
    the model (``CTX_EMBED_BACKEND=auto`` follows the backend the collection records)."""
    from context_core.knowledge.embedding import MODEL_REGISTRY, auto_backend, recorded_encoder
    from context_core.knowledge.onnx_encoder import encoder_name

    if settings.embed_model in MODEL_REGISTRY:
        model = MODEL_REGISTRY[settings.embed_model].name
    else:
        model = str(Path(settings.embed_model).expanduser().resolve())
    recorded = recorded_encoder(store, collection) if settings.embed_backend == "auto" else None
    return encoder_name(model, auto_backend(settings, recorded))


def load_encoder_lazily(
    settings: Settings, store: VectorStore | None = None, collection: str | None = None
) -> Encoder:
    """The settings' encoder; the embedding stack is imported only when a page needs it.
    With ``store``, ``CTX_EMBED_BACKEND=auto`` follows the backend ``collection`` (default:
    the main collection) was built with."""
    from context_core.knowledge.embedding import load_encoder, recorded_encoder

    recorded = None
    if store is not None and settings.embed_backend == "auto":
        recorded = recorded_encoder(store, collection or settings.collection_main)
    return load_encoder(settings, recorded=recorded)
