"""The knowledge refresh: parse -> chunk -> validate -> embed -> upsert, incremental and idempotent.

Why two halves: :func:`plan_refresh` reads the export and the collection and decides what must
change (nothing is written); :func:`apply_refresh` embeds and writes. The Airflow DAG runs the
halves as separate tasks with the plan staged on disk (texts, never vectors, and only the path
travels through XCom); the CLI runs both in one process via :func:`run_refresh`.

Incremental: each point carries its page's ``content_hash``, ``n_chunks`` and the model name. A
page is *unchanged* when every stored chunk carries the page's current hash and model and the
stored chunk indexes are exactly ``0..n_chunks-1``; such a page is neither chunked nor embedded.
Everything else is rewritten, and chunk indexes a page no longer has are deleted, as are all
chunks of pages that left a *complete space export* (but not of pages merely quarantined this
time: a page that fails to parse keeps its last good version). Deletes never reach beyond the
space the run read, and two guards stop a run before it writes (see
:mod:`context_core.ingest.refresh_plan`: no readable page; more than a set share of a space
deleted).

Every run has a run id. Its quarantined pages (and warnings such as a date that fell back to
the file time) are *appended* to ``<reports_dir>/quarantine.jsonl``, one line each with the run
id and time, so the reasons of earlier runs are kept; the summary names the run id and file.

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
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from context_core.config import Settings, get_settings
from context_core.fsutil import atomic_write_text
from context_core.ingest.add_sparse import add_sparse_vectors
from context_core.ingest.progress import StageProgress, timed
from context_core.ingest.refresh_plan import PLAN_SCHEMA as PLAN_SCHEMA  # re-export
from context_core.ingest.refresh_plan import (
    PlannedPoint,
    RefreshPlan,
    load_encoder_lazily,
    new_run_id,
    owner_space,
    plan_refresh,
    source_scope,
)
from context_core.knowledge.sparse import SparseEncoder

if TYPE_CHECKING:
    from context_core.gateway.sanitize import Gateway
    from context_core.knowledge.embedding import Encoder
    from context_core.knowledge.store import VectorStore

__all__ = [
    "QUARANTINE_FILE",
    "STAGES",
    "PlannedPoint",
    "RefreshPlan",
    "RefreshSummary",
    "RemovalSummary",
    "apply_refresh",
    "apply_staged",
    "job_settings",
    "plan_refresh",
    "read_quarantine_history",
    "remove_space",
    "run_refresh",
    "source_scope",
    "stage_plan",
]

log = logging.getLogger(__name__)

STAGES = ("parse", "chunk", "validate", "embed", "upsert")
#: Batches embedded per encoder call in a refresh (sorted by length within the call).
EMBED_WINDOW_BATCHES = 16
QUARANTINE_FILE = "quarantine.jsonl"  # under reports_dir; append-only history, one line a page


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
    run_id: str = ""
    scopes: dict[str, str] = dataclasses.field(default_factory=dict)
    export_kind: str = "space"
    complete: bool = True
    pages_in_scope: int = 0
    warnings: int = 0
    quarantine_file: str = ""

    @classmethod
    def from_plan(
        cls,
        plan: RefreshPlan,
        *,
        chunks_written: int,
        chunks_deleted: int,
        seconds: dict[str, float],
        quarantine_file: str,
    ) -> RefreshSummary:
        """The summary of an applied ``plan``: its identity and page counts, what was written."""
        return cls(
            export_path=plan.export_path,
            collection=plan.collection,
            model=plan.model,
            **plan.page_counts(),
            chunks_written=chunks_written,
            chunks_deleted=chunks_deleted,
            seconds={k: round(v, 4) for k, v in seconds.items()},
            finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
            run_id=plan.run_id,
            scopes=dict(plan.scopes),
            export_kind=plan.export_kind,
            complete=plan.complete,
            pages_in_scope=plan.pages_in_scope,
            warnings=len(plan.warnings),
            quarantine_file=quarantine_file,
        )

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total_seconds": round(self.total_seconds, 3)}


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
    with StageProgress(progress) as bar:
        if plan.points:
            if encoder is None:
                with timed(seconds, "load_model"):
                    encoder = load_encoder_lazily(settings, store, plan.collection)
            _check_model(plan, encoder)
            with timed(seconds, "upsert"):
                sparse = _prepare_collection(store, plan.collection, encoder)
            written = _embed_and_upsert(
                plan, store, encoder, sparse, settings.embed_batch_size, seconds, bar
            )
        if plan.delete_ids and store.info(plan.collection) is not None:
            with timed(seconds, "upsert"):
                for start in range(0, len(plan.delete_ids), 1024):
                    store.delete(plan.collection, ids=plan.delete_ids[start : start + 1024])
                deleted = len(plan.delete_ids)
        if written or deleted:
            with timed(seconds, "upsert"):
                store.optimize(plan.collection)  # Edge builds HNSW only when asked

    summary = RefreshSummary.from_plan(
        plan,
        chunks_written=written,
        chunks_deleted=deleted,
        seconds=seconds,
        quarantine_file=str(settings.reports_dir / QUARANTINE_FILE),
    )
    write_reports(summary, plan.quarantined, settings.reports_dir, warnings=plan.warnings)
    return summary


def _check_model(plan: RefreshPlan, encoder: Encoder) -> None:
    if encoder.name != plan.model:
        from context_core.errors import ModelMismatchError

        raise ModelMismatchError(
            f"the refresh plan was chunked for model {plan.model!r} but the encoder is "
            f"{encoder.name!r}; re-run the plan step with CTX_EMBED_MODEL={encoder.name}"
        )


def _prepare_collection(store: VectorStore, collection: str, encoder: Encoder) -> SparseEncoder:
    """Create the collection if missing; the sparse encoder its points are written with."""
    sparse = SparseEncoder()
    store.create_collection(collection, dim=encoder.dim, model=encoder.name, sparse=sparse.name)
    info = store.info(collection)
    if info is not None and info.sparse is not None:
        # an existing collection keeps the tokenizer its points were written with
        return SparseEncoder.from_name(info.sparse)
    if info is not None:
        # built before sparse vectors: add them to the stored points first (no re-embedding),
        # so every point of the collection has both
        add_sparse_vectors(store, collection, sparse)
    return sparse


def _embed_and_upsert(
    plan: RefreshPlan,
    store: VectorStore,
    encoder: Encoder,
    sparse: SparseEncoder,
    size: int,
    seconds: dict[str, float],
    bar: StageProgress,
) -> int:
    """Embed (dense and sparse) and upsert the plan's points; the count.

    Texts are embedded a window of :data:`EMBED_WINDOW_BATCHES` batches at a time, so the
    encoder can batch them by length (less padding: both backends sort a call's texts by
    length), while the window's BM25 vectors are computed on a helper thread (the dense
    encoder releases the GIL). Upserts stay ``size`` points each."""
    from concurrent.futures import ThreadPoolExecutor

    points: list[PlannedPoint] = plan.points
    t_embed = bar.stage("embed", len(points))
    t_upsert = bar.stage("upsert", len(points))
    window = size * EMBED_WINDOW_BATCHES
    with ThreadPoolExecutor(1, thread_name_prefix="sparse-encode") as pool:
        for start in range(0, len(points), window):
            chunk = points[start : start + window]
            texts = [pt.text for pt in chunk]
            with timed(seconds, "embed"):
                sparse_future = pool.submit(sparse.encode_documents, texts)
                vectors = encoder.encode(texts, batch_size=size)
                sparse_vectors = sparse_future.result()
            bar.advance(t_embed, len(chunk))
            for s in range(0, len(chunk), size):
                batch = chunk[s : s + size]
                with timed(seconds, "upsert"):
                    store.upsert(
                        plan.collection,
                        [
                            pt.record(vec, sv)
                            for pt, vec, sv in zip(
                                batch,
                                vectors[s : s + size],
                                sparse_vectors[s : s + size],
                                strict=True,
                            )
                        ],
                    )
                bar.advance(t_upsert, len(batch))
    return len(points)


def write_reports(
    summary: RefreshSummary,
    quarantined: Sequence[dict[str, str]],
    reports_dir: Path,
    *,
    warnings: Sequence[dict[str, str]] = (),
) -> None:
    """``ingest_summary.json`` (this run) and an appended run's worth of ``quarantine.jsonl``.

    Each history line: ``{"run_id", "at", "export", "kind": "quarantined"|"warning",
    "source_path", "reason"}``. Appending keeps earlier runs' reasons; one line is written
    with a single ``write`` so concurrent runs never interleave within a line.
    """
    reports_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        reports_dir / "ingest_summary.json",
        json.dumps(summary.to_dict(), indent=2, ensure_ascii=False) + "\n",
    )
    common = {"run_id": summary.run_id, "at": summary.finished_at, "export": summary.export_path}
    lines = [
        {**common, "kind": "quarantined", "source_path": q["source_path"], "reason": q["reason"]}
        for q in quarantined
    ] + [
        {**common, "kind": "warning", "source_path": w["source_path"], "reason": w["warning"]}
        for w in warnings
    ]
    if lines:
        with (reports_dir / QUARANTINE_FILE).open("a", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line, ensure_ascii=False) + "\n")


def read_quarantine_history(reports_dir: Path) -> list[dict[str, Any]]:
    """Every line of ``quarantine.jsonl`` (older files without run ids included), oldest first.

    A torn or foreign line is skipped, not fatal: the history is a report, not a contract.
    """
    path = reports_dir / QUARANTINE_FILE
    if not path.is_file():
        return []
    out: list[dict[str, Any]] = []
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "source_path" in rec:
            rec.setdefault("kind", "quarantined")
            out.append(rec)
    return out


@dataclass(frozen=True, slots=True)
class RemovalSummary:
    """What :func:`remove_space` found (and deleted unless ``dry_run``)."""

    collection: str
    space: str
    scope: str
    pages: int
    chunks: int
    dry_run: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def remove_space(
    space: str,
    *,
    settings: Settings,
    store: VectorStore | None = None,
    collection: str | None = None,
    source_id: str | None = None,
    dry_run: bool = False,
) -> RemovalSummary:
    """Delete every point of one space (its scope), and nothing else: the explicit removal.

    A refresh never removes a space as a side effect; this is the one way to. Merged hot answers
    and other spaces' points are untouched. Points written before scopes existed are matched by
    their ``space`` field.
    """
    from context_core.knowledge import open_store

    collection = collection or settings.collection_main
    scopes = {space: source_scope(space, source_id)}
    own_store = store is None
    store = store if store is not None else open_store(settings)
    try:
        ids: list[str] = []
        pages: set[str] = set()
        if store.info(collection) is not None:
            for rec in store.scroll(collection, with_vectors=False, batch=1024):
                if owner_space(rec.payload, scopes) is not None:
                    ids.append(rec.id)
                    pages.add(str(rec.payload.get("source", "")))
        if ids and not dry_run:
            for start in range(0, len(ids), 1024):
                store.delete(collection, ids=ids[start : start + 1024])
            store.optimize(collection)
    finally:
        if own_store:
            store.close()
    return RemovalSummary(collection, space, scopes[space], len(pages), len(ids), dry_run)


def run_refresh(
    export_path: Path | str,
    *,
    settings: Settings,
    store: VectorStore | None = None,
    encoder: Encoder | None = None,
    gateway: Gateway | None = None,
    collection: str | None = None,
    progress: bool = True,
    space: str | None = None,
    source_id: str | None = None,
    allow_deletes: bool = False,
    run_id: str | None = None,
) -> RefreshSummary:
    """Refresh ``collection`` (default ``CTX_COLLECTION_MAIN``) from a Confluence export.

    Opens (and closes) the store from ``settings`` when none is given; loads the encoder only
    if some page has to be embedded. ``space``, ``source_id`` and ``allow_deletes`` are those
    of :func:`plan_refresh`; its guards raise before anything is written.
    """
    from context_core.knowledge import open_store

    own_store = store is None
    store = store if store is not None else open_store(settings)
    try:
        holder: list[Encoder] = []

        def factory() -> Encoder:
            holder.append(load_encoder_lazily(settings, store, collection))
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
            space=space,
            source_id=source_id,
            allow_deletes=allow_deletes,
            run_id=run_id or new_run_id(),
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


def stage_plan(
    export_path: Path | str,
    *,
    settings: Settings,
    run_id: str,
    space: str | None = None,
    source_id: str | None = None,
    allow_deletes: bool = False,
) -> dict[str, Any]:
    """Plan and stage; returns a small XCom-safe dict (path + counts).

    The guards of :func:`plan_refresh` raise here, in the plan task, before anything is
    staged or written.
    """
    from context_core.knowledge import open_store

    store = open_store(settings)
    try:
        plan = plan_refresh(
            export_path,
            settings=settings,
            store=store,
            space=space,
            source_id=source_id,
            allow_deletes=allow_deletes,
            run_id=run_id,
        )
    finally:
        store.close()
    path = plan.save(_staging_path(settings, run_id))
    return {"plan_path": str(path), **plan.counts()}


def apply_staged(plan_path: Path | str, *, settings: Settings) -> RefreshSummary:
    """Apply a staged plan, then remove the staging file (a retry re-applies it unchanged)."""
    from context_core.knowledge import open_store

    plan = RefreshPlan.load(Path(plan_path))
    store = open_store(settings)
    try:
        summary = apply_refresh(plan, settings=settings, store=store)
    finally:
        store.close()
    Path(plan_path).unlink(missing_ok=True)
    return summary
