"""The knowledge refresh: parse -> chunk -> validate -> embed -> upsert, incremental and idempotent.

Why two halves: :func:`plan_refresh` reads the export and the collection and decides what must
change (nothing is written); :func:`apply_refresh` embeds and writes. The Airflow DAG runs the
halves as separate tasks with the plan staged on disk (texts, never vectors, and only the path
travels through XCom); the CLI runs both in one process via :func:`run_refresh`.

Incremental: each point carries its page's ``content_hash``, ``n_chunks`` and the model name. A
page is *unchanged* when every stored chunk carries the page's current hash and model and the
stored chunk indexes are exactly ``0..n_chunks-1``; such a page is neither chunked nor embedded.
Everything else is rewritten, and chunk indexes a page no longer has are deleted, as are all
chunks of pages that left the export (but not of pages merely quarantined this time: a page
that fails to parse keeps its last good version).

Idempotent: point ids are ``point_id(page_id, chunk_index)`` (UUIDv5), upserts overwrite, and
deletions run after all upserts. A run killed halfway leaves pages with mixed hashes, which the
next run sees as changed and rewrites completely, so it ends with exactly the points a clean run
would have written.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from context_core.config import Settings, get_settings
from context_core.errors import IngestError
from context_core.ingest.model import Chunk, Page, Quarantined, Section
from context_core.knowledge.store import PointRecord, point_id

if TYPE_CHECKING:
    from context_core.embedding import Encoder
    from context_core.gateway import Gateway
    from context_core.knowledge.store import VectorStore

__all__ = [
    "STAGES",
    "RefreshPlan",
    "RefreshSummary",
    "apply_refresh",
    "apply_staged",
    "job_settings",
    "plan_refresh",
    "run_refresh",
    "sample_export_path",
    "stage_plan",
]

log = logging.getLogger(__name__)

STAGES = ("parse", "chunk", "validate", "embed", "upsert")
PLAN_SCHEMA = 1


def sample_export_path() -> Path:
    """The small equipment-maintenance space shipped with the package (quickstart, tests)."""
    return Path(__file__).resolve().parents[1] / "sample_data" / "confluence" / "EQM"


def job_settings(
    *, collection: str | None = None, model: str | None = None, qdrant_url: str | None = None
) -> Settings:
    """Settings from ``CTX_*`` with a job's overrides (DAG params, CLI options) on top."""
    overrides: dict[str, Any] = {}
    if collection:
        overrides["collection_main"] = collection
    if model:
        overrides["embed_model"] = model
    if qdrant_url:
        overrides["qdrant_url"] = qdrant_url
    return get_settings(**overrides)


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class RefreshPlan:
    """What a run will write and delete; JSON-serialisable (no vectors)."""

    export_path: str
    collection: str
    model: str
    points: list[dict[str, Any]]  # {"id": uuid, "payload": {...}}, sorted by text length
    delete_ids: list[str]
    quarantined: list[dict[str, str]]  # {"source_path", "reason"}
    pages_seen: int = 0
    pages_new: int = 0
    pages_changed: int = 0
    pages_unchanged: int = 0
    pages_deleted: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        data = {"schema": PLAN_SCHEMA, **dataclasses.asdict(self)}
        tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: Path) -> RefreshPlan:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise IngestError(f"staged refresh plan {path} is unreadable ({e}); re-run plan") from e
        if data.pop("schema", None) != PLAN_SCHEMA:
            raise IngestError(f"staged refresh plan {path} has another schema; re-run plan")
        return cls(**data)

    def counts(self) -> dict[str, int]:
        return {
            "pages_seen": self.pages_seen,
            "pages_new": self.pages_new,
            "pages_changed": self.pages_changed,
            "pages_unchanged": self.pages_unchanged,
            "pages_deleted": self.pages_deleted,
            "pages_quarantined": len(self.quarantined),
            "chunks_to_write": len(self.points),
            "chunks_to_delete": len(self.delete_ids),
        }


@dataclass(frozen=True, slots=True)
class RefreshSummary:
    """The outcome of one refresh; also written to ``<reports_dir>/ingest_summary.json``.

    ``pages_seen`` counts every page file read, so
    ``new + changed + unchanged + quarantined == seen``. ``seconds`` has one entry per stage
    (:data:`STAGES`) plus ``load_model`` when the run had to load the embedding model.
    """

    export_path: str
    collection: str
    model: str
    pages_seen: int
    pages_new: int
    pages_changed: int
    pages_unchanged: int
    pages_deleted: int
    pages_quarantined: int
    chunks_written: int
    chunks_deleted: int
    seconds: dict[str, float]
    finished_at: str = ""

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total_seconds": round(self.total_seconds, 3)}


