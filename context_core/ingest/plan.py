"""The plan half of the knowledge refresh: read the export and the collection, decide what changes.

:func:`plan_refresh` writes nothing; its :class:`RefreshPlan` is applied by
:func:`context_core.ingest.pipeline.apply_refresh`, in the same process (CLI) or after being
staged on disk (:meth:`RefreshPlan.save` / :meth:`RefreshPlan.load`, the Airflow DAG). Split out
of :mod:`context_core.ingest.pipeline`, which re-exports both names; the incremental and
idempotency rules are described there.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from context_core.config import Settings
from context_core.errors import IngestError
from context_core.ingest.model import Chunk, Page, Quarantined, Section
from context_core.ingest.progress import StageProgress, timed
from context_core.knowledge.store import point_id

if TYPE_CHECKING:
    from context_core.embedding import Encoder
    from context_core.gateway import Gateway
    from context_core.knowledge.store import VectorStore

__all__ = ["PLAN_SCHEMA", "RefreshPlan", "load_encoder_lazily", "plan_refresh"]

PLAN_SCHEMA = 1


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

    with StageProgress(progress) as bar:
        with timed(seconds, "parse"):
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
            with timed(seconds, "load_model"):  # a per-process cost, kept out of "chunk"
                encoder = encoder_factory() if encoder_factory else load_encoder_lazily(settings)
            model = encoder.name
        with timed(seconds, "chunk"):
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
        with timed(seconds, "validate"):
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


def load_encoder_lazily(settings: Settings) -> Encoder:
    """The settings' encoder; the embedding stack is imported only when a page needs it."""
    from context_core.embedding import load_encoder

    return load_encoder(settings)