# --------------------------------------------------------------------------------------------
# Progress: rich bars for the CLI, nothing for Airflow/tests.
# --------------------------------------------------------------------------------------------


class _Progress:
    def __init__(self, enabled: bool) -> None:
        self._bar: Any = None
        if enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(
                TextColumn("[bold]{task.description:<9}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                transient=False,
            )

    def __enter__(self) -> _Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def stage(self, name: str, total: int | None) -> Any:
        return None if self._bar is None else self._bar.add_task(name, total=total)

    def advance(self, task: Any, n: int = 1) -> None:
        if task is not None:
            self._bar.advance(task, n)

    def finish(self, task: Any) -> None:
        if task is not None:
            t = self._bar.tasks[task]
            self._bar.update(task, total=t.completed or 0, completed=t.completed or 0)


@contextmanager
def _timed(seconds: dict[str, float], stage: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - t0


# --------------------------------------------------------------------------------------------
# Plan
# --------------------------------------------------------------------------------------------


def _existing(store: VectorStore, collection: str) -> dict[str, dict[str, Any]]:
    """``{source: {"idx": {chunk_index: (hash, model, n_chunks)}, "file": name}}``, one scroll."""
    if store.info(collection) is None:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for rec in store.scroll(collection, with_vectors=False, batch=1024):
        p = rec.payload
        if p.get("merged_from"):  # merged hot answers belong to no export page: never touch
            continue
        src = str(p.get("source", ""))
        entry = out.setdefault(src, {"idx": {}, "file": p.get("source_file")})
        entry["idx"][int(p.get("chunk_index", -1))] = (
            p.get("content_hash"),
            p.get("model"),
            p.get("n_chunks"),
        )
    return out


def _is_unchanged(page: Page, stored: dict[str, Any] | None, model: str) -> bool:
    if not stored:
        return False
    idx: dict[int, tuple[Any, Any, Any]] = stored["idx"]
    values = set(idx.values())
    if len(values) != 1:
        return False
    ((h, m, n),) = values
    return (
        h == page.content_hash and m == model and isinstance(n, int) and set(idx) == set(range(n))
    )


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


def _payload(page: Page, chunk: Chunk, n_chunks: int, model: str) -> dict[str, Any]:
    updated = page.updated_at
    if updated.tzinfo is None:  # readers promise tz-aware; never store a naive time
        updated = updated.replace(tzinfo=UTC)
    return {
        "source": page.page_id,
        "title": page.title,
        "section": chunk.section,
        "heading_path": list(chunk.heading_path),
        "updated_at": updated.isoformat(),
        "updated_at_ts": updated.timestamp(),
        "chunk_index": chunk.chunk_index,
        "n_chunks": n_chunks,
        "n_tokens": chunk.n_tokens,
        "content_hash": page.content_hash,
        "text": chunk.text,
        "model": model,
        "space": page.space,
        "source_file": PurePath(page.source_path.split("!/")[-1]).name,
    }


def _read_export(export_path: Path, settings: Settings) -> Iterator[Page | Quarantined]:
    from context_core.ingest.confluence import read_html_export

    return read_html_export(export_path, max_page_bytes=settings.max_page_bytes)


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
) -> RefreshPlan:
    """Read the export and the collection; decide what to write and delete. Writes nothing.

    The encoder is only needed (and only loaded, via ``encoder_factory``) when some page must
    be chunked: an unchanged re-run never touches the model. ``chunker`` replaces the
    heading-aware token chunker (tests use it to prove the quality gate catches a bad one).
    Raises DataValidationError when the chunk suite fails (naming the rows) and IngestError
    when the export is unreadable.
    """
    from context_core.gateway import Gateway as _Gateway

    export = Path(export_path).expanduser()
    if not export.exists():
        raise IngestError(
            f"export {export} does not exist; pass a Confluence HTML space export "
            "(a folder with index.html, or its .zip)"
        )
    collection = collection or settings.collection_main
    gateway = gateway or _Gateway.from_settings(settings)
    model = encoder.name if encoder is not None else _model_name(settings)
    seconds: dict[str, float] = {s: 0.0 for s in ("parse", "chunk", "validate")}

    with _Progress(progress) as bar:
        with _timed(seconds, "parse"):
            existing = _existing(store, collection)
            pages: dict[str, Page] = {}
            quarantined: list[dict[str, str]] = []
            task = bar.stage("parse", None)
            for item in _read_export(export, settings):
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
        n_seen = len(pages) + len(quarantined)

        todo = [p for p in pages.values() if not _is_unchanged(p, existing.get(p.page_id), model)]
        points: list[dict[str, Any]] = []
        delete_ids: list[str] = []
        rows: list[dict[str, Any]] = []
        if todo and encoder is None and chunker is None:
            with _timed(seconds, "load_model"):  # a per-process cost, kept out of "chunk"
                encoder = encoder_factory() if encoder_factory else _load_encoder(settings)
            model = encoder.name
        with _timed(seconds, "chunk"):
            task = bar.stage("chunk", len(todo))
            written: list[Page] = []
            for page in todo:
                bar.advance(task)
                clean = _clean_page(page, gateway)
                if chunker is not None:
                    chunks = chunker(clean)
                else:
                    assert encoder is not None
                    chunks = _chunks_for(clean, encoder, settings)
                if not chunks:
                    quarantined.append(
                        {"source_path": page.source_path, "reason": "no text left to chunk"}
                    )
                    del pages[page.page_id]
                    continue
                written.append(page)
                for ch in chunks:
                    pid = point_id(page.page_id, ch.chunk_index)
                    payload = _payload(clean, ch, len(chunks), model)
                    points.append({"id": pid, "payload": payload})
                    rows.append(
                        {
                            "row_id": f"{page.source_path}#{ch.chunk_index}",
                            "point_id": pid,
                            "source": payload["source"],
                            "section": payload["section"],
                            "text": payload["text"],
                            "n_tokens": ch.n_tokens,
                            "updated_at": payload["updated_at"],
                        }
                    )
                stored = existing.get(page.page_id)
                if stored:
                    delete_ids += [
                        point_id(page.page_id, i) for i in sorted(stored["idx"]) if i >= len(chunks)
                    ]
            bar.finish(task)
        with _timed(seconds, "validate"):
            if rows:  # nothing to write -> nothing to gate (and no GX start-up cost)
                from context_core.ingest.validation import validate_chunks

                validate_chunks(rows, max_tokens=settings.chunk_max_tokens)

        q_files = {PurePath(q["source_path"].split("!/")[-1]).name for q in quarantined}
        gone = [
            src
            for src, entry in existing.items()
            if src not in pages and entry.get("file") not in q_files
        ]
        for src in gone:
            delete_ids += [point_id(src, i) for i in sorted(existing[src]["idx"])]

    # Longest texts first, so each embedding batch holds texts of similar length (less padding).
    points.sort(key=lambda pt: -len(pt["payload"]["text"]))
    n_new = sum(1 for p in written if p.page_id not in existing)
    return RefreshPlan(
        export_path=str(export),
        collection=collection,
        model=model,
        points=points,
        delete_ids=delete_ids,
        quarantined=quarantined,
        pages_seen=n_seen,
        pages_new=n_new,
        pages_changed=len(written) - n_new,
        pages_unchanged=len(pages) - len(written),
        pages_deleted=len(gone),
        seconds=seconds,
    )


def _model_name(settings: Settings) -> str:
    """The name an encoder for these settings will report, without loading the model."""
    from context_core.embedding import MODEL_REGISTRY

    if settings.embed_model in MODEL_REGISTRY:
        return MODEL_REGISTRY[settings.embed_model].name
    return str(Path(settings.embed_model).expanduser().resolve())


def _load_encoder(settings: Settings) -> Encoder:
    from context_core.embedding import load_encoder

    return load_encoder(settings)


# --------------------------------------------------------------------------------------------
# Apply
# --------------------------------------------------------------------------------------------


def apply_refresh(
    plan: RefreshPlan,
    *,
    settings: Settings,
    store: VectorStore,
    encoder: Encoder | None = None,
    progress: bool = False,
) -> RefreshSummary:
    """Embed the plan's chunks in batches, upsert each batch, then delete what must go.

    Upserting batch by batch bounds memory and means a crash loses at most one batch of work;
    the plan's deterministic ids make the re-run converge (see the module docstring).
    """
    seconds = {s: plan.seconds.get(s, 0.0) for s in STAGES}
    if "load_model" in plan.seconds:
        seconds["load_model"] = plan.seconds["load_model"]
    written = deleted = 0
    with _Progress(progress) as bar:
        if plan.points:
            if encoder is None:
                with _timed(seconds, "load_model"):
                    encoder = _load_encoder(settings)
            if encoder.name != plan.model:
                from context_core.errors import ModelMismatchError

                raise ModelMismatchError(
                    f"the refresh plan was chunked for model {plan.model!r} but the encoder is "
                    f"{encoder.name!r}; re-run the plan step with CTX_EMBED_MODEL={encoder.name}"
                )
            with _timed(seconds, "upsert"):
                store.create_collection(plan.collection, dim=encoder.dim, model=encoder.name)
            size = settings.embed_batch_size
            t_embed = bar.stage("embed", len(plan.points))
            t_upsert = bar.stage("upsert", len(plan.points))
            for start in range(0, len(plan.points), size):
                batch = plan.points[start : start + size]
                with _timed(seconds, "embed"):
                    vectors = encoder.encode(
                        [pt["payload"]["text"] for pt in batch], batch_size=size
                    )
                bar.advance(t_embed, len(batch))
                with _timed(seconds, "upsert"):
                    store.upsert(
                        plan.collection,
                        [
                            PointRecord(id=pt["id"], vector=vec, payload=pt["payload"])
                            for pt, vec in zip(batch, vectors, strict=True)
                        ],
                    )
                written += len(batch)
                bar.advance(t_upsert, len(batch))
        if plan.delete_ids and store.info(plan.collection) is not None:
            with _timed(seconds, "upsert"):
                for start in range(0, len(plan.delete_ids), 1024):
                    store.delete(plan.collection, ids=plan.delete_ids[start : start + 1024])
                deleted = len(plan.delete_ids)
        if written or deleted:
            with _timed(seconds, "upsert"):
                store.optimize(plan.collection)  # Edge builds HNSW only when asked

    summary = RefreshSummary(
        export_path=plan.export_path,
        collection=plan.collection,
        model=plan.model,
        pages_seen=plan.pages_seen,
        pages_new=plan.pages_new,
        pages_changed=plan.pages_changed,
        pages_unchanged=plan.pages_unchanged,
        pages_deleted=plan.pages_deleted,
        pages_quarantined=len(plan.quarantined),
        chunks_written=written,
        chunks_deleted=deleted,
        seconds={k: round(v, 4) for k, v in seconds.items()},
        finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    write_reports(summary, plan.quarantined, settings.reports_dir)
    return summary


def write_reports(
    summary: RefreshSummary, quarantined: Sequence[dict[str, str]], reports_dir: Path
) -> None:
    """``ingest_summary.json`` and ``quarantine.jsonl`` (one line per bad page: path, reason)."""
    reports_dir.mkdir(parents=True, exist_ok=True)
    (reports_dir / "ingest_summary.json").write_text(
        json.dumps(summary.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    with (reports_dir / "quarantine.jsonl").open("w", encoding="utf-8") as f:
        for q in quarantined:
            f.write(json.dumps(q, ensure_ascii=False) + "\n")


def run_refresh(
    export_path: Path | str,
    *,
    settings: Settings,
    store: VectorStore | None = None,
    encoder: Encoder | None = None,
    gateway: Gateway | None = None,
    collection: str | None = None,
    progress: bool = True,
) -> RefreshSummary:
    """Refresh ``collection`` (default ``CTX_COLLECTION_MAIN``) from a Confluence export.

    Opens (and closes) the store from ``settings`` when none is given; loads the encoder only
    if some page has to be embedded.
    """
    from context_core.knowledge.store import open_store

    own_store = store is None
    store = store if store is not None else open_store(settings)
    try:
        holder: list[Encoder] = []

        def factory() -> Encoder:
            holder.append(_load_encoder(settings))
            return holder[0]

        plan = plan_refresh(
            export_path,
            settings=settings,
            store=store,
            encoder=encoder,
            gateway=gateway,
            collection=collection,
            progress=progress,
            encoder_factory=factory,
        )
        return apply_refresh(
            plan,
            settings=settings,
            store=store,
            encoder=encoder or (holder[0] if holder else None),
            progress=progress,
        )
    finally:
        if own_store:
            store.close()


# --------------------------------------------------------------------------------------------
# Airflow: the two halves as tasks, the plan staged on disk between them.
# --------------------------------------------------------------------------------------------


def _staging_path(settings: Settings, run_id: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)[:120]
    return settings.data_dir / "staging" / f"knowledge_refresh-{safe}.json"


def stage_plan(export_path: Path | str, *, settings: Settings, run_id: str) -> dict[str, Any]:
    """Plan and stage; returns a small XCom-safe dict (path + counts)."""
    from context_core.knowledge.store import open_store

    store = open_store(settings)
    try:
        plan = plan_refresh(export_path, settings=settings, store=store)
    finally:
        store.close()
    path = plan.save(_staging_path(settings, run_id))
    return {"plan_path": str(path), **plan.counts()}


def apply_staged(plan_path: Path | str, *, settings: Settings) -> RefreshSummary:
    """Apply a staged plan, then remove the staging file (a retry re-applies it unchanged)."""
    from context_core.knowledge.store import open_store

    plan = RefreshPlan.load(Path(plan_path))
    store = open_store(settings)
    try:
        summary = apply_refresh(plan, settings=settings, store=store)
    finally:
        store.close()
    Path(plan_path).unlink(missing_ok=True)
    return summary
